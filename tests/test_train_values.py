"""Values `bridge train` used to take without meaning: LoRA flags without --lora, an empty
--lora-targets, JSON true/false as token ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.errors import InputError, UsageError
from bridgecli.steps.train import TrainOptions, read_rows, run_train
from bridgecli.training.config import LoraSettings, SFTConfig, lora_from_flags

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

IGNORE = -100
ENV = {"BRIDGE_NO_PROGRESS": "1", "COLUMNS": "200"}


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env=ENV)


def one_line(result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.fixture
def no_model_work(monkeypatch):
    """Any model or tokenizer load fails the test: what is checked here comes first."""
    import transformers

    def boom(*a, **k):
        raise AssertionError("a model or tokenizer was loaded")

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer, transformers.AutoConfig):
        monkeypatch.setattr(cls, "from_pretrained", boom)


def rows_file(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def row(id_: str, n: int, supervised_from: int = 1) -> dict:
    ids = [5 + (i % 900) for i in range(n)]
    return {"id": id_, "input_ids": ids, "labels": [IGNORE] * supervised_from + ids[supervised_from:]}


# ---------------------------------------------------------------------------------------------- LoRA


@pytest.mark.parametrize("flags", [["--lora-r", "8"], ["--lora-r", "16"], ["--lora-alpha", "-1"],
                                   ["--lora-dropout", "nan"], ["--lora-dropout", "1e999"], ["--lora-targets", ""],
                                   ["--lora-alpha", "5", "--lora-targets", "q_proj"]])
def test_lora_flags_without_lora_are_refused(tmp_path, flags, no_model_work):
    result = invoke("train", tmp_path / "nosuch.jsonl", *flags)
    line = one_line(result)
    assert result.exit_code == 2
    named = [f for f in flags if f.startswith("--lora-")]
    assert line.startswith(f"bridge train: error: {', '.join(named)} appl") and "only with --lora" in line
    assert "add --lora" in line  # the hint


@pytest.mark.parametrize("flags, names", [(["--lora-dropout", "nan"], "--lora-dropout"),
                                          (["--lora-dropout", "1e999"], "--lora-dropout"),
                                          (["--lora-dropout", "-1"], "--lora-dropout"),
                                          (["--lora-r", "-1"], "--lora-r"),
                                          (["--lora-alpha", "0"], "--lora-alpha"),
                                          (["--lora-targets", ""], "--lora-targets"),
                                          (["--lora-targets", " , "], "--lora-targets")])
def test_lora_values_are_checked_with_lora(tmp_path, flags, names, no_model_work):
    result = invoke("train", tmp_path / "nosuch.jsonl", "--lora", *flags)
    assert result.exit_code == 2 and names in one_line(result)


def test_lora_settings_from_flags():
    assert lora_from_flags(False) is None
    assert lora_from_flags(True) == LoraSettings()
    got = lora_from_flags(True, "q_proj, v_proj", r=4, dropout=0.0)
    assert got == LoraSettings(r=4, alpha=32, dropout=0.0, targets=["q_proj", "v_proj"])
    with pytest.raises(UsageError, match="--lora-targets must name at least one module, got ''"):
        lora_from_flags(True, "")


def test_python_callers_get_the_lora_checks(tmp_path):
    data = rows_file(tmp_path / "r.jsonl", [row("a", 8)])
    for bad, flag in (({"targets": []}, "--lora-targets"), ({"targets": [""]}, "--lora-targets"),
                      ({"dropout": float("nan")}, "--lora-dropout"), ({"r": True}, "--lora-r")):
        with pytest.raises(UsageError, match=flag):
            run_train(TrainOptions(data=str(data), out=tmp_path / "o", sft=SFTConfig(lora=LoraSettings(**bad))))


# ------------------------------------------------------------------------------------------ token ids


@pytest.mark.parametrize("field, value, shown", [("input_ids", [5, True, 7], "entry 1 is true"),
                                                 ("labels", [IGNORE, False, 7], "entry 1 is false"),
                                                 ("input_ids", [5, 6.0, 7], "entry 1 is 6.0"),
                                                 ("labels", [IGNORE, "6", 7], "entry 1 is '6'")])
def test_json_booleans_are_no_token_ids(tmp_path, field, value, shown, no_model_work):
    good = {"id": "a", "input_ids": [5, 6, 7], "labels": [IGNORE, 6, 7]}
    path = rows_file(tmp_path / "rows.jsonl", [good, {**good, "id": "b", field: value}])
    with pytest.raises(InputError) as info:
        read_rows(path, None)
    assert str(info.value) == f"{path}, line 2, field '{field}': expected a list of integers, {shown}"
    result = invoke("train", path, "-o", tmp_path / "run")
    assert result.exit_code == 4 and one_line(result).endswith(str(info.value))

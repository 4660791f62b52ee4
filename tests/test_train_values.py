"""Values `bridge train` used to take without meaning: LoRA flags without --lora, an empty
--lora-targets, JSON true/false as token ids, and rows longer than the model takes (refused before any
model work, or clipped by --clip-long-rows). The model's limit is read from its files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.errors import InputError, UsageError
from bridgecli.steps.train import TrainOptions, read_rows, run_train
from bridgecli.training import limits
from bridgecli.training.config import LoraSettings, SFTConfig, lora_from_flags
from bridgecli.training.limits import RowLimit

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

IGNORE = -100
ENV = {"BRIDGE_NO_PROGRESS": "1", "COLUMNS": "200"}


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env=ENV)


def one_line(result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


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
def test_lora_flags_without_lora_are_refused(tmp_path, flags, no_model_loads):
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
def test_lora_values_are_checked_with_lora(tmp_path, flags, names, no_model_loads):
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
def test_json_booleans_are_no_token_ids(tmp_path, field, value, shown, no_model_loads):
    good = {"id": "a", "input_ids": [5, 6, 7], "labels": [IGNORE, 6, 7]}
    path = rows_file(tmp_path / "rows.jsonl", [good, {**good, "id": "b", field: value}])
    with pytest.raises(InputError) as info:
        read_rows(path, None)
    assert str(info.value) == f"{path}, line 2, field '{field}': expected a list of integers, {shown}"
    result = invoke("train", path, "-o", tmp_path / "run")
    assert result.exit_code == 4 and one_line(result).endswith(str(info.value))


# ------------------------------------------------------------------------------------- the model's limit


def test_limits_from_configs():
    assert limits.limit_of_config({"max_position_embeddings": 8192}) == 8192
    assert limits.limit_of_config({"n_positions": 1024}) == 1024
    assert limits.limit_of_config({"text_config": {"max_position_embeddings": 4096}}) == 4096
    assert limits.limit_of_config({"max_position_embeddings": True}) is None
    assert limits.limit_of_config({"max_position_embeddings": -1}) is None
    assert limits.limit_of_tokenizer_config({"model_max_length": 2048}) == 2048
    assert limits.limit_of_tokenizer_config({"model_max_length": int(1e30)}) is None  # transformers' "unset"
    assert limits.limit_of_tokenizer_config({"model_max_length": 1e30}) is None
    assert limits.limit_of_tokenizer_config({"model_max_length": float("nan")}) is None
    assert limits.limit_of_tokenizer_config({}) is None


def test_limit_of_a_folder_prefers_the_config(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
    assert limits.limit_of_folder(tmp_path) == (512, "the tokenizer's model_max_length")
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    assert limits.limit_of_folder(tmp_path) == (2048, "max_position_embeddings")
    assert limits.model_limit_of(str(tmp_path)) == (2048, "max_position_embeddings")
    assert limits.model_limit_of(str(tmp_path / "gone")) is None  # a moved folder: unknown, no error


def _gguf(path: Path, context: int | None, arch: str = "llama") -> Path:
    """A GGUF file's header and metadata: the architecture, a string array to skip, the context length."""

    def string(s: str) -> bytes:
        return struct.pack("<Q", len(s.encode())) + s.encode()

    pairs = [string("general.architecture") + struct.pack("<I", 8) + string(arch),
             string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3) + b"".join(map(string, ["a", "bc", "d"])),
             string("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 3) + struct.pack("<3f", 0, 1, 2)]
    if context is not None:
        pairs.append(string(f"{arch}.context_length") + struct.pack("<II", 4, context))
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(pairs)) + b"".join(pairs))
    return path


def test_limit_of_a_gguf_file(tmp_path):
    from bridgecli.modeling.loading import default_gguf

    assert limits.limit_of_gguf(_gguf(tmp_path / "a.gguf", 4096)) == 4096
    assert limits.limit_of_gguf(_gguf(tmp_path / "b.gguf", 2048, arch="qwen2")) == 2048
    assert limits.limit_of_gguf(_gguf(tmp_path / "c.gguf", None)) is None
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(_gguf(tmp_path / "d.gguf", 4096).read_bytes()[:40])
    assert limits.limit_of_gguf(cut) is None and limits.limit_of_gguf(tmp_path / "none.gguf") is None
    assert limits.limit_of_gguf(default_gguf()) == 8192  # SmolLM2-135M-Instruct's


def test_limit_of_an_hf_id_comes_from_the_local_cache_only(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert limits.model_limit_of("someorg/somemodel") is None
    snap = tmp_path / "models--someorg--somemodel" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"max_position_embeddings": 3000}))
    (tmp_path / "models--someorg--somemodel" / "refs").mkdir()
    (tmp_path / "models--someorg--somemodel" / "refs" / "main").write_text("abc123")
    assert limits.model_limit_of("someorg/somemodel") == (3000, "max_position_embeddings")


# ---------------------------------------------------------------------------------------------- long rows


def test_row_limit_refuses_or_clips():
    lim = RowLimit(4, "--max-length 4")
    assert lim.fit([1, 2, 3], [IGNORE, 2, 3], file="f", where="line 1", row_id="a") == ([1, 2, 3], [IGNORE, 2, 3])
    with pytest.raises(InputError) as info:
        lim.fit([1, 2, 3, 4, 5], [IGNORE] * 5, file="f", where="line 2", row_id="b")
    assert str(info.value) == ("f, line 2 (id b), field 'input_ids': the row has 5 tokens, more than --max-length 4 "
                               "(pass --clip-long-rows to keep its first 4 tokens, or leave the row out)")
    clip = RowLimit(4, "--max-length 4", clip=True)
    assert clip.fit([1, 2, 3, 4, 5, 6], [IGNORE, 2, IGNORE, IGNORE, 5, 6], file="f", where="line 1",
                    row_id="a") == ([1, 2, 3, 4], [IGNORE, 2, IGNORE, IGNORE])
    # supervised only past the limit (position 0 never counts: it predicts nothing): dropped, counted
    assert clip.fit([1, 2, 3, 4, 5], [1, IGNORE, IGNORE, IGNORE, 5], file="f", where="line 2", row_id="b") is None
    assert clip.clipped == 2 and clip.longest == 6 and clip.dropped == ["b"]
    assert clip.summary() == ("clipped 2 rows with more than --max-length 4 to their first 4 tokens (the longest had "
                              "6; labels past that are not trained); dropped 1 of them left with no supervised "
                              "label (b)")
    assert clip.fresh().clipped == 0 and RowLimit(4, "x").summary() is None


def test_max_length_above_the_model_limit_is_refused():
    with pytest.raises(UsageError, match="--max-length 9000 is beyond the model's limit of 8192 tokens"):
        limits.row_limit(9000, False, (8192, "max_position_embeddings"))
    assert limits.row_limit(None, False, None) is None
    assert limits.row_limit(100, True, None) == RowLimit(100, "--max-length 100", True)
    assert limits.row_limit(None, False, (8192, "m")).what == "the model's limit of 8,192 tokens (m)"


def test_a_row_too_long_stops_train_before_any_model_work(tmp_path, tiny_model_dir, no_model_loads):
    """tiny_model_dir's limit is 1024 (tests/tiny.py); its files tell it without loading it."""
    path = rows_file(tmp_path / "rows.jsonl", [row("short", 20), row("huge", 100_000), row("other", 2000)])
    result = invoke("train", path, "-o", tmp_path / "run", "--model", tiny_model_dir)
    assert result.exit_code == 4
    assert one_line(result) == (
        f"bridge train: error: {path}, line 2 (id huge), field 'input_ids': the row has 100,000 tokens, more than "
        "the model's limit of 1,024 tokens (max_position_embeddings) (pass --clip-long-rows to keep its first "
        "1,024 tokens, or leave the row out)")
    result = invoke("train", path, "-o", tmp_path / "run", "--model", tiny_model_dir, "--max-length", 10)
    assert result.exit_code == 4 and "line 1 (id short)" in one_line(result) and "more than --max-length 10" in \
        one_line(result)
    result = invoke("train", path, "-o", tmp_path / "run", "--model", tiny_model_dir, "--max-length", 5000)
    assert result.exit_code == 2 and "--max-length 5000 is beyond the model's limit of 1024" in one_line(result)
    assert not (tmp_path / "run").exists()


@pytest.mark.integration  # runs train (seconds)
def test_clip_long_rows_trains_on_the_first_tokens(tmp_path, tiny_model_dir):
    path = rows_file(tmp_path / "rows.jsonl", [row("short", 20), row("long", 1500),
                                               row("tail", 1100, supervised_from=1050)])
    result = invoke("train", path, "-o", tmp_path / "run", "--model", tiny_model_dir, "--clip-long-rows",
                    "--max-steps", 1, "--batch-size", 2, "--grad-accum", 1, "--lr", "1e-3")
    assert result.exit_code == 0, result.output
    assert ("clipped 2 rows with more than the model's limit of 1,024 tokens (max_position_embeddings) to their "
            "first 1,024 tokens (the longest had 1,500; labels past that are not trained); dropped 1 of them left "
            "with no supervised label (tail)") in result.stderr
    summary = json.loads((tmp_path / "run" / "bridge_train.json").read_text())
    assert summary["rows"] == 2 and summary["executed_tokens"] == 20 + 1024
    assert summary["supervised_tokens"] == 19 + 1023

    only_tail = rows_file(tmp_path / "tail.jsonl", [row("tail", 1100, supervised_from=1050)])
    result = invoke("train", only_tail, "-o", tmp_path / "run2", "--model", tiny_model_dir, "--clip-long-rows")
    assert result.exit_code == 1 and "no row keeps a supervised token after clipping to the model's limit" in \
        one_line(result)

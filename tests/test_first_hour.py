"""A new user's first hour (issue 14): missing inputs and models fail at once with one line,
empty results are errors, progress that moves, output that keeps its meaning without colour."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.errors import ModelError

from tiny import RECORDS


def invoke(*args, env=None):
    return CliRunner().invoke(app, [str(a) for a in args], env={"BRIDGE_NO_PROGRESS": "1", **(env or {})})


def one_error_line(result) -> str:
    """The run's single error line (and no traceback)."""
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model or tokenizer load fails the test: errors must come before."""
    import transformers

    def boom(*a, **k):
        raise AssertionError("a model or tokenizer was loaded")

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer, transformers.AutoConfig):
        monkeypatch.setattr(cls, "from_pretrained", boom)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


# --- 1. errors that explain -----------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["score", "{missing}", "-o", "{tmp}/x.bridge"],
    ["train", "{missing}", "-o", "{tmp}/t"],
    ["warmup", "{missing}", "--val", "{data}", "-o", "{tmp}/w"],
    ["warmup", "{data}", "--val", "{missing}", "-o", "{tmp}/w"],
    ["eval", "{tmp}", "--task", "gsm8k", "--data", "{missing}", "-o", "{tmp}/e.json"],
    ["select", "{missing}", "-o", "{tmp}/x.bridge"],
    ["close", "{missing}", "-o", "{tmp}/x.bridge"],
    ["compact", "{missing}", "-o", "{tmp}/x.jsonl"],
    ["analyze", "fidelity", "{missing}", "--from", "{tmp}"],
])
def test_missing_input_is_one_line_before_any_model(args, tmp_path, data, no_model_loads):
    missing = tmp_path / "nosuch.jsonl"
    result = invoke(*[a.format(missing=missing, tmp=tmp_path, data=data) for a in args])
    assert result.exit_code == 4, result.output
    line = one_error_line(result)
    assert f"{missing}: no such file or folder" in line
    assert not list(tmp_path.glob("e.json*")) and not (tmp_path / "x.bridge").exists()


@pytest.mark.parametrize("cmd", [["train", "{rows}", "-o", "{tmp}/t"],
                                 ["warmup", "{data}", "--val", "{data}", "-o", "{tmp}/w"],
                                 ["eval", "/nonexistent/model", "--data", "{data}", "-o", "{tmp}/e.json"]])
def test_missing_model_folder_says_so(cmd, tmp_path, data, no_model_loads):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}) + "\n")
    args = [a.format(data=data, tmp=tmp_path, rows=rows) for a in cmd]
    if cmd[0] != "eval":
        args += ["--model", "/nonexistent/model"]
    result = invoke(*args)
    assert result.exit_code == 5
    line = one_error_line(result)
    assert "/nonexistent/model: no such model folder or file" in line and "Repo id" not in line


def test_relative_path_under_an_existing_folder_is_a_path(tmp_path, monkeypatch):
    from bridgecli.modeling.loading import resolve

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(ModelError, match="runs/final: no such model folder"):
        resolve("runs/final")
    assert resolve("org/name").path == "org/name"  # an HF id stays one


def test_hf_id_without_network_fails_at_once(monkeypatch):
    from bridgecli.modeling import loading

    ref = loading.resolve("nosuch-org/nosuch-model")
    monkeypatch.setattr(loading, "_reachable", lambda host, port, timeout=3.0: False)
    with pytest.raises(ModelError, match="cannot be reached") as err:
        loading.hub_kwargs(ref)
    assert "nosuch-org/nosuch-model" in str(err.value) and "local model folder" in str(err.value)

    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError, match="HF_HUB_OFFLINE"):
        loading.load_tokenizer(ref)
    # cached: read from the cache alone, no network round trips
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", lambda repo, name: "/cache/config.json")
    assert loading.hub_kwargs(ref) == {"local_files_only": True}


def test_unreachable_probe_returns_quickly():
    from bridgecli.modeling.loading import _reachable

    assert _reachable("nosuch.invalid", 443, timeout=1.0) is False


def test_failed_eval_journal_removed_or_kept_with_a_note(tmp_path, capsys):
    from bridgecli.cli.eval import _keep_or_remove
    from bridgecli.evaluation.journal import Journal

    empty = Journal.open(tmp_path / "a.partial.jsonl", {"task": "gsm8k"}, resume=False)
    _keep_or_remove(empty, "gsm8k")
    assert not (tmp_path / "a.partial.jsonl").exists()

    book = Journal.open(tmp_path / "b.partial.jsonl", {"task": "gsm8k"}, resume=False)
    book.add([("k1", "text one"), ("k2", "text two")])
    _keep_or_remove(book, "gsm8k")
    assert (tmp_path / "b.partial.jsonl").exists()
    err = capsys.readouterr().err
    assert "kept 2 computed results" in err and "--resume" in err


def test_eval_with_bad_data_leaves_no_partial_file(tmp_path, tiny_model_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n')  # no answer field
    result = invoke("eval", tiny_model_dir, "--task", "gsm8k", "--data", bad, "-o", tmp_path / "e.json")
    assert result.exit_code == 4
    one_error_line(result)
    assert not list(tmp_path.glob("e.json*"))


# --- 2. empty results are errors ------------------------------------------------------------------

def _stream(tmp_path, tokenizer, rho=0.5, edit=None):
    from test_show import synthetic, write_stream

    exs = synthetic(tokenizer, rho=rho)
    if edit is not None:
        exs = edit(exs)
    return write_stream(tmp_path / "closed.bridge", exs, "closure")


def test_score_and_warmup_on_an_empty_file(tmp_path, no_model_loads):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    result = invoke("score", empty, "-o", tmp_path / "x.bridge")
    assert result.exit_code == 4 and "empty.jsonl: holds no records (pass --allow-empty" in one_error_line(result)
    result = invoke("warmup", empty, "--val", empty, "-o", tmp_path / "w")
    assert result.exit_code == 4 and "holds no records" in one_error_line(result)
    assert not (tmp_path / "x.bridge").exists() and not (tmp_path / "w").exists()


def test_rho_r_zero_keeps_no_row_and_compact_fails(tmp_path, tokenizer):
    stream = _stream(tmp_path, tokenizer, rho=0.0)
    out = tmp_path / "train.jsonl"
    result = invoke("compact", stream, "-o", out)
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "no training row to write" in line and "all 3 rows" in line and "b_r = 0" in line
    assert not out.exists() and not list(tmp_path.glob(".train.jsonl*"))
    result = invoke("compact", stream, "-o", out, "--allow-empty")
    assert result.exit_code == 0 and out.read_text() == ""


def test_compact_dropping_most_rows_says_why(tmp_path, tokenizer):
    import msgspec

    def edit(exs):
        a, b, c = exs
        resp = a.tokens.response_positions()
        one_unit = msgspec.structs.replace(a.closure, units=[int(resp[0]), int(resp[-1]) + 1], chosen=[], supervise=[])
        nothing = msgspec.structs.replace(b.closure, chosen=[], supervise=[])
        return [msgspec.structs.replace(a, closure=one_unit), msgspec.structs.replace(b, closure=nothing), c]

    stream = _stream(tmp_path, tokenizer, edit=edit)
    result = invoke("compact", stream, "-o", tmp_path / "train.jsonl")
    assert result.exit_code == 0
    warning = [line for line in result.stderr.splitlines() if line.startswith("warning: dropped 2 of 3 rows")]
    assert len(warning) == 1, result.stderr
    assert "longer than the budget b_r" in warning[0] and "q(u) <= 0" in warning[0]
    assert len((tmp_path / "train.jsonl").read_text().splitlines()) == 1


def test_train_on_nothing_is_an_error_and_writes_no_model(tmp_path, no_model_loads):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = invoke("train", empty, "-o", tmp_path / "run")
    assert result.exit_code == 1 and "nothing to train on: it holds no rows" in one_error_line(result)
    unsupervised = tmp_path / "unsup.jsonl"
    unsupervised.write_text(json.dumps({"input_ids": [1, 2, 3], "labels": [-100, -100, -100]}) + "\n")
    result = invoke("train", unsupervised, "-o", tmp_path / "run")
    assert result.exit_code == 1 and "none of its 1 rows has a supervised token" in one_error_line(result)
    result = invoke("train", empty, "-o", tmp_path / "run", "--allow-empty")
    assert result.exit_code == 0 and "no model written" in result.stderr
    assert not (tmp_path / "run").exists()


def test_train_never_writes_a_model_after_zero_steps(tmp_path, tiny_model_dir, monkeypatch):
    from bridgecli.steps import train as train_step

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}) + "\n")
    real_fit = train_step.fit

    def no_steps(*args, **kwargs):
        result = real_fit(*args, **kwargs)
        result.history.clear()
        return result

    monkeypatch.setattr(train_step, "fit", no_steps)
    result = invoke("train", rows, "-o", tmp_path / "run", "--model", tiny_model_dir, "--max-steps", "1",
                    "--device", "cpu")
    assert result.exit_code == 1 and "0 optimizer steps: no model written" in one_error_line(result)
    assert not (tmp_path / "run" / "config.json").exists() and not (tmp_path / "run" / "bridge_train.json").exists()

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


@pytest.mark.parametrize("cmd", [["train", "{data}", "-o", "{tmp}/t"],
                                 ["warmup", "{data}", "--val", "{data}", "-o", "{tmp}/w"],
                                 ["eval", "/nonexistent/model", "--data", "{data}", "-o", "{tmp}/e.json"]])
def test_missing_model_folder_says_so(cmd, tmp_path, data, no_model_loads):
    args = [a.format(data=data, tmp=tmp_path) for a in cmd]
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

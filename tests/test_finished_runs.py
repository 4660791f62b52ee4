"""A finished run is not lost to a mistyped command: `train -o RUN` and `warmup -o RUN` refuse a folder
holding a finished run (before anything loads) unless --overwrite, and --overwrite replaces it only
once the new run is written, so a new run that fails leaves the old one as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
ROWS = "".join(
    json.dumps({"input_ids": list(range(10, 18)), "labels": [-100] * 4 + list(range(14, 18))}) + "\n" for _ in range(2)
)


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"BRIDGE_NO_PROGRESS": "1"})


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def finished_train_run(out: Path) -> None:
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"the finished model")
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    (out / "bridge_train.json").write_text(json.dumps({"base_model": "m", "steps": 1}))


def finished_warmup_run(out: Path) -> None:
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "model.safetensors").write_bytes(b"the finished model")
    (out / "warmup.json").write_text(json.dumps({"base_model": "m"}))


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "rows.jsonl").write_text(ROWS)
    (tmp_path / "data.jsonl").write_text(json.dumps({"id": "a", "prompt": "p", "response": "r"}) + "\n")
    return tmp_path


@pytest.mark.parametrize("step", ["train", "warmup"])
def test_a_finished_run_is_refused_without_overwrite_before_anything_loads(inputs, step):
    out = inputs / "run"
    (finished_train_run if step == "train" else finished_warmup_run)(out)
    before = snapshot(out)
    args = (["train", inputs / "rows.jsonl"] if step == "train"
            else ["warmup", inputs / "data.jsonl", "--val", inputs / "data.jsonl"])
    result = invoke(*args, "-o", out, "--model", inputs / "no-such-model", "--device", "cpu")
    assert result.exit_code == UsageError.exit_code
    line = error_line(result)
    assert str(out) in line and "finished" in line and "--overwrite" in line and "-o" in line, line
    assert snapshot(out) == before
    assert sorted(p.name for p in inputs.iterdir()) == ["data.jsonl", "rows.jsonl", "run"]  # no lock file left


def test_warmup_never_replaces_a_folder_that_holds_no_warmup_run(inputs):
    """Not even with --overwrite (train's rule too): a folder of the user's files, or a file."""
    mine = inputs / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    (inputs / "file").write_text("mine")
    for out, message in ((mine, "holds no warmup run"), (inputs / "file", "is not a folder")):
        result = invoke("warmup", inputs / "data.jsonl", "--val", inputs / "data.jsonl", "-o", out, "--overwrite",
                        "--model", inputs / "no-such-model", "--device", "cpu")
        assert result.exit_code == UsageError.exit_code and message in error_line(result), result.output
    assert (mine / "notes.txt").read_text() == (inputs / "file").read_text() == "mine"


@pytest.mark.integration  # trains a tiny model (seconds)
def test_train_overwrite_replaces_the_finished_run_only_once_the_new_one_is_written(inputs, tiny_model_dir,
                                                                                     monkeypatch):
    from bridgecli.steps import train as train_step

    out = inputs / "run"
    finished_train_run(out)
    before = snapshot(out)
    real_fit = train_step.fit
    seen = []

    def failing_fit(*args, **kwargs):
        seen.append(snapshot(out))  # while the new run trains, the old one is still there, whole
        real_fit(*args, **kwargs)
        raise RuntimeError("the new run failed")

    argv = ["train", inputs / "rows.jsonl", "-o", out, "--model", tiny_model_dir, "--max-steps", "2", "--grad-accum", "1",
            "--save-every", "1", "--batch-size", "2", "--device", "cpu", "--overwrite"]
    monkeypatch.setattr(train_step, "fit", failing_fit)
    assert invoke(*argv).exit_code != 0
    assert seen == [before] and snapshot(out) == before  # the old run is as it was
    assert sorted(p.name for p in inputs.iterdir()) == ["data.jsonl", "rows.jsonl", "run"]  # no lock file left

    monkeypatch.setattr(train_step, "fit", real_fit)
    result = invoke(*argv)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "bridge_train.json").read_text())["steps"] == 2
    assert (out / "model.safetensors").read_bytes() != before["model.safetensors"]
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert (out / "checkpoints").is_dir()  # the new run's own checkpoints came with it
    assert sorted(p.name for p in inputs.iterdir()) == ["data.jsonl", "rows.jsonl", "run"]  # no lock file left


@pytest.mark.integration  # trains a tiny model (seconds)
def test_train_resume_of_a_finished_run_trains_nothing_and_refuses_other_settings(inputs, tiny_model_dir,
                                                                                  monkeypatch):
    """A finished run kept no checkpoint (the default): rerunning its command with --resume says it is done, in
    one line naming the folder, exit 0, and leaves the folder as it was; the same with other settings or other
    data is refused as a resume from a checkpoint made with them is."""
    from bridgecli.steps import train as train_step

    out = inputs / "run"
    argv = ["train", inputs / "rows.jsonl", "-o", out, "--model", tiny_model_dir, "--max-steps", "2", "--grad-accum",
            "1", "--batch-size", "1", "--device", "cpu"]
    assert invoke(*argv).exit_code == 0
    assert not (out / "checkpoints").exists()
    before = snapshot(out)
    fits = []
    monkeypatch.setattr(train_step, "fit", lambda *a, **k: fits.append(1))  # nothing may train

    result = invoke(*argv, "--resume")
    assert result.exit_code == 0, result.output
    line = error_line(result)
    assert str(out) in line and "already finished" in line and "2 steps" in line, line
    assert snapshot(out) == before and not fits
    # a model whose files do not tell its row limit: the rows are known once it is loaded, and checked then
    monkeypatch.setattr(train_step, "model_limit", lambda ref: None)
    result = invoke(*argv, "--resume")
    assert result.exit_code == 0 and "already finished" in error_line(result), result.output
    assert snapshot(out) == before and not fits
    monkeypatch.undo()
    monkeypatch.setattr(train_step, "fit", lambda *a, **k: fits.append(1))

    (inputs / "other.jsonl").write_text(ROWS.replace("[10, 11,", "[10, 12,"))
    for extra, message in ((["--lr", "1e-3"], "lr=2e-05 (now 0.001)"), (["--seed", "7"], "seed=42 (now 7)")):
        result = invoke(*argv, "--resume", *extra)
        assert result.exit_code == UsageError.exit_code and message in error_line(result), result.output
    other = [a if a != inputs / "rows.jsonl" else inputs / "other.jsonl" for a in argv]
    result = invoke(*other, "--resume")
    assert result.exit_code == UsageError.exit_code and "other data" in error_line(result), result.output
    assert snapshot(out) == before and not fits


def unfinished_train_run(out: Path) -> None:
    """What a run killed while it trained leaves: its metrics so far and a checkpoint, no model, no summary."""
    (out / "checkpoints" / "step-000001").mkdir(parents=True)
    (out / "checkpoints" / "step-000001" / "trainer_state.json").write_text("{}")
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')


@pytest.mark.parametrize("then", [[], ["--resume"], ["--overwrite"]])
def test_what_a_killed_overwrite_left_beside_the_run_goes_with_the_next_run_into_it(inputs, then):
    """A SIGKILL (or a crash the process does not survive) while `train --overwrite` trains leaves its hidden
    .RUN.overwrite beside the finished run: the next run into RUN, whatever its flags, removes it (and says so);
    the finished run is as it was."""
    out = inputs / "run"
    finished_train_run(out)
    before = snapshot(out)
    unfinished_train_run(inputs / ".run.overwrite")
    result = invoke("train", inputs / "rows.jsonl", "-o", out, "--model", inputs / "no-such-model", "--device", "cpu",
                    *then)
    assert result.exit_code != 0  # no such model (or, without flags, the finished run is refused)
    assert f"removed {inputs / '.run.overwrite'}" in result.stderr
    assert snapshot(out) == before
    assert sorted(p.name for p in inputs.iterdir()) == ["data.jsonl", "rows.jsonl", "run"]  # no lock file left


@pytest.mark.parametrize("new_finished", [False, True])
def test_an_overwrite_killed_while_replacing_the_run_never_loses_a_finished_one(inputs, new_finished):
    """Killed between its two renames (the old run moved aside to .RUN.old, the new one not yet in place), the
    next run into RUN puts the new run in place when it is complete, else the old one back."""
    out = inputs / "run"
    finished_train_run(inputs / ".run.old")
    old = snapshot(inputs / ".run.old")
    (unfinished_train_run if not new_finished else finished_train_run)(inputs / ".run.overwrite")
    if new_finished:
        (inputs / ".run.overwrite" / "model.safetensors").write_bytes(b"the new model")
    new = snapshot(inputs / ".run.overwrite")
    result = invoke("train", inputs / "rows.jsonl", "-o", out, "--model", inputs / "no-such-model", "--device", "cpu")
    lines = result.stderr.splitlines()  # what was put right, then: RUN holds a finished run, refused without --overwrite
    assert result.exit_code == UsageError.exit_code and "holds a finished training run" in lines[-1], result.stderr
    assert ("finished and now in place" if new_finished else "put back as it was") in lines[0], result.stderr
    assert snapshot(out) == (new if new_finished else old)
    assert sorted(p.name for p in inputs.iterdir()) == ["data.jsonl", "rows.jsonl", "run"]  # no lock file left


@pytest.mark.integration  # trains a tiny model (seconds)
def test_an_overwrite_interrupted_in_its_training_loop_leaves_the_finished_run_whole(inputs, tiny_model_dir,
                                                                                      monkeypatch):
    """Interrupted at its second step (Ctrl-C: KeyboardInterrupt in the loop), `train --overwrite` removes its
    unfinished run and leaves the old one as it was; killed there (SIGKILL: no cleanup runs, so what it had
    written stays), the next run into RUN removes what it left."""
    import shutil

    from bridgecli.steps import train as train_step

    out, left = inputs / "run", inputs / ".run.overwrite"
    argv = ["train", inputs / "rows.jsonl", "-o", out, "--model", tiny_model_dir, "--max-steps", "2", "--grad-accum",
            "1", "--batch-size", "1", "--device", "cpu"]
    assert invoke(*argv).exit_code == 0
    before = snapshot(out)
    real_fit = train_step.fit
    at_kill = inputs / "at-kill"

    def interrupted_fit(*args, **kwargs):
        def on_step(rec):
            if rec["step"] == 2:
                assert snapshot(out) == before and (left / "checkpoints" / "step-000001").is_dir()
                shutil.copytree(left, at_kill)  # what a SIGKILL here would leave
                raise KeyboardInterrupt

        return real_fit(*args, **kwargs, on_step=on_step)

    monkeypatch.setattr(train_step, "fit", interrupted_fit)
    assert invoke(*argv, "--overwrite", "--save-every", "1").exit_code != 0
    assert snapshot(out) == before and not left.exists()  # the interrupted run cleaned up after itself

    at_kill.rename(left)  # the SIGKILLed run could not
    monkeypatch.setattr(train_step, "fit", real_fit)
    result = invoke(*argv, "--resume")
    assert result.exit_code == 0, result.output
    assert [f"removed {left}" in line for line in result.stderr.splitlines()] == [True, False]
    assert "already finished" in result.stderr and snapshot(out) == before
    assert sorted(p.name for p in inputs.iterdir()) == ["data.jsonl", "rows.jsonl", "run"]  # no lock file left

"""Output folders of train and warmup are locked; temporary files of killed runs are swept by the
next run into the same place, and only those."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bridgecli import io as bio
from bridgecli.errors import UsageError
from bridgecli.steps.train import TrainOptions, run_train
from bridgecli.steps.warmup import WarmupOptions, run_warmup


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("through", ["name", "link"])
@pytest.mark.parametrize("run, opts, what", [
    (run_train, lambda out: TrainOptions(data=str(out.parent / "rows.jsonl"), out=out), "training run folder"),
    (run_warmup, lambda out: WarmupOptions(data="x.jsonl", val="v.jsonl", out=out), "warmup run folder"),
])
def test_second_run_into_a_locked_folder_stops_at_once(tmp_path, run, opts, what, through):
    """Also when the second run names the folder through a symbolic link (`-o t2` and `-o t2link`)."""
    out = tmp_path / "run"
    out.mkdir()  # (a link to a folder that is not there yet is refused: issue 40)
    link = tmp_path / "link"
    link.symlink_to("run")
    (tmp_path / "rows.jsonl").write_text('{"input_ids": [1, 2], "labels": [-100, 2]}\n')  # an input that exists
    with bio.folder_lock(out, what):  # what the first run holds while it works
        start = time.monotonic()
        with pytest.raises(UsageError, match=f"another process is writing this {what}"):
            run(opts(out if through == "name" else link))
        assert time.monotonic() - start < 5  # before any model is loaded
    assert list(out.iterdir()) == []


def test_a_lock_taken_through_a_link_is_the_folder_s(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "up").symlink_to("..")  # a link among the folders above counts too
    for other in (tmp_path / "link", tmp_path / "sub" / "up" / "real"):
        with bio.folder_lock(tmp_path / "real", "x"):
            with pytest.raises(UsageError, match="another process"):
                with bio.folder_lock(other, "x"):
                    pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real", "sub"]  # no lock file left


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_an_output_given_as_a_symbolic_link_stays_one(tmp_path, kind):
    """The file or folder the link names is replaced atomically, next to itself; the link stays, and
    nothing else is left (no `.old`, no temporary file) on either side."""
    store = tmp_path / "store"
    store.mkdir()
    real = store / "out"
    if kind == "file":
        real.write_text("old")
    else:
        real.mkdir()
        (real / "a").write_text("old")
    link = tmp_path / "link"
    link.symlink_to(os.path.relpath(real, tmp_path))
    if kind == "file":
        with bio.atomic_path(link) as tmp:
            assert tmp.parent == store
            tmp.write_text("new")
    else:
        with bio.atomic_dir(link) as tmp:
            assert tmp.parent == store
            (tmp / "b").write_text("new")
    assert link.is_symlink() and os.readlink(link) == os.path.join("store", "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "store"]
    assert sorted(p.name for p in store.iterdir()) == ["out"]
    if kind == "file":
        assert real.read_text() == "new"
    else:
        assert sorted(p.name for p in real.iterdir()) == ["b"]


def test_resumable_output_through_a_link_shares_the_partial_file_and_its_lock(tmp_path):
    from bridgecli.format.reader import read_all
    from bridgecli.runtime.resumable import ResumableOutput

    header, _ = read_all(ROOT / "tests" / "golden" / "v1.2-scores.bridge")
    real, link = tmp_path / "s.bridge", tmp_path / "l.bridge"
    link.symlink_to("s.bridge")
    first = ResumableOutput(real)
    writer, _ = first.open(header, resume=False)
    with pytest.raises(UsageError, match="another process is writing this partial output"):
        ResumableOutput(link).open(header, resume=False)
    first.finish(writer)
    assert link.is_symlink() and real.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.bridge", "s.bridge"]


def test_folder_lock_is_released(tmp_path):
    with bio.folder_lock(tmp_path / "a", "x"):
        assert (tmp_path / ".a.lock").is_file()
        with bio.folder_lock(tmp_path / "b", "x"):  # another folder: no conflict
            pass
    with bio.folder_lock(tmp_path / "a", "x"):  # free again
        pass
    assert list(tmp_path.iterdir()) == []  # and no lock file is left


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt, SystemExit])
def test_no_lock_file_is_left_by_a_failed_or_interrupted_block(tmp_path, error):
    """An error, Ctrl-C (KeyboardInterrupt) and SIGTERM (the CLI turns it into SystemExit) all unwind."""
    with pytest.raises(error):
        with bio.folder_lock(tmp_path / "run", "x"):
            raise error()
    assert list(tmp_path.iterdir()) == []


def test_a_stale_lock_file_is_named_and_removed(tmp_path, capsys):
    stale = tmp_path / ".run.lock"
    stale.write_text("")  # what a killed run (or bridgecli before 0.x) left: nobody holds it
    with bio.folder_lock(tmp_path / "run", "x"):
        assert stale.is_file()  # this run's own, made fresh
    err = capsys.readouterr().err
    assert f"removed the stale lock file {stale}" in err and "stopped without removing it" in err
    assert list(tmp_path.iterdir()) == []
    with bio.folder_lock(tmp_path / "run", "x"):  # a run after a clean one has nothing to say
        pass
    assert capsys.readouterr().err == ""


def test_a_lock_file_removed_while_waiting_for_it_is_not_taken(tmp_path, monkeypatch, capsys):
    """The race a removed lock file opens: run B opens `.run.lock` while run A holds it, A ends (removes
    the file, then lets go of it), and B locks the file A removed. B must see that the file it holds is
    no longer the one at the path and make a fresh one, or a third run could take the path's new file
    at the same time; and it is no stale lock."""
    import contextlib

    first = contextlib.ExitStack()
    first.enter_context(bio.folder_lock(tmp_path / "run", "x"))  # run A
    held = os.stat(tmp_path / ".run.lock")
    real_lock = bio.lock_exclusively
    calls = []

    def a_ends_first(fh, path, what):
        calls.append(os.fstat(fh.fileno()))
        if len(calls) == 1:
            first.close()  # A ends between B's open and B's lock
        real_lock(fh, path, what)

    monkeypatch.setattr(bio, "lock_exclusively", a_ends_first)
    with bio.folder_lock(tmp_path / "run", "x"):  # run B
        now = os.stat(tmp_path / ".run.lock")
        assert len(calls) == 2 and os.path.samestat(calls[0], held) and os.path.samestat(calls[1], now)
        with pytest.raises(UsageError, match="another process is writing"):  # a third run sees B
            with bio.folder_lock(tmp_path / "run", "x"):
                pass
    assert "stale" not in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


KILLED = textwrap.dedent("""
    import sys, time
    from bridgecli.io import atomic_path, atomic_dir
    kind, target = sys.argv[1], sys.argv[2]
    with (atomic_path(target) if kind == "file" else atomic_dir(target)) as tmp:
        if kind == "file":
            open(tmp, "wb").write(b"x" * 1000)
        else:
            (tmp / "model.bin").write_bytes(b"x" * 1000)
        print("writing", flush=True)
        time.sleep(60)
""")


@pytest.mark.integration  # starts and kills a Python process
@pytest.mark.parametrize("kind", ["file", "dir"])
def test_leftovers_of_a_killed_run_are_swept_by_the_next(tmp_path, monkeypatch, kind):
    target = tmp_path / ("out.bridge" if kind == "file" else "warmup")
    proc = subprocess.Popen([sys.executable, "-c", KILLED, kind, str(target)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    running = [p for p in tmp_path.iterdir() if p.name.startswith(f".{target.name}.")]
    assert len(running) == 1
    monkeypatch.setattr(bio, "STALE_AFTER", 0.0)
    assert bio.sweep_stale(tmp_path, bio._temp_pattern(target.name, ".tmp" if kind == "file" else "")) == []
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert running[0].exists()  # SIGKILL leaves it
    other = tmp_path / ".unrelated.abcdefgh.tmp"
    other.write_text("not ours")
    if kind == "file":
        with bio.atomic_path(target) as tmp:
            tmp.write_bytes(b"new")
    else:
        with bio.atomic_dir(target) as tmp:
            (tmp / "model.bin").write_bytes(b"new")
    assert not running[0].exists()
    assert other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, other.name])


def test_fresh_leftovers_are_kept(tmp_path):
    """A temporary file younger than STALE_AFTER may be one a writer has just made: left alone."""
    young = tmp_path / ".out.bridge.abcdefgh.tmp"
    young.write_text("x")
    with bio.atomic_path(tmp_path / "out.bridge") as tmp:
        tmp.write_text("y")
    assert young.exists()
    old = time.time() - 3600
    os.utime(young, (old, old))
    with bio.atomic_path(tmp_path / "out.bridge") as tmp:
        tmp.write_text("z")
    assert not young.exists() and (tmp_path / "out.bridge").read_text() == "z"


@pytest.mark.integration  # starts and stops `python -m bridgecli`
def test_sigterm_leaves_no_temporary_file(tmp_path):
    """SIGTERM unwinds the command (exit 143), so its atomic output's temporary file goes with it."""

    src = tmp_path / "in.bridge"
    src.write_bytes((ROOT / "tests" / "golden" / "v1.1-scores.bridge").read_bytes())
    proc = subprocess.Popen([sys.executable, "-m", "bridgecli", "select", "-", "-o", str(tmp_path / "out.bridge")],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    data = src.read_bytes()
    proc.stdin.write(data[: len(data) // 2])
    proc.stdin.flush()
    for _ in range(200):
        if any(p.name.startswith(".out.bridge.") for p in tmp_path.iterdir()):
            break
        time.sleep(0.05)
    assert any(p.name.startswith(".out.bridge.") for p in tmp_path.iterdir())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert "terminated" in proc.stderr.read().decode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.bridge"]


@pytest.mark.integration  # four warmup and train runs of a tiny model (30 s on a busy 2-core machine)
def test_runs_through_a_link_to_their_folder_keep_the_link(tmp_path, tiny_model_dir):
    """The issue's case, in sequence: `warmup -o w` then `warmup -o wlink --overwrite`, `train -o t` then
    `train -o tlink --overwrite` (without it the finished run is refused). The second run replaces the
    real folder; the link stays a link and no `.old` or `.NAME.overwrite` is left."""
    import json

    from typer.testing import CliRunner

    from bridgecli.cli.app import app
    from tiny import head

    sample = ROOT / "examples" / "data"
    head(sample / "warm.jsonl", tmp_path / "warm.jsonl", 2)
    head(sample / "val.jsonl", tmp_path / "val.jsonl", 1)
    (tmp_path / "rows.jsonl").write_text("".join(
        json.dumps({"input_ids": list(range(10, 18)), "labels": [-100] * 4 + list(range(14, 18))}) + "\n"
        for _ in range(2)))
    (tmp_path / "wlink").symlink_to("w")
    (tmp_path / "tlink").symlink_to("t")
    runs = {
        "w": ["warmup", tmp_path / "warm.jsonl", "--val", tmp_path / "val.jsonl", "--model", tiny_model_dir,
              "--max-steps", "1", "--batch-size", "2"],
        "t": ["train", tmp_path / "rows.jsonl", "--model", tiny_model_dir, "--max-steps", "1", "--batch-size", "2"],
    }
    for name, argv in runs.items():
        for out in (name, f"{name}link"):
            args = [*map(str, argv), "--device", "cpu", "-o", str(tmp_path / out)]
            if out != name:
                refused = CliRunner().invoke(app, args)
                assert refused.exit_code == 2 and "holds a finished" in refused.output, refused.output
                args.append("--overwrite")
            result = CliRunner().invoke(app, args)
            assert result.exit_code == 0, result.output
            assert not (tmp_path / name / "first-run.txt").exists()  # the second run replaced the first
            summary = tmp_path / name / ("warmup.json" if name == "w" else "bridge_train.json")
            assert summary.is_file()
            (tmp_path / name / "first-run.txt").write_text("")
        assert (tmp_path / f"{name}link").is_symlink() and os.readlink(tmp_path / f"{name}link") == name
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "rows.jsonl", "t", "tlink", "val.jsonl", "w", "warm.jsonl", "wlink"]  # no lock file left


@pytest.mark.integration  # starts a `bridge train` process (a forked child: tests/forked_cli.py) and interrupts it
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_train_leaves_no_lock_file(tmp_path, tiny_model_dir, forked_bridge, sig, code):
    import json

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(
        json.dumps({"input_ids": list(range(10, 18)), "labels": [-100] * 4 + list(range(14, 18))}) + "\n"
        for _ in range(4)))
    out = tmp_path / "run"
    # SIGINT raises KeyboardInterrupt in it wherever pytest runs (the server's children: tiny.default_sigint)
    proc = forked_bridge.start(["train", rows, "-o", out, "--model", tiny_model_dir, "--device", "cpu",
                                "--epochs", "100000", "--batch-size", "1", "--grad-accum", "1"],
                               env={**os.environ, "BRIDGE_NO_PROGRESS": "1"})
    metrics = out / "metrics.jsonl"
    try:
        for _ in range(1200):  # training has begun once a step is recorded
            if metrics.is_file() and metrics.stat().st_size > 0 or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert (tmp_path / ".run.lock").is_file(), proc.stderr.decode() if proc.poll() is not None else ""
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == code, proc.stderr.decode()
    finally:  # a run that ignored the signal trains 100,000 epochs: not past the test
        proc.kill()
        proc.wait()
    assert ".run.lock" not in {p.name for p in tmp_path.iterdir()}


def test_a_failed_warmup_and_train_leave_no_lock_file(tmp_path, no_model_loads):
    """Failures after the lock is taken (an empty input, rows a model cannot take), before any model loads."""
    from typer.testing import CliRunner

    from bridgecli.cli.app import app

    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "val.jsonl").write_text('{"prompt": "a", "response": "b"}\n')
    (tmp_path / "rows.jsonl").write_text('{"input_ids": [1, 2], "labels": [-100, -100]}\n')  # nothing supervised
    for args in (["warmup", tmp_path / "empty.jsonl", "--val", tmp_path / "val.jsonl", "-o", tmp_path / "w"],
                 ["train", tmp_path / "rows.jsonl", "-o", tmp_path / "t"]):
        result = CliRunner().invoke(app, list(map(str, args)))
        assert result.exit_code != 0 and "error" in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl", "rows.jsonl", "val.jsonl"]

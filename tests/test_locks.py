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


@pytest.mark.parametrize("run, opts, what", [
    (run_train, lambda out: TrainOptions(data=str(out.parent / "rows.jsonl"), out=out), "training run folder"),
    (run_warmup, lambda out: WarmupOptions(data="x.jsonl", val="v.jsonl", out=out), "warmup run folder"),
])
def test_second_run_into_a_locked_folder_stops_at_once(tmp_path, run, opts, what):
    out = tmp_path / "run"
    (tmp_path / "rows.jsonl").write_text('{"input_ids": [1, 2], "labels": [-100, 2]}\n')  # an input that exists
    with bio.folder_lock(out, what):  # what the first run holds while it works
        start = time.monotonic()
        with pytest.raises(UsageError, match=f"another process is writing this {what}"):
            run(opts(out))
        assert time.monotonic() - start < 5  # before any model is loaded
    assert not out.exists()


def test_folder_lock_is_released(tmp_path):
    with bio.folder_lock(tmp_path / "a", "x"):
        with bio.folder_lock(tmp_path / "b", "x"):  # another folder: no conflict
            pass
    with bio.folder_lock(tmp_path / "a", "x"):  # free again
        pass


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

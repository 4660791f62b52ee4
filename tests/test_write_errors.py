"""A failed write is one line, never a traceback (docs/cli.md, "Exit codes and errors"): every command
that writes, on a full disk (a small tmpfs, mounted where this process may), with standard output on
/dev/full, and over the file size limit (RLIMIT_FSIZE, what `ulimit -f` sets, in a subprocess). Each
exits 7 with one line `bridge CMD: error: OUTPUT: cannot write: ...`, leaves no temporary file behind
and keeps an earlier output. A reader that closes the pipe early ends a command quietly (exit 141).

Commands run in-process through the Typer app (the tiny random model of tests/tiny.py), except where
the process itself is the point (/dev/full and a closed pipe at exit, the file size limit).
``analyze fidelity`` and ``analyze shift`` write their reports through the one writer that
``analyze robustness`` uses here (steps/analyze.py ``write_report``)."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bridgecli.cli.app import app
from bridgecli.errors import WriteError
from bridgecli.io import failed_write, human_bytes, write_error

from tiny import run_bridge, sample_inputs

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "v1.2-closure.bridge"

# integration: its fixture runs every command on a tiny model, and several tests start `python -m bridgecli`
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]


def assert_one_line(code: int, err: str, command: str, names: str) -> None:
    """Exit 7; stderr holds no traceback and exactly one error line, the last, naming ``names``."""
    assert code == 7, err
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert [line for line in lines if "error:" in line] == lines[-1:], err
    assert lines[-1].startswith(f"bridge {command}: error: {names}"), err  # eval: its journal, OUT.partial.jsonl
    assert ": cannot write: " in lines[-1], err


@pytest.fixture(scope="module")
def work(tmp_path_factory, tiny_model_dir):
    """Inputs for every command: data, a warmup run, its scores, a selection, a closure, rows, a result."""
    w = tmp_path_factory.mktemp("writes")
    sample_inputs(w, warm=4, val=2, data=3, test=2)
    steps = [
        ["warmup", w / "warm.jsonl", "--val", w / "val.jsonl", "--model", tiny_model_dir, "--max-steps", "1",
         "--batch-size", "4", "-o", w / "warm"],
        ["score", w / "data.jsonl", "--from", w / "warm", "-o", w / "scores.bridge"],
        ["select", w / "scores.bridge", "-o", w / "sel.bridge"],
        ["close", w / "sel.bridge", "-o", w / "closed.bridge"],
        ["compact", w / "closed.bridge", "-o", w / "rows.jsonl"],
        ["eval", tiny_model_dir, "--task", "gsm8k", "--data", w / "test.jsonl", "--max-new-tokens", "2",
         "--batch-size", "2", "-o", w / "res" / "eval-gsm8k.json"],
    ]
    for argv in steps:
        code, err = run_bridge(argv)
        assert code == 0, f"{argv[0]}: {err}"
    return w


# (id, argv with {w} the work folder, {model} the tiny model and {out} the output, output name, its kind)
CASES = [
    ("warmup", "warmup {w}/warm.jsonl --val {w}/val.jsonl --model {model} --max-steps 1 --batch-size 4 -o {out} "
     "--overwrite", "run", "warmup-run"),
    ("score", "score {w}/data.jsonl --from {w}/warm -o {out}", "out.bridge", "file"),
    ("merge", "merge {w}/scores.bridge -o {out}", "out.bridge", "file"),
    ("reference", "reference {w}/scores.bridge --model {model} -o {out}", "out.bridge", "file"),
    ("select", "select {w}/scores.bridge -o {out}", "out.bridge", "file"),
    ("close", "close {w}/sel.bridge -o {out}", "out.bridge", "file"),
    ("compact", "compact {w}/closed.bridge -o {out}", "rows.jsonl", "file"),
    ("compact", "compact {w}/closed.bridge --format parquet -o {out}", "rows.parquet", "file"),
    ("compact", "compact {w}/closed.bridge --format hf -o {out}", "rows", "dir"),
    ("compact", "compact {w}/closed.bridge --format text -o {out}", "rows.txt", "file"),
    ("train", "train {w}/rows.jsonl --model {model} --max-steps 1 --batch-size 2 -o {out}", "final", "run"),
    ("train", "train {w}/rows.jsonl --model {model} --max-steps 1 --batch-size 2 -o {out} --overwrite", "final",
     "train-run"),
    ("eval", "eval {model} --task gsm8k --data {w}/test.jsonl --max-new-tokens 2 --batch-size 2 -o {out}",
     "out.json", "file"),
    ("inspect", "inspect {w}/closed.bridge --stats --png {out}", "out.png", "file"),
    ("show", "show {w}/closed.bridge --html {out}", "out.html", "file"),
    ("analyze robustness", "analyze robustness {w}/scores.bridge -o {out}", "out.json", "file"),
]
IDS = [c[1].split(" {")[0] + (" " + c[1].split("--format ")[1].split()[0] if "--format" in c[1] else "")
       + (" --overwrite" if "--overwrite" in c[1] else "") for c in CASES]
#: an earlier output of compact --format hf: the files that tell it is one (its side file lies beside it)
EARLIER_HF = ("state.json", "dataset_info.json", "data-00000-of-00001.arrow")
#: an earlier finished run of the command (kinds warmup-run and train-run): its files
FINISHED = {"warmup-run": {"warmup.json": "{}", "checkpoint/earlier.txt": "the earlier output\n"},
            "train-run": {"bridge_train.json": "{}", "earlier.txt": "the earlier output\n"}}


def argv_of(template: str, w: Path, model: Path, out: Path) -> list[str]:
    return [part.format(w=w, model=model, out=out) for part in template.split()]


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


# --- a full disk ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory):
    """A 1 MiB tmpfs of our own (root and a kernel that lets us mount; skipped elsewhere)."""
    folder = tmp_path_factory.mktemp("tmpfs")
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root on Linux")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill(disk: Path, leave: int = 0) -> None:
    """Take every free byte of ``disk`` but ``leave`` (new files may still be created)."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        chunk = b"\0" * 65536
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    finally:
        os.close(fd)


@pytest.mark.parametrize("command, template, name, kind", CASES, ids=IDS)
def test_full_disk_is_one_line_and_keeps_the_earlier_output(work, tiny_model_dir, small_disk, command, template,
                                                           name, kind):
    for p in small_disk.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    out = small_disk / name
    if kind == "file":
        out.write_text("the earlier output\n")
    elif kind == "dir":  # an earlier output of compact --format hf (a foreign folder is refused at once)
        out.mkdir()
        for rel in EARLIER_HF:
            (out / rel).write_text("the earlier output\n")
        (small_disk / f"{name}.bridge.json").write_text("{}")
    elif kind in FINISHED:  # replaced (--overwrite) only once the new run is written
        for rel, text in FINISHED[kind].items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_text(text)
    # warmup and train: room for their logs, not for the model (safetensors' own error, wrapping ENOSPC)
    fill(small_disk, leave=64 << 10 if command in {"warmup", "train"} else 0)
    before = _tree(small_disk)

    code, err = run_bridge(argv_of(template, work, tiny_model_dir, out))

    assert_one_line(code, err, command, str(out))
    after = _tree(small_disk)
    # no lock file is left (docs/cli.md); train writes its run folder in place, and a failed one removes
    # it unless --resume can continue it (issue 40): here no checkpoint was written
    allowed: set[str] = set()
    assert after - before <= allowed, sorted(after - before)
    assert before <= after
    if kind == "file":
        assert out.read_text() == "the earlier output\n"
    elif kind == "dir":
        assert _tree(out) == set(EARLIER_HF) and (out / "state.json").read_text() == "the earlier output\n"
    elif kind in FINISHED:
        assert {p: (out / p).read_text() for p in _tree(out) if (out / p).is_file()} == FINISHED[kind]


def test_a_full_temporary_folder_names_the_temporary_file(work, small_disk, monkeypatch):
    """`score -` copies stdin to a temporary file first: a full $TMPDIR is named, not the output."""
    from typer.testing import CliRunner

    for p in small_disk.iterdir():
        p.unlink()
    fill(small_disk)
    monkeypatch.setattr("tempfile.tempdir", str(small_disk))
    result = CliRunner().invoke(app, ["score", "-", "--from", str(work / "warm"), "-o", str(work / "never.bridge")],
                                input=(work / "data.jsonl").read_bytes())
    assert result.exit_code == 7, result.output
    assert result.stderr.startswith(f"bridge score: error: {small_disk}/bridge-stdin-"), result.stderr
    assert "stdin.jsonl: cannot write: No space left on device" in result.stderr
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"] and not (work / "never.bridge").exists()


def test_a_side_file_that_cannot_be_written_goes(small_disk):
    """compact writes the rows, then their side file: when the disk fills between the two, an earlier
    side file (which describes other rows) is removed, not kept."""
    from bridgecli.artifacts.rows_meta import RowsMeta, rows_meta_path, write_rows_meta

    for p in small_disk.iterdir():
        p.unlink()
    rows = small_disk / "rows.jsonl"
    rows.write_text("{}\n")
    rows_meta_path(rows).write_text("{}")
    fill(small_disk)
    with pytest.raises(WriteError, match="rows.jsonl.bridge.json: cannot write: No space left on device"):
        write_rows_meta(rows, RowsMeta(model="m", tokenizer_fingerprint="t"))
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "rows.jsonl"]


def test_torch_save_on_a_full_disk_is_a_write_error(small_disk):
    """torch's serializer loses the errno (a RuntimeError from its C++ writer); a full disk is still named."""
    import torch

    from bridgecli.io import atomic_path

    for p in small_disk.iterdir():
        p.unlink()
    fill(small_disk)
    with pytest.raises(WriteError, match="out.pt: cannot write: No space left on device"):
        with atomic_path(small_disk / "out.pt") as tmp:
            torch.save({"w": torch.zeros(65536)}, tmp)
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


# --- standard output on /dev/full ---------------------------------------------------------------------

# (id, command, argv as in CASES): every command that writes to standard output (warmup and train
# write only their run folder, and their summary line to stderr)
STDOUT_CASES = [
    ("score", "score", "score {w}/data.jsonl --from {w}/warm"),
    ("merge", "merge", "merge {w}/scores.bridge"),
    ("reference", "reference", "reference {w}/scores.bridge --model {model}"),
    ("select", "select", "select {w}/scores.bridge"),
    ("close", "close", "close {w}/sel.bridge"),
    ("compact", "compact", "compact {w}/closed.bridge"),
    ("compact text", "compact", "compact {w}/closed.bridge --format text"),
    ("eval", "eval", "eval {model} --task gsm8k --data {w}/test.jsonl --max-new-tokens 2 --batch-size 2 -o {out}.json"),
    ("compare", "compare", "compare {w}/res"),
    ("inspect", "inspect", "inspect {w}/closed.bridge"),
    ("inspect --json", "inspect", "inspect {w}/closed.bridge --json"),
    ("inspect --stats", "inspect", "inspect {w}/closed.bridge --stats"),
    ("show", "show", "show {w}/closed.bridge"),
    ("plugins", "plugins", "plugins"),
    ("analyze robustness", "analyze robustness", "analyze robustness {w}/scores.bridge -o -"),
]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("command, template", [c[1:] for c in STDOUT_CASES], ids=[c[0] for c in STDOUT_CASES])
def test_stdout_on_dev_full_is_one_line(work, tiny_model_dir, tmp_path, command, template):
    with open("/dev/full", "w") as full:
        code, err = run_bridge(argv_of(template, work, tiny_model_dir, tmp_path / "out"), stdout=full)
        assert_one_line(code, err, command, "<stdout>")


def _bridge(*args, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "BRIDGE_NO_PROGRESS": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "bridgecli", *map(str, args)], env=env, stderr=subprocess.PIPE,
                          **kwargs)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("args", [["select", GOLDEN], ["plugins"]], ids=["binary", "text"])
def test_dev_full_in_a_real_process(args):
    """What the process does at exit too: no 'Exception ignored' when Python flushes stdout (exit 120)."""
    with open("/dev/full", "wb") as full:
        proc = _bridge(*args, stdout=full)
    err = proc.stderr.decode()
    assert proc.returncode == 7, err
    assert err.splitlines() == [f"bridge {args[0]}: error: <stdout>: cannot write: No space left on device "
                                "(ENOSPC) (free some space or write elsewhere, then run again)"]


@pytest.mark.parametrize("args", [["select", GOLDEN], ["inspect", GOLDEN], ["compact", GOLDEN, "--format", "text"]],
                         ids=["binary", "rich", "text"])
def test_a_closed_pipe_ends_quietly(args):
    """`bridge ... | head`: the reader went away; the command stops at once, prints nothing, exits 141."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write
    try:
        proc = _bridge(*args, stdout=write)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr.decode()) == (141, "")


# --- the file size limit (ulimit -f) -----------------------------------------------------------------

LIMIT = 1024  # bytes: every output here is larger, every input may be read

DRIVER = """
import io, json, sys
from bridgecli.cli.app import app

results = {}
for key, argv in json.loads(sys.argv[1]):
    sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
    try:
        code = app(argv, prog_name="bridge", standalone_mode=False)
    except SystemExit as exc:
        code = exc.code
    results[key] = [code if isinstance(code, int) else 0, sys.stderr.getvalue()]
sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
print(json.dumps(results))
"""


def _limited() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


#: the stream writer, the JSONL and Parquet rows, an HTML page and a report, in one process (the
#: model writers meet a full disk above, and safetensors over the limit below)
EFBIG_CASES = {"select", "merge", "compact", "compact parquet", "show", "analyze robustness"}


def test_file_size_limit_is_one_line(work, tiny_model_dir, tmp_path):
    cases = [(i, c) for i, c in zip(IDS, CASES) if i in EFBIG_CASES]
    assert len(cases) == len(EFBIG_CASES)
    runs, outs = [], {}
    for key, (command, template, name, kind) in cases:
        out = tmp_path / key.replace(" ", "-") / name
        out.parent.mkdir()
        if kind == "file":
            out.write_text("the earlier output\n")
        outs[key] = (command, out, kind)
        runs.append([key, argv_of(template, work, tiny_model_dir, out)])
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(runs)], capture_output=True, preexec_fn=_limited,
                          env={**os.environ, "BRIDGE_NO_PROGRESS": "1", "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr.decode()
    results = json.loads(proc.stdout)
    for key, (command, out, kind) in outs.items():
        code, err = results[key]
        assert_one_line(code, err, command, str(out))
        assert "File too large" in err
        left = sorted(_tree(out.parent) - {out.name}
                      - ({f"{out.name}/metrics.jsonl"} if command == "train" else set()))
        assert left == [], (key, left)
        if kind == "file":
            assert out.read_text() == "the earlier output\n"


SAFETENSORS = """
import sys
import numpy as np
from safetensors.numpy import save_file
from bridgecli.io import atomic_dir
from bridgecli.errors import WriteError

try:
    with atomic_dir(sys.argv[1]) as tmp:
        save_file({"w": np.zeros(4096, dtype=np.float32)}, str(tmp / "model.safetensors"))
except WriteError as err:
    print(err)
"""


def test_safetensors_over_the_file_size_limit_is_a_write_error(tmp_path):
    """What the model writers meet under `ulimit -f`: safetensors' own error, wrapping EFBIG."""
    out = tmp_path / "model"
    out.mkdir()
    (out / "earlier.txt").write_text("the earlier output\n")
    proc = subprocess.run([sys.executable, "-c", SAFETENSORS, str(out)], capture_output=True, preexec_fn=_limited,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().startswith(f"{out}: cannot write: File too large ("), proc.stdout.decode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"] and _tree(out) == {"earlier.txt"}


# --- what counts as a failed write ---------------------------------------------------------------------


def test_failed_write_reads_the_errno_through_library_wrappers(tmp_path):
    full = OSError(errno.ENOSPC, "No space left on device")
    assert failed_write(full) == (errno.ENOSPC, os.strerror(errno.ENOSPC))
    wrapped = RuntimeError("saving failed")
    wrapped.__cause__ = OSError(errno.EFBIG, "File too large")
    assert failed_write(wrapped) == (errno.EFBIG, os.strerror(errno.EFBIG))

    class SafetensorError(Exception):  # what safetensors raises, by name (its Rust I/O error in the text)
        pass

    found = failed_write(SafetensorError("Error while serializing: I/O error: Disk quota exceeded (os error 122)"))
    assert found == (errno.EDQUOT, os.strerror(errno.EDQUOT))
    assert failed_write(SafetensorError("Error while serializing: the tensor is not contiguous")) is None
    assert failed_write(OSError(errno.EACCES, "Permission denied")) is None  # the user's to fix: not a full disk
    assert failed_write(BrokenPipeError(errno.EPIPE, "Broken pipe")) is None  # a closed pipe ends quietly
    assert failed_write(ValueError("no")) is None

    err = write_error(full, tmp_path / "out.bridge")
    assert isinstance(err, WriteError) and err.exit_code == 7
    free = human_bytes(os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize)
    assert str(err) == (f"{tmp_path / 'out.bridge'}: cannot write: No space left on device (ENOSPC, {free} free "
                        "there) (free some space or write elsewhere, then run again)")
    assert str(write_error(full, "-")).startswith("<stdout>: cannot write: No space left on device (ENOSPC)")
    broken = write_error(OSError(errno.EIO, "Input/output error"), tmp_path / "out.bridge")
    assert str(broken).endswith("out.bridge: cannot write: Input/output error (EIO) (the device reported an error)")


def test_a_write_that_lost_its_errno_says_why(tmp_path, monkeypatch):
    """Issue 40: a train ended with "cannot write: the write failed", no reason given (torch's serializer loses
    the errno). A probe write next to the output finds it, with the room left; where the probe goes through,
    the writer's own words are the reason."""
    from bridgecli import io as bio

    lost = RuntimeError("[enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing file data/3: "
                        "file write failed")
    assert failed_write(lost) == (None, "torch's writer failed (PytorchStreamWriter failed writing file data/3: "
                                        "file write failed)")
    assert bio.probe_errno(tmp_path / "out.pt") is None  # room here: the probe goes through
    said = str(write_error(lost, tmp_path / "out.pt"))
    assert said.endswith("out.pt: cannot write: torch's writer failed (PytorchStreamWriter failed writing file "
                         "data/3: file write failed)")
    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: os.statvfs_result((4096, 4096, 100, 3, 3, *real(p)[5:])))
    monkeypatch.setattr(bio, "probe_errno", lambda path: errno.ENOSPC)  # the probe meets the full disk
    said = str(write_error(lost, tmp_path / "out.pt"))
    assert "out.pt: cannot write: No space left on device (ENOSPC, 12.3 kB free there)" in said, said
    monkeypatch.setattr(bio, "probe_errno", lambda path: errno.EIO)
    assert "cannot write: Input/output error (EIO) (the device reported an error)" in str(write_error(lost, tmp_path))

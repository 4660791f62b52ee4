"""What an output may replace (docs/cli.md, "Input and output"): every command that writes refuses,
before any work and in one line (exit 2), an output that is (or whose links lead to) a device, a FIFO,
a socket, a folder where a file is expected (a file where a folder is), a link to nothing or a loop
of links, or one of its own inputs (the same file through any link, hard links too; for a folder
output, a folder that holds one); a folder output refuses a non-empty folder it did not write. What
was there is left as it was, and nothing is created through a dangling link. ``-`` and
``/dev/stdout`` are standard output (issue 40).

The refusals come before any model loads or any record is read, so the commands run in-process on the
golden streams and a few lines of the sample data, with models that do not exist."""

from __future__ import annotations

import io
import os
import re
import shutil
import socket
import stat
from pathlib import Path

import pytest

from bridgecli.errors import UsageError
from bridgecli.io import check_output, output_target

from tiny import run_bridge, sample_inputs

GOLDEN = Path(__file__).resolve().parent / "golden"


def invoke(argv: list[str]) -> tuple[int, str, bytes]:
    """`bridge ARGV` in this process: (exit code, stderr, what went to stdout)."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    code, err = run_bridge(argv, stdout=out)
    out.flush()
    return code, err, out.buffer.getvalue()  # type: ignore[attr-defined]


@pytest.fixture
def w(tmp_path) -> Path:
    """The inputs: the golden streams of each stage, data, rows."""
    for stage in ("scores", "selection", "closure"):
        shutil.copy(GOLDEN / f"v1.3-{stage}.bridge", tmp_path / f"{stage}.bridge")
    sample_inputs(tmp_path, warm=3, val=2, data=3, test=2)
    (tmp_path / "rows.jsonl").write_text('{"input_ids": [1, 2], "labels": [-100, 2]}\n')
    return tmp_path


# command -> (argv with {w} the inputs' folder and {out} the output, the input the output may not be, kind)
COMMANDS = {
    "select": ("select {w}/scores.bridge -o {out}", "scores.bridge", "file"),
    "close": ("close {w}/selection.bridge -o {out}", "selection.bridge", "file"),
    "compact": ("compact {w}/closure.bridge -o {out}", "closure.bridge", "file"),
    "compact parquet": ("compact {w}/closure.bridge --format parquet -o {out}", "closure.bridge", "file"),
    "compact text": ("compact {w}/closure.bridge --format text -o {out}", "closure.bridge", "file"),
    "compact hf": ("compact {w}/closure.bridge --format hf -o {out}", "closure.bridge", "folder"),
    "merge": ("merge {w}/scores.bridge -o {out}", "scores.bridge", "file"),
    "reference": ("reference {w}/scores.bridge --model {w}/no-model -o {out}", "scores.bridge", "file"),
    "score": ("score {w}/data.jsonl --from {w}/no-warmup -o {out}", "data.jsonl", "file"),
    "show": ("show {w}/closure.bridge --html {out}", "closure.bridge", "file"),
    "inspect": ("inspect {w}/closure.bridge --stats --png {out}", "closure.bridge", "file"),
    "analyze robustness": ("analyze robustness {w}/scores.bridge -o {out}", "scores.bridge", "file"),
    "analyze shift": ("analyze shift {w}/data.jsonl --from {w}/no-warmup -o {out}", "data.jsonl", "file"),
    "analyze fidelity": ("analyze fidelity {w}/data.jsonl --from {w}/no-warmup -o {out}", "data.jsonl", "file"),
    "eval": ("eval {w}/no-model --task gsm8k --data {w}/test.jsonl -o {out}", "test.jsonl", "file"),
    "train": ("train {w}/rows.jsonl --model {w}/no-model -o {out}", "rows.jsonl", "folder"),
    "warmup": ("warmup {w}/warm.jsonl --val {w}/val.jsonl --model {w}/no-model -o {out}", "warm.jsonl", "folder"),
}


def run(command: str, w: Path, out: Path | str) -> tuple[int, str, bytes]:
    template = COMMANDS[command][0]
    return invoke([part.format(w=w, out=out) for part in template.split()])


def refused(code: int, err: str, *names: str) -> None:
    """Exit 2 with one error line, no traceback, naming each of ``names``."""
    assert code == 2, err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and err.splitlines()[-1] == errors[0], err
    for name in names:
        assert name in errors[0], err


def snapshot(w: Path) -> dict[str, tuple]:
    """Every entry under ``w``: its kind, and a regular file's bytes (what must stay as it was)."""
    out = {}
    for p in sorted(w.rglob("*")):
        st = os.lstat(p)
        out[str(p.relative_to(w))] = (stat.S_IFMT(st.st_mode), p.read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return out


def unchanged(w: Path, before: dict) -> None:
    after = snapshot(w)
    assert after == before, sorted(set(after) ^ set(before))


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _socket(p: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    s.close()


SPECIAL = {"fifo": (_fifo, "a FIFO"), "socket": (_socket, "a socket")}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_device_is_replaced(w, command):
    link = w / "null-link"
    link.symlink_to("/dev/null")
    before = snapshot(w)
    for out in ("/dev/null", link):
        code, err, _ = run(command, w, out)
        refused(code, err, str(out), "a character device")
        assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    unchanged(w, before)
    assert not Path("/dev/null.bridge.json").exists()


@pytest.mark.parametrize("kind", sorted(SPECIAL))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_fifo_or_socket_is_replaced(w, tmp_path_factory, command, kind):
    where = tmp_path_factory.mktemp("s")  # a socket's path must be short
    make, said = SPECIAL[kind]
    make(where / "x")
    (w / "link").symlink_to(where / "x")
    before, special = snapshot(w), snapshot(where)
    for out in (where / "x", w / "link"):
        code, err, _ = run(command, w, out)
        refused(code, err, str(out), said)
    unchanged(w, before)
    unchanged(where, special)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_wrong_kind_of_path_is_refused(w, command):
    kind = COMMANDS[command][2]
    out = w / "there"
    if kind == "file":
        out.mkdir()
        (out / "keep.txt").write_text("kept")
        expected = "a folder; the output must be a file path"
        if command == "eval":  # -o FOLDER is eval's folder of eval-TASK.json files: the result is the folder
            (out / "eval-gsm8k.json").mkdir()
    else:
        out.write_text("kept")
        expected = "exists and is not a folder"
    before = snapshot(w)
    code, err, _ = run(command, w, out)
    refused(code, err, str(out), expected)
    unchanged(w, before)


@pytest.mark.parametrize("how", ["the path", "a symbolic link", "a hard link"])
@pytest.mark.parametrize("command", sorted(c for c in COMMANDS if COMMANDS[c][2] == "file"))
def test_an_output_that_is_an_input_is_refused(w, command, how):
    inp = w / COMMANDS[command][1]
    out = {"the path": inp, "a symbolic link": w / "same", "a hard link": w / "same"}[how]
    if how == "a symbolic link":
        out.symlink_to(inp)
    elif how == "a hard link":
        os.link(inp, out)
    before = snapshot(w)
    code, err, _ = run(command, w, out)
    # eval's -o without .json is a folder of eval-TASK.json files: the data file is no folder
    refused(code, err, str(out), "is a file, not a folder" if command == "eval" else "the same file as the input")
    unchanged(w, before)


@pytest.mark.parametrize("command", sorted(c for c in COMMANDS if COMMANDS[c][2] == "folder"))
def test_a_folder_output_that_holds_an_input_is_refused(w, command):
    # the output folder is the inputs' own folder (through a link too): replacing it would delete them
    (w.parent / f"{w.name}-link").symlink_to(w)
    before = snapshot(w)
    for out in (w, w.parent / f"{w.name}-link"):
        code, err, _ = run(command, w, out)
        refused(code, err, str(out), "holds the input")
    unchanged(w, before)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_dangling_links_and_loops_are_refused(w, tmp_path_factory, command):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (w / "dangling").symlink_to(elsewhere / "missing" / "deeper" / "out")
    (w / "loop-a").symlink_to(w / "loop-b")
    (w / "loop-b").symlink_to(w / "loop-a")
    (w / "dangling-folder").symlink_to(elsewhere / "gone")
    before = snapshot(w)
    cases = [(w / "dangling", "a link to nothing"), (w / "loop-a", "a loop of symbolic links"),
             (w / "dangling-folder" / "sub" / "out", "a link to nothing")]
    for out, said in cases:
        code, err, _ = run(command, w, out)
        refused(code, err, str(out), said)
    unchanged(w, before)
    assert list(elsewhere.iterdir()) == []  # no folder made where a dangling link points


def test_compact_hf_replaces_only_its_own_folder(w):
    foreign = w / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    before = snapshot(w)
    code, err, _ = run("compact hf", w, foreign)
    refused(code, err, str(foreign), "not empty and was not written by this command")
    unchanged(w, before)
    (w / "foreign-link").symlink_to(foreign)
    code, err, _ = run("compact hf", w, w / "foreign-link")
    refused(code, err, "foreign-link", "not empty")
    # an empty folder, then the folder compact wrote, are written
    rows = w / "rows"
    rows.mkdir()
    for _ in range(2):
        code, err, _ = run("compact hf", w, rows)
        assert code == 0, err
        assert (rows / "state.json").is_file() and (w / "rows.bridge.json").is_file()


@pytest.mark.parametrize("command", ["select", "compact", "compact text", "analyze robustness"])
def test_dev_stdout_is_standard_output(w, command):
    code, err, first = run(command, w, "-")
    assert code == 0, err
    code, err, second = run(command, w, "/dev/stdout")
    assert code == 0, err
    # a report's "created" is the second it was written: two runs may straddle one (a loaded CI machine did)
    assert _undated(second) == _undated(first) and first


def _undated(out: bytes) -> bytes:
    """A JSON report's bytes with its "created" timestamp blanked (binary streams pass unchanged)."""
    return re.sub(rb'"created": "[^"]*"', b'"created": ""', out)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_the_check_itself(tmp_path):
    # what check_output and output_target decide, without a command
    assert output_target(tmp_path / "new") is None
    (tmp_path / "f").write_text("x")
    assert output_target(tmp_path / "f") is not None
    check_output(tmp_path / "f", inputs=["-", None, tmp_path / "absent"])  # stdin and a missing input: not compared
    check_output("-", inputs=["-"])
    check_output("/dev/stdout")
    with pytest.raises(UsageError, match="is a file, not a folder"):
        output_target(tmp_path / "f" / "under")
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "x").write_text("x")
    check_output(folder, folder=True)  # contents judged by the command (ours=None)
    check_output(folder, folder=True, ours=lambda p: True)
    with pytest.raises(UsageError, match="not empty"):
        check_output(folder, folder=True, ours=lambda p: False)
    with pytest.raises(UsageError, match="holds the input"):
        check_output(folder, folder=True, inputs=[folder / "x"])
    check_output(tmp_path / "other", folder=True, inputs=[folder / "x"])


@pytest.mark.parametrize("command, argv", [
    ("show", "show {w}/closure.bridge --html -"),
    ("inspect", "inspect {w}/closure.bridge --stats --png /dev/stdout"),
    ("eval", "eval {w}/no-model --task gsm8k --data {w}/test.jsonl -o -"),
    ("train", "train {w}/rows.jsonl --model {w}/no-model -o -"),
    ("warmup", "warmup {w}/warm.jsonl --val {w}/val.jsonl --model {w}/no-model -o -"),
    ("compact", "compact {w}/closure.bridge --format hf -o -"),
])
def test_outputs_that_cannot_go_to_standard_output(w, tmp_path, monkeypatch, command, argv):
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    code, err, out = invoke([part.format(w=w) for part in argv.split()])
    assert code == 2, err
    assert "Traceback" not in err and len([line for line in err.splitlines() if "error:" in line]) == 1, err
    unchanged(tmp_path, before)  # no file or folder named "-"

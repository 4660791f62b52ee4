"""``--workers N`` on select, close and compact: the same output bytes and the same errors as one process."""

from __future__ import annotations

import json
import os
import struct

import msgspec
import numpy as np
import pytest
import zstandard
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.format.spec import PREAMBLE

from tiny import frame_lengths

pytestmark = pytest.mark.integration  # forks worker pools, and `python -m bridgecli`

N = 150  # two full frames of 64 records and a partial one


def _after_header_bytes(raw: bytes) -> bytes:
    """A stream's bytes after its header frame (the header holds timestamps)."""
    body = raw[PREAMBLE.size:]
    return body[frame_lengths(body)[0]:]


def _tail(path) -> bytes:
    return _after_header_bytes(path.read_bytes())


@pytest.fixture(scope="module")
def scored(tmp_path_factory, tokenizer):
    from bridgecli.data.examples import DataOptions, iter_examples
    from bridgecli.format.records import Array, Scores
    from test_show import write_stream
    from tiny import sample_module

    generate = sample_module().generate

    folder = tmp_path_factory.mktemp("workers")
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps({"id": r["id"], "question": r["question"], "answer": r["answer"]}) + "\n"
                            for r in generate(N, seed=3)))
    rng = np.random.default_rng(0)
    exs = []
    for ex in iter_examples(data, tokenizer, DataOptions()):
        kinds = np.frombuffer(ex.tokens.kinds, dtype=np.uint8)
        m, n = int((kinds == 1).sum()), int((kinds == 2).sum())
        scores = Scores(scorer="bridge", a=Array.of(rng.normal(size=n)), c=Array.of(rng.uniform(0, 1, n)),
                        A=Array.of(rng.dirichlet(np.ones(m + 1), size=n)[:, :m], "float16"))
        exs.append(msgspec.structs.replace(ex, scores=scores))
    return folder, exs, write_stream(folder / "scores.bridge", exs, "scores")


def _run(args, input=None):
    res = CliRunner().invoke(app, [str(a) for a in args], input=input)
    return res.exit_code, res.output


def test_workers_give_the_same_bytes(scored, tmp_path):
    folder, _, src = scored
    outs = {}
    for w in (1, 2):
        sel, clo, rows, text = (tmp_path / f"{name}{w}" for name in ("sel.bridge", "clo.bridge", "rows.jsonl", "v.txt"))
        assert _run(["select", "-T", "4", "--protect-response", "answer", src, "-o", sel, "--workers", w])[0] == 0
        assert _run(["close", "--segmenter", "math", sel, "-o", clo, "--workers", w])[0] == 0
        assert _run(["compact", clo, "-o", rows, "--workers", w])[0] == 0
        assert _run(["compact", clo, "-o", text, "--format", "text", "--workers", w])[0] == 0
        outs[w] = (_tail(sel), _tail(clo), rows.read_bytes(), text.read_bytes())
    assert len(outs[1][2].splitlines()) == N
    assert outs[1] == outs[2]


def test_workers_report_the_same_error(scored, tmp_path, monkeypatch):
    from test_show import write_stream

    monkeypatch.setattr("bridgecli.runtime.pool.default_workers", lambda: 8)  # 3 workers even on 2 CPUs

    folder, exs, _ = scored
    bad = list(exs)
    bad[100] = msgspec.structs.replace(bad[100], id=bad[3].id)  # a duplicate id in the second frame
    src = write_stream(tmp_path / "dup.bridge", bad, "scores")
    codes = [_run(["select", src, "-o", tmp_path / f"o{w}.bridge", "--workers", w]) for w in (1, 3)]
    assert codes[0][0] == codes[1][0] == 3
    assert "duplicate id" in codes[0][1] and codes[0][1] == codes[1][1]
    assert not (tmp_path / "o3.bridge").exists()

    broken = list(exs)  # a record whose scores do not fit its tokens, in the last, partial frame
    ex = broken[140]
    broken[140] = msgspec.structs.replace(ex, scores=msgspec.structs.replace(ex.scores, a=ex.scores.c.__class__(
        dtype="float32", shape=[1], data=b"\0\0\0\0")))
    src = write_stream(tmp_path / "broken.bridge", broken, "scores")
    codes = [_run(["select", src, "-o", tmp_path / f"b{w}.bridge", "--workers", w]) for w in (1, 2)]
    assert codes[0][0] == codes[1][0] == 3
    assert "scores.a" in codes[0][1] and codes[0][1] == codes[1][1]


def test_workers_must_be_positive(scored, tmp_path):
    _, _, src = scored
    code, out = _run(["close", src, "-o", tmp_path / "x.bridge", "--workers", 0])
    assert code != 0 and "--workers" in out


def test_workers_are_capped_at_the_cpu_count(scored, tmp_path, monkeypatch):
    """200 processes for 5 records was accepted; more workers than CPUs are lowered, with one line."""
    _, _, src = scored
    monkeypatch.setattr("bridgecli.runtime.pool.default_workers", lambda: 2)
    from bridgecli.runtime.pool import Pool as _Pool

    forks = []
    real = _Pool.__init__

    def counting(self, processes=None, *args, **kwargs):
        forks.append(processes)
        real(self, processes, *args, **kwargs)

    monkeypatch.setattr("bridgecli.runtime.pool.Pool.__init__", counting)
    runner = CliRunner()
    steps = (("select", src, "s.bridge"), ("close", tmp_path / "s.bridge", "c.bridge"),
             ("compact", tmp_path / "c.bridge", "rows.jsonl"))
    for step, inp, out in steps:
        res = runner.invoke(app, [step, str(inp), "-o", str(tmp_path / out), "--workers", "200"],
                            env={"BRIDGE_NO_PROGRESS": "1"})
        assert res.exit_code == 0, res.output
        notes = [line for line in res.stderr.splitlines() if "--workers" in line]
        assert notes == ["--workers 200 lowered to 2, the number of CPUs this process may use"], res.stderr
    assert forks == [2, 2, 2]
    one = runner.invoke(app, ["compact", str(tmp_path / "c.bridge"), "-o", str(tmp_path / "one.jsonl")])
    assert one.exit_code == 0 and (tmp_path / "one.jsonl").read_bytes() == (tmp_path / "rows.jsonl").read_bytes()
    quiet = runner.invoke(app, ["close", str(tmp_path / "s.bridge"), "-o", str(tmp_path / "q.bridge"), "--workers",
                                "2"], env={"BRIDGE_NO_PROGRESS": "1"})
    assert quiet.exit_code == 0 and "lowered" not in quiet.stderr


def test_workers_report_a_truncated_input_the_same(scored, tmp_path):
    _, _, src = scored
    cut = tmp_path / "cut.bridge"
    cut.write_bytes(src.read_bytes()[: src.stat().st_size * 2 // 3])
    got = [_run(["select", cut, "-o", tmp_path / f"s{w}.bridge", "--workers", w]) for w in (1, 2)]
    assert got[0][0] == got[1][0] == 3
    assert got[0][1] == got[1][1]
    assert not (tmp_path / "s2.bridge").exists()


def test_workers_end_quietly_under_the_cli_sigterm_handler(scored, tmp_path, capfd):
    """The pool ends its workers with SIGTERM; forked from the CLI they would inherit its handler (print
    "bridge: terminated", unwind through multiprocessing's exit handlers: a hang seen under load)."""
    import signal

    from bridgecli.cli.app import _terminated

    _, _, src = scored
    old = signal.signal(signal.SIGTERM, _terminated)
    try:
        for k in range(3):
            assert _run(["select", "-T", "4", src, "-o", tmp_path / f"s{k}.bridge", "--workers", 2])[0] == 0
    finally:
        signal.signal(signal.SIGTERM, old)
    assert "terminated" not in capfd.readouterr().err


# -- the compressed hand-off: workers get whole zstd frames; the parent reads on from any frame they cannot take


def _header(stage="scores"):
    from bridgecli.format.records import Header, ModelInfo

    return Header(stage=stage, producer="test", created="2026-01-01T00:00:00+00:00",
                  model=ModelInfo(source="test", fingerprint="sha256:0", tokenizer_fingerprint="sha256:0"))


def _framed(path, records, sizes, *, header=None, end=None):
    """A stream whose example frames hold ``sizes`` records each (the rest in one frame with the end record);
    ``records`` are Examples or already encoded records (to plant a bad one)."""
    from bridgecli.format.records import End
    from bridgecli.format.writer import StreamWriter, encode_record

    with open(path, "wb") as fh:
        w = StreamWriter(fh, header or _header(), records_per_frame=None)
        at = 0
        for size in sizes:
            for r in records[at : at + size]:
                w.write_encoded(r if isinstance(r, bytes) else encode_record(r))
            w.flush()
            at += size
        for r in records[at:]:
            w.write_encoded(r if isinstance(r, bytes) else encode_record(r))
        if end is None:
            w.close()
        else:
            w._zw.write(encode_record(End(count=end)))
            w.flush()
    return path


def _one_frame(path, records, header=None):
    """Header, examples and end record in one zstd frame (no writer of this project makes that)."""
    from bridgecli.format.records import End
    from bridgecli.format.spec import MAGIC, MAJOR, MINOR
    from bridgecli.format.writer import compress_frame, encode_record

    body = [encode_record(header or _header()), *map(encode_record, records), encode_record(End(count=len(records)))]
    path.write_bytes(PREAMBLE.pack(MAGIC, MAJOR, MINOR) + compress_frame(body))
    return path


def _bad_crc(ex):
    from bridgecli.format.spec import RECORD_PREFIX
    from bridgecli.format.writer import encode_record

    rec = encode_record(ex)
    length, crc = RECORD_PREFIX.unpack_from(rec)
    return RECORD_PREFIX.pack(length, crc ^ 1) + rec[RECORD_PREFIX.size:]


def _flip(path, at):
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x40
    path.write_bytes(bytes(raw))
    return path


def _second_frame_offset(path):
    """Where the stream's third frame starts, and where its second (the first after the header's)."""
    header, second = frame_lengths(path.read_bytes()[PREAMBLE.size:])[:2]
    head = PREAMBLE.size + header
    return head + second, head


def _streams(folder, exs):
    """Name -> a scored stream (framed many ways, some damaged), each made once."""
    from bridgecli.format.records import Header

    n = len(exs)
    out = {
        "frames of 128": _framed(folder / "f128.bridge", exs, [128]),
        "frames of 64, 100 and 64": _framed(folder / "f100.bridge", exs, [64, 100]),
        "frames of 20": _framed(folder / "f20.bridge", exs, [20] * 7),
        "one frame of examples": _framed(folder / "f1.bridge", exs, [n]),
        "header, examples and end in one frame": _one_frame(folder / "one.bridge", exs),
        "a bad checksum in a middle frame": _framed(
            folder / "crc.bridge", [*exs[:70], _bad_crc(exs[70]), *exs[71:]], [64, 64]),
        "a second header in a middle frame": _framed(
            folder / "hdr.bridge", [*exs[:66], _header(), *exs[66:]], [64, 64]),
        "an end record that miscounts": _framed(folder / "count.bridge", exs, [64, 64], end=n + 1),
        "an index out of range in a middle frame": _framed(
            folder / "idx.bridge", [*exs[:90], msgspec.structs.replace(exs[90], index=-5), *exs[91:]], [64, 64]),
    }
    two = _framed(folder / "two.bridge", exs, [64, 64])
    (folder / "cat.bridge").write_bytes(two.read_bytes() * 2)
    out["two streams concatenated"] = folder / "cat.bridge"
    (folder / "tail.bridge").write_bytes(two.read_bytes() + b"\0\0\0\0\0\0\0\0")
    out["bytes after the end"] = folder / "tail.bridge"
    (folder / "lone.bridge").write_bytes(two.read_bytes() + b"\x55")  # the first byte of a skippable frame's magic
    out["bytes after the end: one 0x55"] = folder / "lone.bridge"
    skippable = struct.pack("<II", 0x184D2A5F, 16) + bytes(16)
    (folder / "skip.bridge").write_bytes(two.read_bytes() + skippable[:-3])
    out["bytes after the end: a skippable frame cut short"] = folder / "skip.bridge"
    second, _ = _second_frame_offset(two)
    flipped = folder / "flip.bridge"
    flipped.write_bytes(two.read_bytes())
    out["a flipped byte inside a middle frame"] = _flip(flipped, (second + _second_frame_offset(two)[1]) // 2 + 9000)
    magic = folder / "magic.bridge"
    magic.write_bytes(two.read_bytes())
    out["a damaged frame magic"] = _flip(magic, second)
    cut = folder / "cut.bridge"
    cut.write_bytes(two.read_bytes()[: second + 3000])
    out["cut inside the second frame"] = cut
    assert isinstance(exs[0], msgspec.Struct) and not isinstance(exs[0], Header)
    return out


@pytest.fixture(scope="module")
def streams(scored, tmp_path_factory):
    _, exs, _ = scored
    return _streams(tmp_path_factory.mktemp("framed"), exs)


CASES = [
    "frames of 128", "frames of 64, 100 and 64", "frames of 20", "one frame of examples",
    "header, examples and end in one frame", "a bad checksum in a middle frame", "a second header in a middle frame",
    "an end record that miscounts", "an index out of range in a middle frame", "two streams concatenated",
    "bytes after the end", "bytes after the end: one 0x55", "bytes after the end: a skippable frame cut short",
    "a flipped byte inside a middle frame", "a damaged frame magic",
    "cut inside the second frame",
]


@pytest.mark.parametrize("via", ["file", "stdin"])
@pytest.mark.parametrize("case", CASES)
def test_workers_read_any_framing_and_damage_as_one_process(streams, tmp_path, case, via):
    """Whatever the input's frames hold, --workers gives one process's output bytes, or its error (same
    message, exit code, and no output file); from a file (the workers read the frames themselves) and from
    stdin (the parent hands them the bytes)."""
    src = streams[case]
    got = {}
    for w in (1, 2):
        out = tmp_path / f"s{w}.bridge"
        if via == "file":
            code, text = _run(["select", "-T", "4", src, "-o", out, "--workers", w])
        else:
            code, text = _run(["select", "-T", "4", "-", "-o", out, "--workers", w], input=src.read_bytes())
        got[w] = (code, text, _tail(out) if out.exists() else None)
    assert got[1] == got[2]
    damaged = case[0] == "a" or case[:3] in ("two", "byt", "cut")
    assert (got[1][0] != 0) == damaged, got[1][1]


def _cli(args, input=None, stdin=None):
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src"
    env = dict(os.environ, PYTHONPATH=str(src), BRIDGE_NO_PROGRESS="1")
    return subprocess.run([sys.executable, "-m", "bridgecli", *map(str, args)], input=input, stdin=stdin,
                          capture_output=True, env=env, timeout=120)


@pytest.mark.parametrize("case", ["an index out of range in a middle frame", "a bad checksum in a middle frame"])
def test_workers_leave_stdout_as_one_process_does_when_a_middle_frame_fails(streams, case):
    """On stdout a step holds its stream back until the first MiB (runtime/stream_output.py), so a run that fails
    before then leaves no valid-looking prefix: with one process and with two, the same error line, exit 3 and
    not a byte out."""
    got = [_cli(["select", "-T", "4", streams[case], "-o", "-", "--workers", w]) for w in (1, 2)]
    assert got[0].returncode == got[1].returncode == 3
    assert got[0].stderr == got[1].stderr
    assert b"incomplete" not in got[0].stderr
    assert got[0].stdout == got[1].stdout == b""


@pytest.mark.parametrize(("case", "parent_reads"), [
    (None, 150 - 128),  # frames of 64: the workers take two; the parent reads the last, with the end record
    ("frames of 128", 150 - 128),
    ("frames of 20", 150 - 20),  # a frame that is not whole batches: the parent reads on after it
    ("header, examples and end in one frame", 150),
])
def test_the_parent_reads_only_the_records_the_workers_cannot_take(scored, streams, tmp_path, monkeypatch, case,
                                                                   parent_reads):
    from bridgecli.format.reader import StreamReader

    read = []
    payloads = StreamReader.payloads

    def counted(self):
        for p in payloads(self):
            read.append(p)
            yield p

    monkeypatch.setattr(StreamReader, "payloads", counted)
    src = scored[2] if case is None else streams[case]
    assert _run(["select", "-T", "4", src, "-o", tmp_path / "s.bridge", "--workers", 2])[0] == 0
    assert len(read) == parent_reads


def test_workers_read_a_pipe(scored, tmp_path):
    _, _, src = scored
    ref = tmp_path / "ref.bridge"
    assert _run(["select", "-T", "4", src, "-o", ref])[0] == 0
    got = _cli(["select", "-T", "4", "-", "-o", "-", "--workers", "2"], input=src.read_bytes())
    assert got.returncode == 0, got.stderr
    assert _after_header_bytes(got.stdout) == _tail(ref)


@pytest.mark.parametrize("source", ["pipe", "file"])
def test_frame_size_finds_where_zstd_frames_end(tmp_path, source):
    """Raw, RLE and compressed blocks; with and without checksum and content size; empty frames. From a
    pipe the tape hands out the bytes; from a regular file, where they lie (past any bytes before the
    stream: stdin may start inside a file)."""
    import io

    from bridgecli.format.reader import _Tape

    rng = np.random.default_rng(0)
    parts = [b"", b"x", bytes(300_000), rng.bytes(200_000), b"abc" * 90_000, rng.bytes(5) + bytes(140_000)]
    frames = []
    for k, data in enumerate(parts):
        for checksum in (True, False):
            for size in (True, False):
                c = zstandard.ZstdCompressor(level=1 + 5 * (k % 2), write_checksum=checksum, write_content_size=size)
                frames.append(c.compress(data))
    blob = b"".join(frames)
    assert frame_lengths(blob) == [len(f) for f in frames]

    def tape_of(data):
        if source == "pipe":
            return _Tape(io.BytesIO(data))
        path = tmp_path / "blob"
        path.write_bytes(b"junk" + data)
        fh = open(path, "rb")
        fh.seek(4)
        return _Tape(fh)

    tape = tape_of(blob)
    got = []
    while (size := tape.frame_size(1 << 30)) is not None:
        frame = tape.take(size)
        got.append(frame if source == "pipe" else os.pread(tape.fd, size, frame))
    assert got == frames and tape.tell() == len(blob)
    # nothing: a frame over the limit, one cut short, a skippable frame, bytes that are no frame
    for data, most in ((frames[6], len(frames[6]) - 1), (frames[6][:-1], 1 << 30),
                       (b"\x50\x2a\x4d\x18" + bytes(8), 1 << 30), (b"\0" * 10, 1 << 30)):
        tape = tape_of(data)
        assert tape.frame_size(most) is None and tape.tell() == 0


def test_a_restarted_reader_reads_the_chunks_a_reader_from_the_start_reads(scored, tmp_path):
    """After handing out frames of a regular file, a restarted zstd reader is given the input in the very
    chunks a reader from the start is given (so zstd fails, if it does, while reading the same record)."""
    from bridgecli.format.reader import StreamReader

    _, _, src = scored
    raw = src.read_bytes()

    def chunks_of(reader, upto):
        seen, at = [], reader._tape.tell()
        while at < upto:
            chunk = reader._tape.read()
            seen.append((at, len(chunk)))
            at += len(chunk)
        return seen

    whole = StreamReader(open(src, "rb"))
    everything = chunks_of(whole, len(raw))
    frames = StreamReader(open(src, "rb"))
    handed = list(frames.frames(1 << 30))
    assert len(handed) == 3 and frames.fd is not None  # 150 examples: frames of 64, 64, and 22 with the end
    offset = handed[1][0]
    frames.restart(offset, 64)
    again = chunks_of(frames, len(raw))
    first = max(i for i, (at, _) in enumerate(everything) if at <= offset)
    start, size = everything[first]
    assert again == [(offset, start + size - offset), *everything[first + 1:]]


def _big_result(_):
    return bytes(4 << 20)


def test_the_pool_does_not_spin_while_results_wait():
    """multiprocessing.Pool's worker-handler thread also waits on the result pipe, and so spins while results
    wait there (0.3 s of CPU for these 240 MB on the 2-core host); the pool here does not."""
    import multiprocessing

    from bridgecli.runtime.pool import Pool as _Pool

    def cpu_of(tid):
        with open(f"/proc/self/task/{tid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    with _Pool(2, context=multiprocessing.get_context("fork")) as pool:
        for r in [pool.apply_async(_big_result, (k,)) for k in range(60)]:
            assert len(r.get()) == 4 << 20
        assert cpu_of(pool._worker_handler.native_id) < 0.05


def test_workers_read_stdin_redirected_from_a_file(scored, tmp_path):
    """stdin may be a regular file, positioned anywhere: the workers read its frames where they lie."""
    _, _, src = scored
    ref = tmp_path / "ref.bridge"
    assert _run(["select", "-T", "4", src, "-o", ref])[0] == 0
    shifted = tmp_path / "shifted"
    shifted.write_bytes(b"not the stream" + src.read_bytes())
    with open(shifted, "rb") as fh:
        fh.seek(len(b"not the stream"))
        got = _cli(["select", "-T", "4", "-", "-o", "-", "--workers", "2"], stdin=fh)
    assert got.returncode == 0, got.stderr
    assert _after_header_bytes(got.stdout) == _tail(ref)

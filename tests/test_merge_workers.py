"""merge_streams(..., workers=N): the output's frames compressed on N processes give the same bytes as one
process, for any framing and any split of the examples into shards, and the same errors after the same
output."""

from __future__ import annotations

import hashlib
import io
import sys
import types
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridgecli.errors import BridgeError, FormatError, UsageError
from bridgecli.runtime.merge import merge_streams
from bridgecli.format.reader import read_all
from bridgecli.format.records import Example, Header, ModelInfo, Step, Tokens
from bridgecli.format.spec import RECORDS_PER_FRAME
from bridgecli.format.writer import StreamWriter

pytestmark = pytest.mark.integration  # worker processes (a fork server), and `python -m bridgecli`

ROOT = Path(__file__).resolve().parents[1]


def _shard(path, indices, rank, shards, per_frame=None, extra=None, big=False):
    """A shard as a rank writes it: its examples in the order given, a frame every ``per_frame``; ``big``:
    with 8 kB of text that does not compress (zstd then writes part of a frame before it ends)."""
    params = {"shard": [rank, shards], **(extra or {})}
    header = Header(stage="tokens", producer="t", created="", model=ModelInfo("m", "f", "t"),
                    steps=[Step("score", "t", "", params)])
    with open(path, "wb") as fh:
        w = StreamWriter(fh, header, records_per_frame=per_frame)
        for i in indices:
            n = 2 + i % 7
            text = "".join(hashlib.sha256(b"%d-%d" % (i, j)).hexdigest() for j in range(128)) if big else ""
            w.write(Example(id=f"e{i}", index=i, text=f"text {i} " * n + text,
                            tokens=Tokens(input_ids=list(range(i, i + n)), kinds=bytes([1] * (n - 2) + [2, 3]),
                                          offsets=[0, 0] * n)))
        w.close()
    return path


def _shards(tmp_path, n, k, per_frame=None, tag=""):
    return [_shard(tmp_path / f"{tag}s{r}", range(r, n, k), r, k, per_frame) for r in range(k)]


def _merged(paths, out, **kw):
    """(count, bytes) of a merge, or (the error's type and text, None) when it fails (leaving no file)."""
    try:
        count = merge_streams(paths, out, **kw)
    except BridgeError as err:
        assert not out.exists()
        return (type(err), str(err)), None
    return count, out.read_bytes()


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("n,k", [(0, 1), (1, 1), (150, 1), (128, 2), (150, 3), (200, 4)])
def test_the_same_bytes_for_any_number_of_workers(tmp_path, n, k, validate):
    paths = _shards(tmp_path, n, k, per_frame=5)
    # None: the writer's own frames of RECORDS_PER_FRAME, the last one holding the end record; else
    # frames of `frame`, whole ones, a shorter last one, one frame, none whole
    for frame in (None, 1, 7, 50, n or 1, n + 3):
        ref = _merged(paths, tmp_path / "m1", frame=frame, validate=validate)
        assert ref[0] == n
        for workers in (2, 3):
            got = _merged(paths, tmp_path / f"m{workers}", frame=frame, validate=validate, workers=workers)
            assert got == ref, (frame, workers)
    header, exs = read_all(tmp_path / "m2")
    assert [e.index for e in exs] == list(range(n)) and header.steps[-1].params == {"shards": k}


def test_frames_fall_where_one_process_ends_them(tmp_path):
    """What the comparison above relies on: the frames of a merge are those of one process's writer."""
    paths = _shards(tmp_path, 2 * RECORDS_PER_FRAME + 5, 2)
    for frame, sizes in ((None, [1, RECORDS_PER_FRAME, RECORDS_PER_FRAME, 6]), (60, [1, 60, 60, 13, 1])):
        merge_streams(paths, tmp_path / "m", frame=frame, workers=2)
        data = (tmp_path / "m").read_bytes()[12:]
        records = []
        while data:
            d = zstandard.ZstdDecompressor().decompressobj()
            content = d.decompress(data)
            data = d.unused_data
            count, at = 0, 0
            while at < len(content):
                at += 8 + int.from_bytes(content[at:at + 4], "little")
                count += 1
            records.append(count)
        assert records == sizes  # header, the examples' frames, (the end record)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(owner=st.lists(st.integers(0, 3), max_size=90), frame=st.one_of(st.none(), st.integers(1, 40)),
       per_frame=st.one_of(st.none(), st.integers(1, 9)), workers=st.integers(2, 3), validate=st.booleans())
def test_any_split_into_shards_merges_as_one_process_does(tmp_path, owner, frame, per_frame, workers, validate):
    k = max(owner, default=0) + 1
    paths = [_shard(tmp_path / f"h{r}", [i for i, o in enumerate(owner) if o == r], r, k, per_frame)
             for r in range(k)]
    ref = _merged(paths, tmp_path / "r", frame=frame, validate=validate)
    assert ref[0] == len(owner)
    assert _merged(paths, tmp_path / "w", frame=frame, validate=validate, workers=workers) == ref


def _corrupt(path, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("validate", [False, True])
def test_errors_are_the_same_for_any_number_of_workers(tmp_path, validate):
    n = 3 * RECORDS_PER_FRAME + 10
    good = _shards(tmp_path, n, 2, per_frame=8, tag="g")
    size = good[1].stat().st_size
    bad = {
        "duplicate": [good[0], _shard(tmp_path / "dup", [1, 3, 150, 150], 1, 2)],
        "out of order": [good[0], _shard(tmp_path / "ord", [*range(1, 180, 2), 4], 1, 2)],
        "other run": [good[0], _shard(tmp_path / "run", [1], 1, 2, extra={"scorer": "other"})],
        "corrupt late": [good[0], _corrupt(_shard(tmp_path / "late", range(1, n, 2), 1, 2, 8), size - 40)],
        "corrupt early": [good[0], _corrupt(_shard(tmp_path / "early", range(1, n, 2), 1, 2, 8), 300)],
        "truncated": [good[0], tmp_path / "cut"],
    }
    (tmp_path / "cut").write_bytes(good[1].read_bytes()[: size // 2])
    for what, paths in bad.items():
        for frame in (None, 16):
            ref = _merged(paths, tmp_path / "x", frame=frame, validate=validate)
            assert ref[1] is None and issubclass(ref[0][0], FormatError), (what, ref)
            for workers in (2, 3):
                assert _merged(paths, tmp_path / "x", frame=frame, validate=validate, workers=workers) == ref, what


def test_what_reaches_stdout_before_an_error_is_the_same(tmp_path, monkeypatch):
    """Written to a pipe, the output stops at the same byte for any number of workers: the frames before
    the bad record, then what the writer had compressed of the next one."""
    good = [_shard(tmp_path / "g", range(0, 400, 2), 0, 2, 8, big=True)]
    late = _shard(tmp_path / "late", [*range(1, 360, 2), 4], 1, 2, big=True)

    def to_stdout(**kw):
        buffer = io.BytesIO()
        monkeypatch.setattr(sys, "stdout", types.SimpleNamespace(buffer=buffer, isatty=lambda: False))
        with pytest.raises(FormatError) as info:
            merge_streams([good[0], late], "-", **kw)
        return str(info.value), buffer.getvalue()

    for frame in (None, 7, 90):  # the bad record after 39, 2, 89 examples of a frame
        ref = to_stdout(frame=frame)
        assert "not in index order" in ref[0]
        d = zstandard.ZstdDecompressor().decompressobj()
        assert len(d.decompress(ref[1][12:])) < 1000 and len(d.unused_data) > 1000  # the header, frames
        assert to_stdout(frame=frame, workers=2) == ref
        assert to_stdout(frame=frame, workers=3, validate=False) == to_stdout(frame=frame, validate=False)


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_workers_must_be_a_positive_integer(tmp_path, workers):
    paths = _shards(tmp_path, 3, 1)
    with pytest.raises(UsageError, match="--workers must be an integer >= 1"):
        merge_streams(paths, tmp_path / "m", workers=workers)


def test_bridge_merge_workers_gives_the_same_file(tmp_path):
    import os
    import subprocess

    paths = _shards(tmp_path, 300, 3, per_frame=16)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    outs = []
    for workers in ("1", "3"):
        out = tmp_path / f"m{workers}"
        proc = subprocess.run([sys.executable, "-m", "bridgecli", "merge", *map(str, paths), "-o", str(out),
                               "--workers", workers], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert "merged 300 examples" in proc.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == _merged(paths, tmp_path / "ref")[1]


@pytest.mark.integration  # starts bench/scale/merge_scaling.py as a process of its own
def test_the_merge_benchmark_runs_and_finds_identical_bytes(tmp_path):
    import json
    import os
    import subprocess

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "scale" / "merge_scaling.py"), "--make", "300",
                           "--shards", "3", "--window", "32", "--workers", "1,2", "--json", str(tmp_path / "m.json")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "m.json").read_text())
    assert res["identical"] and res["examples"] == 300 and res["merged_bytes"] > 300 * 1000
    for mode in ("as_written", "validated"):
        for w in ("1", "2"):
            run = res["modes"][mode][w]
            assert run["identical_to_1"] and run["examples_per_s"] > 0 and run["wall_s"] > 0


def test_the_workers_read_the_shards_frames(tmp_path, monkeypatch):
    """Copying records as written, the workers decompress the shards' frames: this process reads only each
    shard's last frame itself (the one with the end record), and every frame of a damaged shard from the
    damaged one on."""
    from bridgecli.runtime import merge

    read_here = []

    def counted(reader):
        for item in real(reader):
            read_here.append((reader.name, item[0]))
            yield item

    paths = _shards(tmp_path, 200, 2, per_frame=8)  # frames of 8 records: 100 = 12 * 8 + 4
    ref = _merged(paths, tmp_path / "r", frame=16, validate=False)
    real = merge._payloads
    monkeypatch.setattr(merge, "_payloads", counted)
    assert _merged(paths, tmp_path / "m", frame=16, validate=False, workers=2) == ref
    assert sorted(i for _, i in read_here) == [*range(192, 200)]  # each shard's last 4, read with its end record
    late = _shard(tmp_path / "late", range(1, 200, 2), 1, 2, 8)
    _corrupt(late, late.stat().st_size * 2 // 3)
    monkeypatch.setattr(merge, "_payloads", real)
    ref = _merged([paths[0], late], tmp_path / "x", validate=False)
    read_here.clear()
    monkeypatch.setattr(merge, "_payloads", counted)
    assert _merged([paths[0], late], tmp_path / "x", validate=False, workers=2) == ref
    assert "late" in ref[0][1] and read_here and min(i for _, i in read_here) > 100  # from the damaged frame on


def test_bridge_merge_caps_workers_at_the_cpu_count(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from bridgecli.cli.app import app

    paths = _shards(tmp_path, 40, 2, per_frame=16)
    monkeypatch.setattr("bridgecli.runtime.pool.default_workers", lambda: 1)
    res = CliRunner().invoke(app, ["merge", *map(str, paths), "-o", str(tmp_path / "m"), "--workers", "200"],
                             env={"BRIDGE_NO_PROGRESS": "1"})
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines() == ["--workers 200 lowered to 1, the number of CPUs this process may use",
                                       "merged 40 examples"]
    assert (tmp_path / "m").read_bytes() == _merged(paths, tmp_path / "ref")[1]

"""`bridge score` past one machine: two torchrun launchers (``--nnodes 2``, c10d rendezvous on
localhost, gloo on CPU) stand for two nodes. With the output on a folder both see, the merged
stream equals one process's; with node-local output folders, every rank stops with one line
before any model loads.

The reference run and the warmup run in this process (one thread, like the ranks) to spare the
2-core CI machine two interpreter starts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from bridgecli.data.examples import DataOptions
from bridgecli.format.reader import read_all
from bridgecli.format.spec import PREAMBLE
from bridgecli.steps.score import ScoreOptions, run_score
from bridgecli.steps.warmup import WarmupOptions, run_warmup
from bridgecli.training.config import SFTConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples" / "data"
# one thread everywhere: the single process and the ranks then do the same arithmetic
ENV = {**os.environ, "BRIDGE_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
LIMIT, WINDOW = 11, 3


@pytest.fixture(scope="module")
def warmup(tmp_path_factory, tiny_model_dir):
    d = tmp_path_factory.mktemp("multinode") / "warmup"
    run_warmup(WarmupOptions(data=str(SAMPLE / "warm.jsonl"), val=str(SAMPLE / "val.jsonl"), out=d,
                             model=str(tiny_model_dir), device="cpu", data_opts=DataOptions(limit=6),
                             sft=SFTConfig(epochs=1, batch_size=4, grad_accum=1, max_steps=1)))
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def score_args(warmup: Path, out: str) -> list[str]:
    # --batch-size 1: every example is scored alone, so its numbers do not depend on which other
    # examples share its window (that differs between one process and a rank's shard)
    return ["score", str(SAMPLE / "train.jsonl"), "--from", str(warmup), "-o", out,
            "--limit", str(LIMIT), "--window", str(WINDOW), "--batch-size", "1"]


def two_nodes(warmup: Path, out: str, cwds: tuple[Path, Path]) -> list[subprocess.CompletedProcess]:
    """Two launchers of one node each, as on two machines, started together."""
    port = free_port()
    procs = []
    for node, cwd in enumerate(cwds):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}",
               "--rdzv-id", f"bridge-test-{port}", "-m", "bridgecli", *score_args(warmup, out)]
        procs.append(subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    done = []
    for p in procs:
        try:
            out_b, err_b = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out_b, err_b))
    return done


def split_header(path: Path) -> tuple[bytes, bytes]:
    """(the preamble and the header's zstd frame, every byte after them)."""
    import zstandard

    data = path.read_bytes()
    dobj = zstandard.ZstdDecompressor().decompressobj()
    dobj.decompress(data[PREAMBLE.size:])
    cut = len(data) - len(dobj.unused_data)
    return data[:cut], data[cut:]


@pytest.mark.integration  # two torchrun launchers
def test_two_nodes_on_a_shared_folder_give_one_process_stream(warmup, tmp_path):
    single = tmp_path / "single.bridge"  # what `bridge score` with score_args() writes
    run_score(ScoreOptions(data=str(SAMPLE / "train.jsonl"), out=str(single), run=warmup, device="cpu",
                           window=WINDOW, batch_size=1, data_opts=DataOptions(limit=LIMIT)))

    shared = tmp_path / "shared"  # the folder both "nodes" mount
    shared.mkdir()
    out = shared / "scores.bridge"
    node_dirs = (tmp_path / "node0", tmp_path / "node1")
    for d in node_dirs:
        d.mkdir()
    results = two_nodes(warmup, str(out), node_dirs)
    for r in results:
        assert r.returncode == 0, r.stderr.decode()[-3000:]
        assert r.stdout == b""
    assert sorted(p.name for p in shared.iterdir()) == ["scores.bridge"]  # shards and probes removed
    log = b"".join(r.stderr for r in results).decode()
    assert "merged 2 shards: 11 examples" in log

    # the examples: the same records, framed the same way, compressed to the same bytes
    h1, e1 = read_all(single)
    h2, e2 = read_all(out)
    assert [e.index for e in e2] == list(range(11))
    assert [msgspec.msgpack.encode(e) for e in e2] == [msgspec.msgpack.encode(e) for e in e1]
    assert split_header(out)[1] == split_header(single)[1]
    # the header differs only in its timestamps and in saying that 2 shards made it
    p1, p2 = dict(h1.steps[-1].params), dict(h2.steps[-1].params)
    assert p2.pop("shards") == 2 and "shards" not in p1 and "shard" not in p2
    assert p1 == p2
    assert (h1.stage, h1.model, h1.source, h1.producer) == (h2.stage, h2.model, h2.source, h2.producer)
    assert [(s.step, s.producer) for s in h1.steps] == [(s.step, s.producer) for s in h2.steps]


@pytest.mark.integration  # starts `python -m bridgecli` per rank
def test_node_local_output_folders_stop_before_scoring(warmup, tmp_path):
    # the same relative -o from two working folders: each "node" writes where the other cannot see.
    # The ranks get the environment torchrun gives them (two launchers are tested above)
    node_dirs = (tmp_path / "node0", tmp_path / "node1")
    port = free_port()
    procs = []
    for rank, d in enumerate(node_dirs):
        d.mkdir()
        env = {**ENV, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "GROUP_RANK": str(rank), "MASTER_ADDR": "localhost", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, "-m", "bridgecli", *score_args(warmup, "scores.bridge")],
                                      cwd=d, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = [p.communicate(timeout=180) for p in procs]
    results = [subprocess.CompletedProcess(p.args, p.returncode, *o) for p, o in zip(procs, outputs)]
    for r in results:
        err = r.stderr.decode()
        assert r.returncode != 0, err[-3000:]
        # each rank says it in one line
        lines = [ln for ln in err.splitlines() if ln.startswith("bridge score: error:")]
        assert len(lines) == 1 and "cannot see the files that rank 1" in lines[0], err[-3000:]
        assert r.returncode == 2
        assert "a folder every rank can see" in lines[0]
        assert "Traceback" not in err, err[-3000:]
        assert "scoring on" not in err  # stopped before the model loaded
    for d in node_dirs:
        assert list(d.iterdir()) == [], list(d.iterdir())  # no shard, no probe left behind


def test_resume_keeps_a_shard_finished_before_another_rank_stopped(tmp_path, monkeypatch):
    from bridgecli.errors import UsageError
    from bridgecli.format.records import Example, Header, ModelInfo, Step, Tokens
    from bridgecli.format.writer import open_writer
    from bridgecli.runtime.ranks import Dist
    from bridgecli.runtime.stream_output import StreamOutput

    def header(window):
        return Header(stage="scores", producer="t", created="then", model=ModelInfo("m", "f", "t"),
                      steps=[Step("score", "t", "then", {"window": window, "shard": [1, 2]})])

    out = tmp_path / "scores.bridge"

    def finished(rank: int, world: int, resume: bool, head) -> int | None:
        """What the output of rank ``rank`` of ``world`` finds (torchrun's environment)."""
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        return StreamOutput(out, resumable=True, resume=resume).finished_shard(head)

    rank1 = Dist(1, 2)
    assert finished(1, 2, True, header(3)) is None  # nothing written yet: score it
    with open_writer(rank1.shard_path(out), header(3)) as w:
        for i in (1, 3, 5):
            w.write(Example(id=str(i), index=i, text="", tokens=Tokens(input_ids=[1, 2], kinds=bytes([2, 3]),
                                                                      offsets=[0, 0, 0, 0])))
    now = msgspec.structs.replace(header(3), created="now")  # the rerun's timestamps differ
    assert finished(1, 2, True, now) == 3
    assert finished(1, 2, False, now) is None  # without --resume the shard is made again
    assert finished(0, 1, True, now) is None  # one process has no shards
    with pytest.raises(UsageError, match="other parameters"):
        finished(1, 2, True, header(4))
    Path(str(rank1.shard_path(out)) + ".partial").write_bytes(b"")  # a newer, unfinished attempt wins
    assert finished(1, 2, True, now) is None


def test_a_dead_peer_reads_as_one_short_line():
    from bridgecli.runtime.ranks import RankError, _collective

    def boom():
        raise RuntimeError("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
                           "by peer [127.0.0.1]:25009. This is typically caused by a remote worker crashing.")

    with pytest.raises(RankError) as info:
        _collective(boom)
    assert str(info.value) == ("another rank of this run stopped (Connection closed by peer [127.0.0.1]:25009) "
                               "(its own error, above or on its node, says why)")


def test_merging_records_as_written_matches_decoding_them(tmp_path):
    """Rank 0 merges its ranks' shards without decoding them (validate=False): the same bytes as the
    decoding merge, and the same refusals."""
    from bridgecli.errors import FormatError
    from bridgecli.runtime.merge import merge_streams
    from bridgecli.format.records import Example, Header, ModelInfo, Step, Tokens
    from bridgecli.format.writer import open_writer

    def shard(name, indices, rank):
        header = Header(stage="tokens", producer="t", created="", model=ModelInfo("m", "f", "t"),
                        steps=[Step("score", "t", "", {"shard": [rank, 2]})])
        with open_writer(tmp_path / name, header) as w:
            for i in indices:
                w.write(Example(id=f"e{i}", index=i, text=f"text {i}",
                                tokens=Tokens(input_ids=[1, 2], kinds=bytes([2, 3]), offsets=[0, 0, 0, 0])))
        return tmp_path / name

    a, b = shard("a", [0, 2, 4, 6, 8], 0), shard("b", [1, 3, 5, 7], 1)
    for frame in (None, 1, 3, 4, 9, 10):  # whole frames only, a shorter last one, one frame, none whole
        assert merge_streams([a, b], tmp_path / "v", frame=frame) == 9
        assert merge_streams([a, b], tmp_path / "r", frame=frame, validate=False) == 9
        assert (tmp_path / "v").read_bytes() == (tmp_path / "r").read_bytes()
    assert [e.index for e in read_all(tmp_path / "r")[1]] == list(range(9))
    for bad, match in ((shard("c", [1, 2], 1), "appears in two shards"), (shard("d", [3, 1], 1), "not in index order")):
        for validate in (True, False):
            with pytest.raises(FormatError, match=match):
                merge_streams([a, bad], tmp_path / "x", frame=2, validate=validate)
            assert not (tmp_path / "x").exists()


def test_the_run_reports_what_every_rank_left_out():
    from bridgecli.data.examples import Report
    from bridgecli.runtime.ranks import merge_reports

    ranks = [Report(read=3, too_long=["a"], max_length=10, excluded=1), Report(read=2, too_long=["b", "c"], max_length=10),
             Report(read=1, max_length=10, excluded=2)]
    total = merge_reports(ranks)
    assert (total.read, total.too_long, total.max_length, total.excluded) == (6, ["a", "b", "c"], 10, 3)
    assert total.lines() == ["left out 3 examples used by warmup", "skipped 3 examples longer than --max-length 10 (a, b, c)"]
    assert ranks[0].too_long == ["a"]  # the ranks' own reports are left as they were

"""Scoring at scale, on CPU: length bucketing, resume after kill -9, sharding across ranks with
gloo, merging shards, and the precision helpers."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.core.buckets import bucket
from bridgecli.errors import FormatError
from bridgecli.runtime.merge import merge_streams
from bridgecli.format.reader import read_all
from bridgecli.format.records import Example, Header, ModelInfo, Step, Tokens
from bridgecli.format.spec import PREAMBLE
from bridgecli.format.writer import open_writer

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples" / "data"
ENV = {**os.environ, "BRIDGE_NO_PROGRESS": "1"}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 300), max_size=60), st.integers(1, 2000), st.one_of(st.none(), st.integers(1, 8)))
def test_bucket_properties(lengths, max_tokens, max_rows):
    batches = bucket(lengths, max_tokens, max_rows)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    keys = [(lengths[i], i) for i in flat]
    assert keys == sorted(keys)  # length order, ties by index: deterministic
    for b in batches:
        if len(b) > 1:
            assert max(lengths[i] for i in b) * len(b) <= max_tokens
        if max_rows is not None:
            assert len(b) <= max_rows
    assert bucket(lengths, max_tokens, max_rows) == batches


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir, forked_bridge):
    """A warmup run of the tiny model (`bridge warmup` in a forked child: tests/forked_cli.py)."""
    d = tmp_path_factory.mktemp("scale")
    done = forked_bridge.run(["warmup", SAMPLE / "warm.jsonl", "--val", SAMPLE / "val.jsonl", "-o", d / "warmup",
                              "--model", tiny_model_dir, "--max-steps", "1", "--limit", "6"], env=ENV)
    assert done.returncode == 0, done.stderr.decode()
    return d


def score_args(run_dir, out, *extra):
    return ["score", str(SAMPLE / "train.jsonl"), "--from", str(run_dir / "warmup"), "-o", str(out), "--window", "2",
            "--max-tokens", "600", *extra]


@pytest.fixture(scope="module")
def full(run_dir, tmp_path_factory, forked_bridge):
    """(the uninterrupted score of the sample, its stderr): the reference of the resumed run and of the ranks."""
    out = tmp_path_factory.mktemp("full") / "full.bridge"
    done = forked_bridge.run(score_args(run_dir, out), env=ENV)
    assert done.returncode == 0, done.stderr.decode()
    return out, done.stderr.decode()


@pytest.fixture(scope="module")
def killed(run_dir, tmp_path_factory, forked_bridge):
    """A `bridge score` process killed with SIGKILL after four committed windows: its output path (only
    its partial file and index exist), for the tests to copy; skips when three runs all finished first."""
    out = tmp_path_factory.mktemp("killed") / "killed.bridge"
    idx = Path(str(out) + ".partial.idx")
    for attempt in range(3):
        proc = forked_bridge.start(score_args(run_dir, out), env=ENV)
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if idx.exists() and len(idx.read_text().splitlines()) >= 4:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
        proc.wait()
        if not out.exists():
            break
        out.unlink()  # finished before the kill landed: try again
    else:
        pytest.skip("the run finished before it could be killed three times")
    return out


def copy_of(killed: Path, folder: Path) -> Path:
    """The killed run's partial output and index copied into ``folder``: the output path there."""
    out = folder / killed.name
    for suffix in (".partial", ".partial.idx"):
        shutil.copyfile(f"{killed}{suffix}", f"{out}{suffix}")
    return out


def after_header(path: Path) -> bytes:
    """The file's bytes after the preamble and the header's zstd frame."""
    data = path.read_bytes()[PREAMBLE.size:]
    dobj = zstandard.ZstdDecompressor().decompressobj()
    dobj.decompress(data)
    return dobj.unused_data


@pytest.mark.integration  # starts warmup and score processes (run_dir, full, killed)
def test_resume_after_kill_is_byte_identical(full, killed, run_dir, tmp_path, forked_bridge):
    full, log = full
    # 24 windows: the loop's rate is also reported without the first (one-time work) window
    assert re.search(r"tokens/s; [\d,]+ tokens/s after the first window, which took [\d.]+ s\)", log), log

    out = copy_of(killed, tmp_path)
    partial, idx = Path(str(out) + ".partial"), Path(str(out) + ".partial.idx")
    assert partial.exists() and not out.exists()
    with open(partial, "ab") as fh:  # a frame torn by the crash
        fh.write(b"\x28\xb5\x2f\xfd garbage")
    proc = forked_bridge.run(score_args(run_dir, out, "--resume"), env=ENV)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "resuming after" in proc.stderr.decode()
    assert out.exists() and not partial.exists() and not idx.exists()
    assert after_header(out) == after_header(full)
    h1, e1 = read_all(out)
    h2, e2 = read_all(full)
    assert [e.id for e in e1] == [e.id for e in e2] and len(e1) == 48


@pytest.mark.integration  # starts warmup and score processes (run_dir, killed)
def test_resume_refuses_other_parameters(killed, run_dir, tmp_path, forked_bridge):
    out = copy_of(killed, tmp_path)
    partial = Path(str(out) + ".partial")
    before = partial.read_bytes()
    args = score_args(run_dir, out, "--resume")
    args[args.index("--window") + 1] = "3"
    res = forked_bridge.run(args, env=ENV)
    assert res.returncode == 2 and "other parameters" in res.stderr.decode()
    assert partial.read_bytes() == before  # nothing lost


@pytest.mark.integration  # torchrun with 2 processes
def test_two_ranks_with_gloo_match_one_process(run_dir, tmp_path, forked_bridge):
    single = tmp_path / "single.bridge"
    done = forked_bridge.run(score_args(run_dir, single, "--limit", "9"), env=ENV)
    assert done.returncode == 0, done.stderr.decode()
    sharded = tmp_path / "sharded.bridge"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "bridgecli", *score_args(run_dir, sharded, "--limit", "9")]
    proc = subprocess.run(cmd, env=ENV, capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert not list(tmp_path.glob("sharded.bridge.shard-*"))
    h1, e1 = read_all(single)
    h2, e2 = read_all(sharded)
    assert [e.index for e in e2] == [e.index for e in e1] == list(range(9))
    assert h2.steps[-1].params["shards"] == 2 and "shard" not in h2.steps[-1].params
    for a, b in zip(e1, e2):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.scores.a.numpy(), b.scores.a.numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(a.scores.A.numpy(), b.scores.A.numpy(), atol=2e-3)


def _stream(path, indices, params=None):
    header = Header(stage="tokens", producer="t", created="", model=ModelInfo("m", "f", "t"),
                    steps=[Step("score", "t", "", params or {})])
    with open_writer(path, header) as w:
        for i in indices:
            w.write(Example(id=str(i), index=i, text="", tokens=Tokens(input_ids=[1, 2], kinds=bytes([2, 3]), offsets=[0, 0, 0, 0])))


def test_merge_interleaves_and_checks(tmp_path):
    _stream(tmp_path / "a", [0, 2, 4], {"shard": [0, 2]})
    _stream(tmp_path / "b", [1, 3], {"shard": [1, 2]})
    assert merge_streams([tmp_path / "a", tmp_path / "b"], tmp_path / "m") == 5
    h, exs = read_all(tmp_path / "m")
    assert [e.index for e in exs] == [0, 1, 2, 3, 4] and h.steps[0].params == {"shards": 2}
    _stream(tmp_path / "c", [1, 2], {"shard": [1, 2]})
    with pytest.raises(FormatError, match="appears in two shards"):
        merge_streams([tmp_path / "a", tmp_path / "c"], tmp_path / "m2")
    _stream(tmp_path / "d", [1], {"shard": [1, 2], "scorer": "other"})
    with pytest.raises(FormatError, match="different run"):
        merge_streams([tmp_path / "a", tmp_path / "d"], tmp_path / "m3")


def test_token_ce_tangent_matches_forward_ad():
    import torch.autograd.forward_ad as fwAD
    import torch.nn.functional as F

    from bridgecli.modeling.scoring import token_ce_with_tangent

    torch.manual_seed(0)
    h = torch.randn(50, 16, dtype=torch.float64)
    dh = torch.randn_like(h)
    W = torch.randn(300, 16, dtype=torch.float64) * 3
    b = torch.randn(300, dtype=torch.float64)
    t = torch.randint(0, 300, (50,))
    loss, dl = token_ce_with_tangent(h, dh, W, b, t, chunk=7)
    with fwAD.dual_level():
        p, tt = fwAD.unpack_dual(F.cross_entropy(fwAD.make_dual(h, dh) @ W.T + b, t, reduction="none"))
    torch.testing.assert_close(loss, p)
    torch.testing.assert_close(dl, tt)


@pytest.mark.integration  # scores a model in several precisions (seconds)
def test_tail_dtype_and_prefix_autocast_options(tokenizer):
    from bridgecli.modeling.params import tail_parameters
    from bridgecli.modeling.scoring import BridgeScorer, ScoringContext, _cast_floats
    from tiny import record_examples as examples
    from tiny import tiny_llama_config, tiny_model

    model = tiny_model(tiny_llama_config(len(tokenizer)), dtype=torch.float64)
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 4).items()}
    exs = examples(tokenizer)[:2]
    ref = BridgeScorer(ScoringContext(model=model, tokenizer=tokenizer, direction=v)).score(exs)
    low = BridgeScorer(ScoringContext(model=model, tokenizer=tokenizer, direction=v,
                                      options={"tail_dtype": torch.float32})).score(exs)
    for r, s in zip(ref, low):
        np.testing.assert_allclose(s.a.numpy(), r.a.numpy(), rtol=1e-3, atol=1e-6)
    cast = _cast_floats((torch.ones(2), {"x": [torch.ones(1, dtype=torch.float64), torch.ones(1, dtype=torch.long)]}),
                        torch.float16)
    assert cast[0].dtype == torch.float16 and cast[1]["x"][0].dtype == torch.float16
    assert cast[1]["x"][1].dtype == torch.long


def test_a_second_writer_of_the_same_partial_output_is_refused(tmp_path):
    """Two runs writing one output (say two `bridge score --resume`): the second stops with a clear
    error, and the first one's partial file is left as it was (not truncated by the attempt)."""
    from bridgecli.errors import UsageError
    from bridgecli.runtime.resumable import ResumableOutput

    header = Header(stage="tokens", producer="t", created="", model=ModelInfo("m", "f", "t"), steps=[])
    out = tmp_path / "x.bridge"
    first = ResumableOutput(out)
    writer, _ = first.open(header, resume=False)
    writer.write(Example(id="0", index=0, text="", tokens=Tokens(input_ids=[1, 2], kinds=bytes([2, 3]), offsets=[0, 0, 0, 0])))
    first.commit(writer, 1)
    size = first.partial.stat().st_size
    for resume in (False, True):
        with pytest.raises(UsageError, match="another process is writing this partial output") as err:
            ResumableOutput(out).open(header, resume=resume)
        assert str(first.partial) in str(err.value)
        assert first.partial.stat().st_size == size
    first.finish(writer)
    _, exs = read_all(out)
    assert [e.id for e in exs] == ["0"]
    again = ResumableOutput(out)  # the lock went with the first writer's file
    w2, _ = again.open(header, resume=False)
    again.finish(w2)

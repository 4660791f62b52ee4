"""``--workers N`` on select, close and compact: the same output bytes and the same errors as one process."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest
import zstandard
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.format.spec import PREAMBLE

N = 150  # two full frames of 64 records and a partial one


def _tail(path) -> bytes:
    """The stream's bytes after its header frame (the header holds timestamps)."""
    d = zstandard.ZstdDecompressor().decompressobj()
    d.decompress(path.read_bytes()[PREAMBLE.size:])
    return d.unused_data


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


def _run(args):
    res = CliRunner().invoke(app, [str(a) for a in args])
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


def test_workers_report_the_same_error(scored, tmp_path):
    from test_show import write_stream

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

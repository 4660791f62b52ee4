"""``select --method importance``: a sampled response side with inverse-probability loss weights, carried
through the stream, ``compact`` and ``train``'s loss."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.core.sampling import inclusion_probabilities
from bridgecli.core.select import Surrogate, select
from bridgecli.format.reader import open_reader
from bridgecli.training.batching import collate
from bridgecli.training.rows import IGNORE, Row
from bridgecli.training.sft import token_loss_sum


def _scores(tmp_path, tokenizer):
    from test_show import synthetic, write_stream

    exs = [msgspec.structs.replace(e, selection=None, closure=None) for e in synthetic(tokenizer, closure=False)]
    return exs, write_stream(tmp_path / "scores.bridge", exs, "scores")


def _select(tmp_path, src, *options):
    out = tmp_path / "imp.bridge"
    args = ["select", str(src), "-o", str(out), "--method", "importance", "--rho-p", "0.5", "--rho-r", "0.5"]
    for o in options:
        args += ["--option", o]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    with open_reader(str(out)) as reader:
        return out, list(reader)


def test_importance_keeps_bridges_prompt_side_and_weights_its_draw(tmp_path, tokenizer):
    exs, src = _scores(tmp_path, tokenizer)
    _, got = _select(tmp_path, src, "floor=0.3")
    for ex, new in zip(exs, got):
        s = ex.scores
        sur = Surrogate.from_scores(s.a.numpy(), s.c.numpy(), s.A.numpy())
        b_p, b_r = new.selection.b_p, new.selection.b_r
        ref = select(sur, b_p, b_r, "bridge", 4)
        prompt = ex.tokens.prompt_positions()
        resp = ex.tokens.response_positions()
        assert new.selection.prompt_keep == prompt[ref.prompt].tolist()
        assert len(new.selection.response_keep) == min(b_r, len(resp))
        pi = inclusion_probabilities(np.abs(ref.response_scores), min(b_r, len(resp)), 0.3)
        drawn = np.searchsorted(resp, new.selection.response_keep)
        w = new.selection.response_weights.numpy("float64")
        assert np.allclose(w, (min(b_r, len(resp)) / len(resp)) / pi[drawn], rtol=1e-6)


@pytest.mark.parametrize("by", ["loss", "pos"])
def test_importance_tilts_by_the_loss_or_the_positive_score_with_every_prompt_token_kept(tmp_path, tokenizer, by):
    """``by=loss`` (the grid's importance-loss-resp row) draws with probabilities from the scoring checkpoint's
    per-token loss, ``by=pos`` from max(Delta_r, 0); at ``--rho-p 1`` every prompt token stays. An ``--option``
    key given twice is refused (which value was meant?), not the last one taken."""
    exs, src = _scores(tmp_path, tokenizer)
    out = tmp_path / "imp.bridge"
    r = CliRunner().invoke(app, ["select", str(src), "-o", str(out), "--method", "importance", "--rho-p", "1",
                                 "--rho-r", "0.5", "--option", f"by={by}", "--option", "floor=0.5"])
    assert r.exit_code == 0, r.output
    twice = CliRunner().invoke(app, ["select", str(src), "-o", str(tmp_path / "x.bridge"), "--method", "importance",
                                     "--option", "by=abs", "--option", f"by={by}"])
    assert twice.exit_code == 2 and "--option gives by twice ('abs' and" in twice.output
    with open_reader(str(out)) as reader:
        got = list(reader)
    for ex, new in zip(exs, got):
        s = ex.scores
        resp = ex.tokens.response_positions()
        assert new.selection.prompt_keep == ex.tokens.prompt_positions().tolist()
        b = min(new.selection.b_r, len(resp))
        if by == "loss":
            tilt = s.loss.numpy("float64")
        else:
            sur = Surrogate.from_scores(s.a.numpy(), s.c.numpy(), s.A.numpy())
            ref = select(sur, new.selection.b_p, new.selection.b_r, "bridge", 4)
            tilt = np.maximum(ref.response_scores, 0.0)
        pi = inclusion_probabilities(tilt, b, 0.5)
        drawn = np.searchsorted(resp, new.selection.response_keep)
        assert len(drawn) == b
        w = new.selection.response_weights.numpy("float64")
        assert np.allclose(w, (b / len(resp)) / pi[drawn], rtol=1e-6)
    if by == "loss":  # a stream without the per-token loss is refused in one line naming the record and field
        from test_show import write_stream

        bare = [msgspec.structs.replace(e, scores=msgspec.structs.replace(e.scores, loss=None)) for e in exs]
        nol = write_stream(tmp_path / "noloss.bridge", bare, "scores")
        r = CliRunner().invoke(app, ["select", str(nol), "-o", str(tmp_path / "x.bridge"), "--method",
                                     "importance", "--option", "by=loss"])
        assert r.exit_code != 0 and f"noloss.bridge, record {bare[0].index}, field 'scores.loss'" in r.output
        assert not (tmp_path / "x.bridge").exists()


def test_importance_draw_follows_the_seed_and_weights_can_be_off(tmp_path, tokenizer):
    _, src = _scores(tmp_path, tokenizer)
    _, a = _select(tmp_path, src, "seed=1")
    _, b = _select(tmp_path, src, "seed=1")
    _, c = _select(tmp_path, src, "seed=2", "weights=none")
    assert [e.selection.response_keep for e in a] == [e.selection.response_keep for e in b]
    assert all(e.selection.response_weights is None for e in c)
    # floor=1 is a uniform draw: every weight 1
    _, u = _select(tmp_path, src, "floor=1")
    assert all(np.allclose(e.selection.response_weights.numpy(), 1.0) for e in u)


@pytest.mark.parametrize("bad", ["floor=1.5", "weights=half", "by=size", "seed=-1", "rounds2=3"])
def test_importance_options_are_checked(tmp_path, tokenizer, bad):
    _, src = _scores(tmp_path, tokenizer)
    r = CliRunner().invoke(app, ["select", str(src), "-o", str(tmp_path / "x.bridge"), "--method", "importance",
                                 "--option", bad])
    assert r.exit_code == 2, r.output
    assert not (tmp_path / "x.bridge").exists()


def test_compact_writes_loss_weights_and_refuses_presets_without_them(tmp_path, tokenizer):
    _, src = _scores(tmp_path, tokenizer)
    sel, got = _select(tmp_path, src)
    run = CliRunner()
    rows = tmp_path / "rows.jsonl"
    r = run.invoke(app, ["compact", str(sel), "-o", str(rows)])
    assert r.exit_code == 0, r.output
    assert "loss_weights" in r.output
    for line, ex in zip(rows.read_text().splitlines(), got):
        rec = json.loads(line)
        weights, labels = rec["loss_weights"], rec["labels"]
        assert len(weights) == len(labels) == len(rec["input_ids"])
        kept = dict(zip(ex.selection.response_keep, ex.selection.response_weights.numpy().tolist()))
        supervised_w = sorted(w for w, y in zip(weights, labels) if y != IGNORE)
        expected = sorted([float(f"{w:.6g}") for w in kept.values()] + [1.0])  # + the EOS
        assert supervised_w == pytest.approx(expected)
    bad = run.invoke(app, ["compact", str(sel), "-o", str(tmp_path / "ax.jsonl"), "--columns", "axolotl"])
    assert bad.exit_code == 2 and "loss weights" in bad.output
    assert not (tmp_path / "ax.jsonl").exists()


@pytest.mark.parametrize("packing", [False, True])
def test_weighted_loss_is_the_weighted_sum_of_token_losses(tiny_model_dir, packing):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    g = torch.Generator().manual_seed(0)
    rows = []
    for k, n in enumerate((7, 5, 9)):
        ids = torch.randint(3, 60, (n,), generator=g).tolist()
        labels = [IGNORE] * 2 + ids[2:]
        weights = [0.0] * 2 + (torch.rand(n - 2, generator=g) * 3).tolist()
        rows.append(Row(f"r{k}", ids, labels, weights if k != 1 else None))  # row 1: unweighted (all 1)
    mb = collate([rows] if packing else [[r] for r in rows], pad_id=0, packing=packing)
    got = token_loss_sum(model, mb)
    want = 0.0
    for r in rows:
        logits = model(input_ids=torch.tensor([r.input_ids])).logits[0, :-1]
        ce = F.cross_entropy(logits, torch.tensor(r.input_ids[1:]), reduction="none")
        w = torch.tensor(r.weights[1:] if r.weights is not None else [1.0] * (len(r.input_ids) - 1))
        mask = torch.tensor([y != IGNORE for y in r.labels[1:]])
        want = want + (ce * w * mask).sum()
    assert got.item() == pytest.approx(want.item(), rel=1e-4)


def test_train_reads_loss_weights_and_refuses_bad_ones(tmp_path, tokenizer):
    from bridgecli.errors import InputError
    from bridgecli.steps.train import read_rows

    _, src = _scores(tmp_path, tokenizer)
    sel, _ = _select(tmp_path, src)
    rows_file = tmp_path / "rows.jsonl"
    assert CliRunner().invoke(app, ["compact", str(sel), "-o", str(rows_file)]).exit_code == 0
    rows = read_rows(rows_file, None)
    recs = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert [r.weights for r in rows] == [rec["loss_weights"] for rec in recs]
    for bad in ([1.0], ["x"] * len(recs[0]["input_ids"]), [-1.0] * len(recs[0]["input_ids"]), [True] * len(recs[0]["input_ids"])):
        broken = tmp_path / "bad.jsonl"
        broken.write_text(json.dumps({**recs[0], "loss_weights": bad}) + "\n")
        with pytest.raises(InputError, match="loss_weights"):
            read_rows(broken, None)

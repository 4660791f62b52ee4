"""Training rows, the loss normalisation (Z_r) under gradient accumulation, schedules, direction v."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bridgecli.format.records import Tokens
from bridgecli.modeling import direction
from bridgecli.modeling.params import tail_parameters
from bridgecli.training.rows import IGNORE, Row, compact_row, full_response_row
from bridgecli.training.sft import SFTConfig, accumulate, cosine_lr, step_plan, train

from tiny import tiny_llama_config, tiny_model

VOCAB = 97


def rand_rows(n=5, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        length = int(rng.integers(6, 20))
        ids = rng.integers(1, VOCAB, size=length).tolist()
        labels = [t if (k > 2 and rng.random() < 0.6) else IGNORE for k, t in enumerate(ids)]
        labels[-1] = ids[-1]
        rows.append(Row(str(i), ids, labels))
    return rows


def grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_accumulation_does_not_change_normalisation():
    rows = rand_rows()
    model = tiny_model(tiny_llama_config(VOCAB, layers=2), dtype=torch.float64)
    accumulate(model, [rows], pad_id=0)
    together = grads(model).clone()
    model.zero_grad()
    accumulate(model, [[r] for r in rows], pad_id=0)
    one_by_one = grads(model).clone()
    model.zero_grad()
    accumulate(model, [rows[:2], rows[2:]], pad_id=0)
    split = grads(model).clone()
    torch.testing.assert_close(together, one_by_one)
    torch.testing.assert_close(together, split)

    # and it is the token-level mean over the whole step, not a mean of per-row means
    model.zero_grad()
    total = sum(r.supervised for r in rows)
    loss = 0
    for r in rows:
        logits = model(input_ids=torch.tensor([r.input_ids])).logits[0, :-1]
        loss = loss + F.cross_entropy(logits, torch.tensor(r.labels[1:]), ignore_index=IGNORE, reduction="sum")
    (loss / total).backward()
    torch.testing.assert_close(together, grads(model))
    model.zero_grad()
    per_row = 0
    for r in rows:
        logits = model(input_ids=torch.tensor([r.input_ids])).logits[0, :-1]
        per_row = per_row + F.cross_entropy(logits, torch.tensor(r.labels[1:]), ignore_index=IGNORE)
    (per_row / len(rows)).backward()
    assert not torch.allclose(together, grads(model))


def test_step_plan_and_schedule():
    rows = rand_rows(10)
    cfg = SFTConfig(epochs=2, batch_size=3, grad_accum=2, seed=1)
    plan = step_plan(rows, cfg)
    flat = [i for step in plan for mb in step for i in mb]
    assert len(flat) == 20 and sorted(flat) == sorted(list(range(10)) * 2)
    assert all(len(mb) <= 3 for step in plan for mb in step) and all(len(step) <= 2 for step in plan)
    assert step_plan(rows, cfg) == plan  # seeded
    assert len(step_plan(rows, SFTConfig(epochs=0.5, batch_size=1, grad_accum=1))) == 5
    lrs = [cosine_lr(s, 100, 1.0, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0) and lrs[-1] < 0.01
    assert all(b <= a + 1e-12 for a, b in zip(lrs[9:], lrs[10:]))


def test_train_lowers_loss_on_repeated_data():
    rows = rand_rows(4)
    model = tiny_model(tiny_llama_config(VOCAB, layers=2))
    cfg = SFTConfig(epochs=30, lr=3e-3, batch_size=4, grad_accum=1, warmup_ratio=0.0)
    hist = train(model, rows, cfg, pad_id=0)
    assert hist[-1]["loss"] < 0.7 * hist[0]["loss"]
    assert all(h["tokens"] == sum(r.supervised for r in rows) for h in hist)


def tokens(kinds: str):
    code = {"T": 0, "P": 1, "R": 2, "E": 3}
    ks = [code[c] for c in kinds]
    return Tokens(input_ids=list(range(10, 10 + len(ks))), kinds=bytes(ks), offsets=[0, 0] * len(ks))


def test_compact_row():
    t = tokens("TPPPPTRRRRE")
    row = compact_row("x", t, prompt_keep=[1, 3], supervise=[7, 9])
    assert row.input_ids == [10, 11, 13, 15, 16, 17, 18, 19, 20]
    assert row.labels == [IGNORE] * 5 + [17, IGNORE, 19, 20]
    full = full_response_row("x", t)
    assert full.labels == [IGNORE] * 6 + [16, 17, 18, 19, 20]
    assert full.supervised == 5 and row.supervised == 3


def test_direction_formula_and_validation_gradient():
    g_t = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([0.0])}
    g_a = {"a": torch.tensor([0.0, 0.0]), "b": torch.tensor([2.0])}
    v, meta = direction.combine(g_t, g_a, lam=0.2)
    torch.testing.assert_close(v["a"], torch.tensor([0.8 * 0.6, 0.8 * 0.8]))
    torch.testing.assert_close(v["b"], torch.tensor([0.2]))
    assert meta["g_target_norm"] == pytest.approx(5.0) and meta["g_anchor_norm"] == pytest.approx(2.0)

    rows = rand_rows(3)
    model = tiny_model(tiny_llama_config(VOCAB, layers=3), dtype=torch.float64)
    names = list(tail_parameters(model, 2))
    g, loss, ntok = direction.validation_gradient(model, rows, names, pad_id=0, batch_size=2)
    assert ntok == sum(r.supervised for r in rows)
    assert all(p.grad is None for p in model.parameters())  # left clean
    assert all(p.requires_grad for p in model.parameters())
    # reference: plain autograd of the token-mean loss
    params = dict(model.named_parameters())
    total = 0
    for r in rows:
        logits = model(input_ids=torch.tensor([r.input_ids])).logits[0, :-1]
        total = total + F.cross_entropy(logits, torch.tensor(r.labels[1:]), ignore_index=IGNORE, reduction="sum")
    ref = torch.autograd.grad(total / ntok, [params[n] for n in names])
    for n, r in zip(names, ref):
        torch.testing.assert_close(g[n], r)
    assert loss == pytest.approx(float(total.detach() / ntok))


def test_direction_save_load(tmp_path):
    v = {"model.layers.1.mlp.up_proj.weight": torch.randn(3, 2)}
    direction.save(direction.Direction(v, {"lambda": 0.2, "layers": 4}), tmp_path)
    got = direction.load(tmp_path)
    torch.testing.assert_close(got.v["model.layers.1.mlp.up_proj.weight"], v["model.layers.1.mlp.up_proj.weight"])
    assert got.meta == {"lambda": 0.2, "layers": 4}

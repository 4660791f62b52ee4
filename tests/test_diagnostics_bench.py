"""bench/diagnostics/aj_check.py and supervision_compare.py (issue 28): their pure parts and the cached
tail objective, on tiny models."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.core.closure import project
from tiny import tiny_llama_config, tiny_model

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def _load(name):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "diagnostics" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_fine_classes_of_a_gsm8k_response():
    sc = _load("supervision_compare")
    text = "She sold 48/2 = <<48/2=24>>24 clips.\n#### 72"
    pieces = ["She", " sold", " 48", "/", "2", " =", " <<", "48", "/2", "=", "24", ">>", "24", " clips", ".", "\n",
              "####", " 72"]
    assert "".join(pieces) == text
    spans, at = [], 0
    for p in pieces:
        spans.append((at, at + len(p)))
        at += len(p)
    got = dict(zip(pieces, sc.fine_classes(text, spans)))  # for the pieces that occur once
    classes = sc.fine_classes(text, spans)
    assert classes[0] == "words" and classes[1] == "words"
    assert classes[2] == "digits" and classes[3] == "operators" and classes[5] == "operators"
    assert classes[6:12] == ["calc"] * 6  # " <<" overlaps the calculation
    assert classes[12] == "digits"  # the result after >> is text, not the calculation
    assert got[" clips"] == "words" and got["."] == "space/punct" and got["\n"] == "newline"
    assert classes[-2:] == ["answer", "answer"]


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=8),
    data=st.data(),
)
def test_unspent_causes_against_the_knapsack(sizes, data):
    """On the exact knapsack's own output the causes split the unspent budget exactly, 'q<=0' / 'no fit'
    mean what they say, and 'other' occurs only where a unit's value is lost in the float sum."""
    sc = _load("supervision_compare")
    n = sum(sizes)
    scores = np.array(data.draw(st.lists(st.floats(-2, 2), min_size=n, max_size=n)), dtype=np.float64)
    b_r = data.draw(st.integers(0, n))
    cuts = np.cumsum([0, *sizes])
    units = [np.arange(a, b) for a, b in zip(cuts[:-1], cuts[1:])]
    proj = project(units, scores, b_r, 0.0)
    q = np.array([scores[u].sum() for u in units])
    bounds = np.array([[a, b] for a, b in zip(cuts[:-1], cuts[1:])])
    out = sc.unspent_causes(bounds, proj.chosen.tolist(), q, b_r, len(proj.supervise))
    assert out["unspent"] == b_r - len(proj.supervise)
    assert out["q<=0"] + out["no fit"] + out["other"] == out["unspent"]
    missed = [k for k in range(len(units)) if k not in set(proj.chosen.tolist()) and q[k] > 0]
    if out["other"]:
        total = q[proj.chosen].sum()
        assert all(q[k] <= 1e-15 * total for k in missed if sizes[k] <= out["unspent"])
    if out["q<=0"]:
        assert not missed
    if out["no fit"]:
        assert all(sizes[k] > out["unspent"] for k in missed)


def test_compare_recovers_a_known_slope():
    aj = _load("aj_check")
    rng = np.random.default_rng(0)
    pred = rng.normal(size=50)
    out = aj.compare(2.0 * pred, pred)
    assert out["slope_through_origin"] == pytest.approx(2.0)
    assert out["pearson"] == pytest.approx(1.0) and out["sign_agreement"] == 1.0
    flipped = aj.compare(-pred, pred)
    assert flipped["sign_agreement"] == 0.0 and flipped["slope_ols"] == pytest.approx(-1.0)


def test_float64_norms_compute_in_float64_and_restore():
    aj = _load("aj_check")
    model = tiny_model(tiny_llama_config(64, layers=2, hidden=16, heads=2, kv_heads=1))
    norm = model.model.layers[0].input_layernorm
    torch.manual_seed(0)
    x = torch.randn(3, 16, dtype=torch.float64) * 1e3 + 1.0
    hf = norm(x)  # computes in float32, casts back
    exact = norm.weight.double() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))
    with aj.float64_norms([model.model.layers[0]]) as skipped:
        inside = norm(x)
    assert skipped == []
    assert torch.allclose(inside, exact, rtol=1e-14, atol=0)
    assert not torch.allclose(hf, exact, rtol=1e-12, atol=0)  # the HF path does round to float32
    assert "forward" not in norm.__dict__ and torch.equal(norm(x), hf)


def test_cached_tail_objective_is_the_warmups(tokenizer):
    """The D_val loss through the cached tail equals a full forward, and its gradient over the tail
    is the warm-up's g_target (bridgecli.training.direction.validation_gradient)."""
    aj = _load("aj_check")
    from bridgecli.data.shapes import Pair
    from bridgecli.data.tokenize import tokenize_pair
    from bridgecli.training.direction import validation_gradient
    from bridgecli.modeling.params import tail_parameters
    from bridgecli.modeling.tail import Tail
    from bridgecli.training.rows import full_response_row
    from tiny import RECORDS

    model = tiny_model(tiny_llama_config(len(tokenizer), layers=4, hidden=32), seed=3)
    rows = []
    for k, rec in enumerate(RECORDS):
        pair = Pair(id=str(k), messages=({"role": "user", "content": rec["question"]},), response=rec["answer"],
                    shape="question/answer")
        tok = tokenize_pair(tokenizer, pair)
        rows.append(full_response_row(str(k), tok.tokens))
    names = list(tail_parameters(model, 2))
    g_ref, loss_ref, _ = validation_gradient(model, rows, names, pad_id=tokenizer.pad_token_id, batch_size=2)
    tail = Tail(model, [2, 3])
    head = model.get_output_embeddings()
    obj = aj.ValObjective(aj.TailModel(tail, head.weight.detach(), None), rows, tokenizer.pad_token_id, "cpu", 2)
    theta = {i: {k: p.detach() for k, p in model.model.layers[i].named_parameters()} for i in (2, 3)}
    assert obj.loss(theta, torch.float32) == pytest.approx(obj.full_forward(model), rel=1e-6)
    assert obj.full_forward(model) == pytest.approx(loss_ref, rel=1e-6)
    loss, g = obj.grad(aj.pmap(lambda t: t.double(), theta), torch.float64)
    assert loss == pytest.approx(loss_ref, rel=1e-5)
    for i in (2, 3):
        for k, t in g[i].items():
            ref = g_ref[f"model.layers.{i}.{k}"].double()
            assert torch.allclose(t, ref, rtol=1e-3, atol=1e-6 * float(ref.abs().max())), k
    # the halves' token means, weighted by their token counts, make up the whole set's (in float64
    # throughout: the RMSNorms too)
    theta64 = aj.pmap(lambda t: t.double(), theta)
    z = [r.supervised for r in rows]
    with aj.float64_norms([model.model.layers[i] for i in (2, 3)] + [tail.norm]):
        _, g = obj.grad(theta64, torch.float64)
        _, g0 = obj.grad(theta64, torch.float64, [0])
        _, g12 = obj.grad(theta64, torch.float64, [1, 2])
    for i in (2, 3):
        for k, t in g[i].items():
            both = (z[0] * g0[i][k] + (z[1] + z[2]) * g12[i][k]) / sum(z)
            assert torch.allclose(both, t, rtol=1e-10, atol=1e-12 * float(t.abs().max())), k


def test_r_squared_of_group_means():
    sc = _load("supervision_compare")
    g = np.array([7, 7, 9, 9])
    assert sc.r_squared(np.array([1.0, 1.0, 3.0, 3.0]), g) == pytest.approx(1.0)
    assert sc.r_squared(np.array([1.0, 3.0, 1.0, 3.0]), g) == pytest.approx(0.0)
    assert sc.r_squared(np.array([0.0, 2.0, 2.0, 4.0]), g) == pytest.approx(0.5)
    assert sc.r_squared(np.ones(4), g) is None

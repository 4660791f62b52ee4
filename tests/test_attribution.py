"""The ``atp`` prompt scorer (key-gate attribution through the JVP): the softmax identity behind the
key gate, the reverse pass against finite differences of the gate, the estimate against exact
removal effects on tiny float64 models, and selection invariants with an interaction matrix."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bridgecli.analysis.exact import ExactScores, exact_base_scorer
from bridgecli.core.budgets import budget
from bridgecli.core.select import Surrogate, alternate, independent
from bridgecli.errors import UsageError
from bridgecli.modeling.attention import GATE_EPS
from bridgecli.modeling.attribution import AttributionScorer, chunk_ids, spread
from bridgecli.modeling.params import tail_parameters
from bridgecli.modeling.scoring import ScoringContext

from tiny import record_examples as examples
from tiny import tiny_llama_config, tiny_model


def test_gate_gradient_is_the_exact_softmax_change_of_hiding_a_key():
    """For one attention row, d/db_i of sum_k G_k softmax(s + b / (1 - p))_k at b = 0 equals minus
    sum_k G_k (p'_k - p_k), p' the row with key i hidden (p'_k = p_k / (1 - p_i), p'_i = 0)."""
    torch.manual_seed(0)
    s = torch.randn(7, dtype=torch.float64) * 3
    G = torch.randn(7, dtype=torch.float64)
    p = torch.softmax(s, 0)
    b = torch.zeros(7, dtype=torch.float64, requires_grad=True)
    M = (G * torch.softmax(s + b / (1 - p).clamp_min(GATE_EPS), 0)).sum()
    (grad,) = torch.autograd.grad(M, b)
    for i in range(7):
        hidden = s.clone()
        hidden[i] = float("-inf")
        change = (G * (torch.softmax(hidden, 0) - p)).sum()
        assert grad[i].item() == pytest.approx(-change.item(), rel=1e-9, abs=1e-12)


@pytest.fixture(scope="module")
def setup(tokenizer):
    def build(init: float):
        cfg = tiny_llama_config(len(tokenizer))
        cfg.initializer_range = init
        model = tiny_model(cfg, dtype=torch.float64)
        torch.manual_seed(1)
        v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 4).items()}
        return model, v

    return build, examples(tokenizer)


def atp(model, tokenizer, v, chunks):
    ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v, attention_layers=3,
                         options={"scorer_options": {"chunks": chunks}})
    return AttributionScorer(ctx)


@pytest.fixture(scope="module")
def per_token(setup, tokenizer):
    """init -> (the per-token ``atp`` scorer of a fresh ``build(init)`` model, its scores of the examples):
    each init scored once in the module (the slowest pass here; two tests take the init-0.02 scores)."""
    build, exs = setup

    @functools.cache
    def get(init: float) -> tuple:
        model, v = build(init)
        scorer = atp(model, tokenizer, v, 10_000)
        return scorer, scorer.score(exs)

    return get


def sum_a(scorer, batch, bias, log_gate=None, math_layers=None) -> float:
    """sum_j a_j in float64 with the key-gate bias ``bias`` ([1, L]) on every gated layer, at the
    gated state ``log_gate`` (the scorer's own forward, no grad)."""
    import torch.autograd.forward_ad as fwAD

    from bridgecli.modeling.attention import Routing, key_gate, routing

    layers = frozenset(scorer.gate_layers) if math_layers is None else math_layers
    r = Routing(math_layers=layers, capture_layers=frozenset(), right_padded=True)
    with torch.no_grad(), key_gate({layer: bias for layer in scorer.gate_layers}, None, log_gate), routing(r):
        hidden, calls = scorer.tail.prefix(batch.input_ids, batch.attention_mask)
        with fwAD.dual_level():
            dual = {k: {n: fwAD.make_dual(p, scorer.tangents[k][n]) for n, p in ps.items()}
                    for k, ps in scorer.primals.items()}
            a = fwAD.unpack_dual(scorer._losses(dual, hidden, calls, batch.flat_rows())).tangent
    return float(a.sum())


def assert_effects_match_gate_differences(scorer, ex, which, math_layers=None) -> None:
    """The reverse pass's group effect of each prompt key ``which(n_prompt)`` against central
    differences of M = sum_j a_j in that key's gate bias (on the scorer's gated layers)."""
    from bridgecli.modeling.score_batch import make_batch

    batch = make_batch([ex], scorer.pad_id)
    (effects,) = scorer.group_effects(batch, [chunk_ids(len(batch.resp[0]), 1)])
    prompt = ex.tokens.prompt_positions()
    L = len(ex.tokens.input_ids)

    def M(i: int, eps: float) -> float:
        """sum_j a_j with key i's gate bias at eps."""
        bias = torch.zeros(1, L, dtype=torch.float64)
        bias[0, int(prompt[i])] = eps
        return sum_a(scorer, batch, bias, math_layers=math_layers)

    h = 1e-3  # HF's RMSNorm runs in float32 even in a float64 model: a smaller step is rounding noise
    for i in which(len(prompt)):
        fd = (M(i, h) - M(i, -h)) / (2 * h)
        assert effects[0, i] == pytest.approx(fd, rel=1e-2, abs=1e-6)  # float32 norms: 1% is rounding, a missed term is more


@pytest.mark.integration  # the model fixture and exact removals (seconds)
def test_reverse_pass_matches_finite_differences_of_the_gate(setup, tokenizer):
    """Group effects (the reverse pass through the JVP) against central differences of
    M = sum_j a_j in the key-gate bias of one key, applied at every layer."""
    build, exs = setup
    model, v = build(0.02)
    scorer = atp(model, tokenizer, v, 1)
    assert_effects_match_gate_differences(scorer, exs[0], lambda n: (0, n // 2, n - 1))


@pytest.mark.integration  # the model fixture and exact removals (seconds)
@pytest.mark.parametrize("init", [0.002, 0.02])
def test_per_token_estimate_tracks_exact_removal_effects(setup, per_token, init):
    """Per-token groups give B[j, i] ~ a_j(P) - a_j(P with i hidden). Near-linear weights (small init):
    equal up to second-order terms; the default init: still close, rank for rank."""
    from bridgecli.analysis.metrics import spearman

    _, exs = setup
    scorer, scores = per_token(init)
    ref = ExactScores(exact_base_scorer(scorer.ctx), perturb="mask", batch_size=64)
    for ex, sc in zip(exs, scores, strict=True):
        _, beta = ref.prompt_matrix(ex)
        B = sc.B.numpy().astype(np.float64)
        assert B.shape == beta.shape
        scale = np.abs(beta).max()
        assert scale > 0
        if init < 0.01:
            np.testing.assert_allclose(B, beta, atol=0.01 * scale)
        assert np.corrcoef(B.ravel(), beta.ravel())[0, 1] > 0.99
        assert spearman(B.sum(0), beta.sum(0)) > 0.95


@pytest.mark.integration  # the model fixture and exact removals (seconds)
def test_one_group_splits_its_effect_and_keeps_bridge_scores(setup, per_token, tokenizer):
    """chunks=1: each prompt column of B sums to the full-response estimate (per-token groups, on a model
    built alike); a, c, A are the bridge scorer's."""
    from bridgecli.modeling.scoring import BridgeScorer

    build, exs = setup
    model, v = build(0.02)
    one = atp(model, tokenizer, v, 1).score(exs)
    base = BridgeScorer(ScoringContext(model=model, tokenizer=tokenizer, direction=v, attention_layers=3)).score(exs)
    for o, p, b in zip(one, per_token(0.02)[1], base, strict=True):
        np.testing.assert_allclose(o.B.numpy().sum(0), p.B.numpy().sum(0), rtol=1e-5, atol=1e-6)  # float32 storage
        for field in ("a", "c", "A"):
            np.testing.assert_allclose(getattr(o, field).numpy(), getattr(b, field).numpy(), rtol=1e-5, atol=1e-7)
        assert o.scorer == "atp"


@pytest.mark.integration  # the model fixture (seconds)
def test_scorer_options_are_checked(setup, tokenizer):
    build, _ = setup
    model, v = build(0.02)
    for bad in ({"chunks": "0"}, {"chunks": "x"}, {"rounds": "2"}):
        ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v, options={"scorer_options": bad})
        with pytest.raises(UsageError):
            AttributionScorer(ctx)
    from bridgecli.modeling.scoring import BridgeScorer

    with pytest.raises(UsageError, match="unknown option 'chunks'"):  # the bridge scorer takes none
        BridgeScorer(ScoringContext(model=model, tokenizer=tokenizer, direction=v,
                                    options={"scorer_options": {"chunks": "4"}}))


@given(n=st.integers(0, 9), k=st.integers(1, 12))
def test_chunk_ids_are_contiguous_and_balanced(n, k):
    g = chunk_ids(n, k)
    assert len(g) == n
    if n:
        assert g[0] == 0 and np.all(np.diff(g) >= 0) and np.all(np.diff(g) <= 1)
        sizes = np.bincount(g)
        assert sizes.max() - sizes.min() <= 1 and len(sizes) == min(n, k)


@settings(max_examples=60)
@given(data=st.data(), n=st.integers(1, 6), m=st.integers(1, 6), k=st.integers(1, 6))
def test_spread_preserves_group_sums(data, n, m, k):
    floats = st.floats(-5, 5, allow_nan=False)
    a = data.draw(hnp.arrays(np.float64, n, elements=floats))
    A = data.draw(hnp.arrays(np.float64, (n, m), elements=st.floats(0, 1)))
    groups = chunk_ids(n, k)
    effects = data.draw(hnp.arrays(np.float64, (int(groups.max()) + 1, m), elements=floats))
    B = spread(effects, groups, a, A)
    for g in range(effects.shape[0]):
        np.testing.assert_allclose(B[groups == g].sum(0), effects[g], atol=1e-9)


@settings(max_examples=80)
@given(data=st.data(), n=st.integers(0, 6), m=st.integers(0, 6), rounds=st.integers(1, 4))
def test_selection_with_an_interaction_matrix_keeps_its_invariants(data, n, m, rounds):
    """With B in place of A x a: budgets hold, U_sur never decreases, results are deterministic, and
    Delta_r(j | S_p) = a_j - sum_{i not in S_p} B[j, i]."""
    floats = st.floats(-3, 3, allow_nan=False).map(lambda x: round(x, 3))
    a = data.draw(hnp.arrays(np.float64, n, elements=floats))
    B = data.draw(hnp.arrays(np.float64, (n, m), elements=floats))
    rho = data.draw(st.sampled_from([0.25, 0.5, 0.75, 1.0]))
    b_p, b_r = budget(rho, m), budget(rho, n)
    sur = Surrogate.from_interactions(a, B)
    res = alternate(sur, b_p, b_r, rounds)
    assert len(res.prompt) == b_p and len(res.response) == b_r
    assert all(y >= x - 1e-9 for x, y in zip(res.u_sur, res.u_sur[1:]))
    again = alternate(Surrogate.from_interactions(a, B), b_p, b_r, rounds)
    assert np.array_equal(res.prompt, again.prompt) and np.array_equal(res.response, again.response)
    dropped = np.setdiff1d(np.arange(m), res.prompt)
    np.testing.assert_allclose(res.response_scores, a - B[:, dropped].sum(axis=1), atol=1e-9)
    ind = independent(sur, b_p, b_r)
    np.testing.assert_allclose(sur.delta_p(np.arange(n)), B.sum(axis=0), atol=1e-9)
    assert len(ind.prompt) == b_p


# --------------------------------------------------------------------------- integrated gradients (ig=K)


def atp_opts(model, tokenizer, v, **opts):
    ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v, attention_layers=3,
                         options={"scorer_options": {k: str(x) for k, x in opts.items()}})
    return AttributionScorer(ctx)


def one_prompt_token(ex, keep: int):
    """``ex`` with every eligible prompt token but the ``keep``-th turned into template: the joint
    path of ``ig`` is then the single-removal path of that token."""
    import msgspec

    from bridgecli.format import spec

    kinds = bytearray(ex.tokens.kinds)
    for k, pos in enumerate(ex.tokens.prompt_positions()):
        if k != keep:
            kinds[int(pos)] = spec.TEMPLATE
    return msgspec.structs.replace(ex, tokens=msgspec.structs.replace(ex.tokens, kinds=bytes(kinds)))


@pytest.mark.integration  # the model fixture and exact removals (seconds)
def test_ig_path_converges_to_the_exact_single_removal(setup, tokenizer):
    """One eligible prompt token, depth 1 (the whole path from kept to hidden): the midpoint rule's
    error against the exact removal effect falls with K (O(1/K^2)) and is small at K = 16, where the
    one-pass estimate (ig off) is off by far more."""
    build, exs = setup
    model, v = build(0.02)
    ex = one_prompt_token(exs[0], 3)
    base = atp_opts(model, tokenizer, v)
    _, beta = ExactScores(exact_base_scorer(base.ctx), perturb="mask", batch_size=64).prompt_matrix(ex)
    assert beta.shape[1] == 1
    exact = beta.sum(0)  # the whole response's effect: one group
    errs = {}
    for K in (1, 4, 16):
        (sc,) = atp_opts(model, tokenizer, v, ig=K, ig_depth=1).score([ex])
        errs[K] = np.abs(sc.B.numpy().astype(np.float64).sum(0) - exact).max()
    (plain,) = base.score([ex])
    err_plain = np.abs(plain.B.numpy().astype(np.float64).sum(0) - exact).max()
    scale = np.abs(exact).max()
    assert errs[16] < errs[4] < errs[1]
    assert errs[16] < 0.02 * scale
    assert errs[16] < 0.2 * err_plain


@pytest.mark.integration  # the model fixture and exact removals (seconds)
@pytest.mark.parametrize("depth", [0.5, 1.0])
def test_ig_path_is_exact_where_the_jump_is_first_order(setup, tokenizer, depth):
    """Near-linear weights (small init), one eligible prompt token per example: IG to depth h, then the
    key-gate jump from there, equals the exact removal effect of every response group. (With many
    prompt keys the joint path is not the single-removal path: partially hiding every prompt key
    renormalises each softmax row, which is first order even in a linear model; see the module doc.)"""
    build, exs = setup
    model, v = build(0.002)
    scorer = atp_opts(model, tokenizer, v, chunks=4, ig=4, ig_depth=depth)
    ref = ExactScores(exact_base_scorer(scorer.ctx), perturb="mask", batch_size=64)
    one = [one_prompt_token(exs[0], 2)]
    for ex, sc in zip(one, scorer.score(one)):
        _, beta = ref.prompt_matrix(ex)
        groups = chunk_ids(beta.shape[0], 4)
        est = np.stack([sc.B.numpy().astype(np.float64)[groups == g].sum(0) for g in range(4)])
        exact = np.stack([beta[groups == g].sum(0) for g in range(4)])
        np.testing.assert_allclose(est, exact, atol=0.01 * np.abs(exact).max())


@pytest.mark.integration  # the model fixture and finite differences (seconds)
def test_gated_gradients_match_finite_differences_along_the_path(setup, tokenizer):
    """At a gated state g = 1 - t h of every prompt key: the plain-bias gradient is g dM/dg_i (central
    differences of log g_i) and the removal-bias gradient is dM/db_i (central differences of the
    key-gate bias at that state)."""

    from bridgecli.modeling.score_batch import make_batch

    build, exs = setup
    model, v = build(0.02)
    scorer = atp_opts(model, tokenizer, v, ig=2)
    ex = exs[1]
    batch = make_batch([ex], scorer.pad_id)
    groups = [chunk_ids(len(batch.resp[0]), 1)]
    state = scorer._state(batch, 0.6)
    removal, plain = scorer.gated_grads(batch, groups, state, plain=True)
    prompt = ex.tokens.prompt_positions()
    L = len(ex.tokens.input_ids)

    def M(pos: int, eps: float, which: str) -> float:
        bias = torch.zeros(1, L, dtype=torch.float64)
        log_gate = state.clone()
        if which == "gate":
            log_gate[0, pos] += eps
        else:
            bias[0, pos] = eps
        return sum_a(scorer, batch, bias, log_gate)

    h = 1e-3
    for i in (0, len(prompt) // 2, len(prompt) - 1):
        pos = int(prompt[i])
        fd_gate = (M(pos, h, "gate") - M(pos, -h, "gate")) / (2 * h)
        fd_bias = (M(pos, h, "bias") - M(pos, -h, "bias")) / (2 * h)
        assert plain[0, 0, pos] == pytest.approx(fd_gate, rel=1e-2, abs=1e-6)
        assert removal[0, 0, pos] == pytest.approx(fd_bias, rel=1e-2, abs=1e-6)


@pytest.mark.integration  # the model fixture (seconds)
def test_ig_options_are_checked_and_leave_the_default_unchanged(setup, tokenizer):
    build, exs = setup
    model, v = build(0.02)
    for bad in ({"ig": "0"}, {"ig": "x"}, {"ig": "2", "ig_depth": "0"}, {"ig": "2", "ig_depth": "1.5"},
                {"ig": "2", "ig_rule": "nope"}, {"ig_depth": "0.5"}):
        with pytest.raises(UsageError):
            atp_opts(model, tokenizer, v, **bad)
    plain = atp(model, tokenizer, v, 1).score(exs)
    again = atp_opts(model, tokenizer, v, chunks=1).score(exs)
    for p, q in zip(plain, again):
        assert np.array_equal(p.B.numpy(), q.B.numpy())


@pytest.mark.integration  # the model fixture (seconds)
def test_selection_with_the_ig_estimate_keeps_its_invariants(setup, tokenizer):
    """B from ig=2 on the tiny model: budgets hold, U_sur never decreases, the result is deterministic."""
    build, exs = setup
    model, v = build(0.02)
    for sc in atp_opts(model, tokenizer, v, ig=2, chunks=2).score(exs):
        a, B = sc.a.numpy().astype(np.float64), sc.B.numpy().astype(np.float64)
        n, m = B.shape
        b_p, b_r = budget(0.75, m), budget(0.75, n)
        res = alternate(Surrogate.from_interactions(a, B), b_p, b_r, 4)
        assert len(res.prompt) == b_p and len(res.response) == b_r
        assert all(y >= x - 1e-9 for x, y in zip(res.u_sur, res.u_sur[1:]))
        again = alternate(Surrogate.from_interactions(a, B), b_p, b_r, 4)
        assert np.array_equal(res.prompt, again.prompt) and np.array_equal(res.response, again.response)


@pytest.mark.integration  # the model fixture (seconds)
def test_ig_avg_rule_is_the_key_gate_estimate_at_the_joint_states(setup, tokenizer):
    """ig_rule=avg, K = 1, depth 1: the key-gate removal estimate at the one joint state g = 1/2."""
    from bridgecli.modeling.score_batch import make_batch

    build, exs = setup
    model, v = build(0.02)
    scorer = atp_opts(model, tokenizer, v, ig=1, ig_rule="avg")
    assert scorer.ig_depth == 1.0
    batch = make_batch(exs[:2], scorer.pad_id)
    groups = [chunk_ids(len(r), 1) for r in batch.resp]
    removal, _ = scorer.gated_grads(batch, groups, scorer._state(batch, 0.5))
    for b, eff in enumerate(scorer.group_effects(batch, groups)):
        np.testing.assert_array_equal(eff, removal[b, :1][:, batch.prompt[b]].astype(np.float64))


@pytest.mark.integration  # the model fixture and finite differences (seconds)
@pytest.mark.parametrize("k", [2, 5])
def test_gating_the_final_layers_only_matches_finite_differences(setup, tokenizer, k):
    """layers=k: the reverse pass gives dM/db for a key-gate bias on the final k blocks only (k = 2
    leaves two of the four tail blocks ungated; k = 5 reaches into the prefix)."""
    build, exs = setup
    model, v = build(0.02)
    scorer = atp_opts(model, tokenizer, v, layers=k)
    n_layers = len(scorer.tail.blocks)
    assert scorer.gate_layers == list(range(n_layers - k, n_layers))
    assert_effects_match_gate_differences(scorer, exs[1], lambda n: (0, n - 1), math_layers=frozenset(range(n_layers)))


@pytest.mark.integration  # the model fixture (seconds)
def test_layers_option_is_checked_and_all_layers_is_the_default(setup, tokenizer):
    build, exs = setup
    model, v = build(0.02)
    n_layers = len(atp(model, tokenizer, v, 1).tail.blocks)
    for bad in ("0", str(n_layers + 1), "x"):
        with pytest.raises(UsageError, match="layers"):
            atp_opts(model, tokenizer, v, layers=bad)
    plain = atp(model, tokenizer, v, 1).score(exs[:2])
    every = atp_opts(model, tokenizer, v, layers=n_layers).score(exs[:2])
    fewer = atp_opts(model, tokenizer, v, layers=2).score(exs[:2])
    for p, q, r in zip(plain, every, fewer):
        assert np.array_equal(p.B.numpy(), q.B.numpy())
        assert not np.allclose(p.B.numpy(), r.B.numpy())


@pytest.mark.integration  # every scorer on a tiny model (seconds)
@pytest.mark.parametrize("name, options", [
    ("exact", {}), ("atp", {}), ("atp", {"layers": "2"}), ("atp", {"ig": "2"}), ("atp", {"fast": "1", "layers": "2"}),
])
def test_no_scorer_backpropagates_through_fused_attention(tokenizer, monkeypatch, name, options):
    """`bridge score` leaves cuDNN's attention allowed from 1,024 tokens (speed). That is safe only because no scorer
    runs a backward through scaled_dot_product_attention, where cuDNN's kernel gave NaN gradients for masked bf16
    shapes (modeling/sdpa_backends.py): exact and atp differentiate only through the attention they run by hand, and
    no input of their scaled_dot_product_attention calls requires grad."""
    import torch.nn.functional as F

    from bridgecli.modeling.scoring import ExactScorer

    calls: list[bool] = []  # whether the call is on a backward path
    real = F.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        calls.append(torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    model = tiny_model(tiny_llama_config(len(tokenizer), layers=4, hidden=16, heads=2, kv_heads=1))
    torch.manual_seed(1)
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 2).items()}
    ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v, attention_layers=3,
                         options={"scorer_options": options})
    scores = (ExactScorer if name == "exact" else AttributionScorer)(ctx).score(examples(tokenizer))
    assert len(scores) == 3 and all(np.isfinite(s.a.numpy()).all() for s in scores)
    assert not any(calls), calls
    if name == "exact" or options.get("layers"):  # the layers before the differentiated ones do run it
        assert calls

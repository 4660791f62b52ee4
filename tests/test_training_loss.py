"""The loss of a micro-batch without the logits of every supervised position at once (issue 41: a
135M warmup peaked at 7 GB on CPU): the chunked head equals the plain cross-entropy, per-token weights
included, in value and in every gradient, for each architecture it is used for."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from bridgecli.training import loss as loss_mod
from bridgecli.training.batching import collate
from bridgecli.training.loss import PLAIN_HEAD, LinearCrossEntropy, plain_head, token_loss_sum, weighted_ce
from bridgecli.training.rows import IGNORE, Row

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

VOCAB = 97


def plain(hidden, weight, target, tw):
    return weighted_ce(hidden @ weight.t(), target, tw)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 30), rows=st.integers(1, 40), weighted=st.booleans(), seed=st.integers(0, 2**16))
def test_chunked_head_equals_the_plain_cross_entropy(n, rows, weighted, seed):
    """Value and both gradients, float64, for every chunk size (one row, uneven chunks, one chunk)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, 8, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(VOCAB, 8, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, VOCAB, (n,), generator=g)
    tw = torch.rand(n, generator=g, dtype=torch.float64) * 3 if weighted else None
    ours = LinearCrossEntropy.apply(hidden, weight, target, tw, rows, (True, True))
    (gh, gw) = torch.autograd.grad(ours * 0.7, (hidden, weight))
    ref = plain(hidden, weight, target, tw)
    (rh, rw) = torch.autograd.grad(ref * 0.7, (hidden, weight))
    assert ours.dtype == torch.float64  # a float64 model keeps float64 (half precision: float32)
    torch.testing.assert_close(ours.double(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gh, rh, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(gw, rw, rtol=1e-10, atol=1e-10)


def test_it_computes_only_the_gradients_asked_for_and_refuses_others():
    hidden = torch.randn(5, 8, requires_grad=True)
    weight = torch.randn(VOCAB, 8)
    target = torch.randint(0, VOCAB, (5,))
    with torch.no_grad():
        value = loss_mod.linear_cross_entropy(hidden, weight, target)
    torch.testing.assert_close(value, plain(hidden, weight, target, None).detach())
    (gh,) = torch.autograd.grad(loss_mod.linear_cross_entropy(hidden, weight, target), (hidden,))  # weight: none made
    (rh,) = torch.autograd.grad(plain(hidden, weight, target, None), (hidden,))
    torch.testing.assert_close(gh, rh)
    with pytest.raises(RuntimeError, match="not asked for this gradient"):
        LinearCrossEntropy.apply(hidden, weight, target, None, 2, (False, False)).backward()


def _config(model_type: str):
    from transformers import AutoConfig

    extra = {"pad_token_id": 0} if model_type == "phi3" else {}
    return AutoConfig.for_model(
        model_type, vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, **extra,
    )


def _model(model_type: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(_config(model_type), attn_implementation="sdpa").double()


def _rows(weighted: bool) -> list[Row]:
    g = torch.Generator().manual_seed(1)
    rows = []
    for i, n in enumerate((9, 14, 6, 11)):
        ids = torch.randint(1, VOCAB, (n,), generator=g).tolist()
        labels = [IGNORE] * 3 + ids[3:]
        weights = [0.0] * 3 + torch.rand(n - 3, generator=g).mul(2).tolist() if weighted else None
        rows.append(Row(f"r{i}", ids, labels, weights=weights))
    return rows


@pytest.mark.parametrize("model_type", sorted(PLAIN_HEAD))
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("packing", [False, True])
def test_token_loss_sum_through_the_chunked_head_equals_the_plain_loss(model_type, weighted, packing, monkeypatch):
    """Against the model's own head on the supervised positions: the loss, and the gradient of every
    parameter (the tied head/embedding weight included); the head is back in place after."""
    model = _model(model_type)
    head = model.get_output_embeddings()
    assert plain_head(model) is head and head.weight is model.get_input_embeddings().weight  # tied
    rows = _rows(weighted)
    mb = collate([rows] if packing else [[r] for r in rows], 0, packing=packing)
    monkeypatch.setattr(loss_mod, "CHUNK_ELEMENTS", VOCAB * 5)  # chunks of 5 positions
    ours = token_loss_sum(model, mb)
    ours.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert model.get_output_embeddings() is head
    model.zero_grad()
    monkeypatch.setattr(loss_mod, "plain_head", lambda m: None)  # the head's own path
    ref = token_loss_sum(model, mb)
    ref.backward()
    torch.testing.assert_close(ours.double(), ref.double(), rtol=1e-6, atol=1e-6)
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-9, atol=1e-9, msg=n)
    if weighted:  # the weights matter: the unweighted loss differs
        mb.target_weight = None
        assert float(token_loss_sum(model, mb).detach()) != pytest.approx(float(ref.detach()), rel=1e-3)


class _LargestLogits(TorchDispatchMode):
    """The most elements of any tensor with the vocabulary as its last dimension that an op made."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() > 1 and VOCAB in t.shape[-1:] and t.numel() != VOCAB * 32:
                self.largest = max(self.largest, t.numel())  # (the head's weight and its views left out)
        return out


def test_no_logits_of_every_supervised_position_at_once(monkeypatch):
    """Forward and backward make no vocabulary-wide tensor larger than one chunk (the head's weight and its
    gradient, vocabulary x hidden, aside); the plain path makes one of every supervised position."""
    model = _model("llama")
    rows = _rows(False)
    mb = collate([rows], 0, packing=True)
    n = int(mb.keep.sum())
    monkeypatch.setattr(loss_mod, "CHUNK_ELEMENTS", VOCAB * 4)
    with _LargestLogits() as seen:
        token_loss_sum(model, mb).backward()
    assert 0 < seen.largest <= 4 * VOCAB < n * VOCAB
    monkeypatch.setattr(loss_mod, "plain_head", lambda m: None)
    with _LargestLogits() as seen:
        token_loss_sum(model, mb).backward()
    assert seen.largest >= n * VOCAB


def test_heads_the_loss_leaves_alone():
    """A head with a bias, a model type not known to end in its head (Gemma 2 soft-caps its logits), LoRA on
    the head: the model's own head runs."""
    model = _model("llama")
    model.set_output_embeddings(torch.nn.Linear(32, VOCAB, bias=True).double())
    assert plain_head(model) is None
    from transformers import AutoModelForCausalLM

    gemma2 = AutoModelForCausalLM.from_config(_config("gemma2"))
    assert gemma2.config.final_logit_softcapping and plain_head(gemma2) is None
    assert "gemma2" not in PLAIN_HEAD

    class Wrapped(torch.nn.Linear):  # what peft puts where it adapts a layer: not a plain Linear
        pass

    model = _model("qwen2")
    model.set_output_embeddings(Wrapped(32, VOCAB, bias=False))
    assert plain_head(model) is None


def test_a_failure_inside_the_forward_puts_the_head_back(monkeypatch):
    model = _model("llama")
    head = model.get_output_embeddings()
    mb = collate([_rows(False)], 0, packing=True)
    monkeypatch.setattr(loss_mod, "linear_cross_entropy", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.raises(RuntimeError, match="x"):
        token_loss_sum(model, mb)
    assert model.get_output_embeddings() is head


def test_plain_cross_entropy_helper_matches_torch():
    logits = torch.randn(6, VOCAB, dtype=torch.float64)
    target = torch.randint(0, VOCAB, (6,))
    w = torch.rand(6, dtype=torch.float64)
    assert float(weighted_ce(logits, target, w)) == pytest.approx(
        float((F.cross_entropy(logits, target, reduction="none") * w).sum()))

"""The JVP scorer against independent references: per-token backward through the plain HF model,
and attention rows from an eager ``output_attentions`` pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bridgecli.format.records import Example
from bridgecli.modeling.params import tail_parameters
from bridgecli.modeling.scoring import BridgeScorer, ExactScorer, ScoringContext

from tiny import record_examples, tiny_llama_config, tiny_model

pytestmark = pytest.mark.integration  # every scorer on tiny models of four families (seconds each)


def configs(vocab):
    from transformers import Gemma3TextConfig, Qwen2Config

    yield "llama-gqa", tiny_llama_config(vocab)
    yield "qwen2", Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=5,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                               tie_word_embeddings=True)
    yield "gemma3", Gemma3TextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                                     num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                                     max_position_embeddings=1024, sliding_window=16,
                                     layer_types=["sliding_attention"] * 5 + ["full_attention"])


def reference_a(model, ex: Example, v: dict) -> np.ndarray:
    """a_j = v . grad l_j by one backward pass per token through the untouched HF model."""
    ids = torch.tensor([ex.tokens.input_ids])
    resp = ex.tokens.response_positions()
    names = list(v)
    params = dict(model.named_parameters())
    out = []
    logits = model(input_ids=ids).logits[0]
    losses = F.cross_entropy(logits[resp - 1].double(), ids[0, resp], reduction="none")
    for j in range(len(resp)):
        grads = torch.autograd.grad(losses[j], [params[n] for n in names], retain_graph=True)
        out.append(sum(float((g * v[n]).sum()) for g, n in zip(grads, names)))
    return np.array(out)


def reference_rows(model, ex: Example, layers: list[int]) -> tuple[np.ndarray, np.ndarray]:
    ids = torch.tensor([ex.tokens.input_ids])
    with torch.no_grad():
        att = model(input_ids=ids, output_attentions=True).attentions
    mean = torch.stack([att[i][0].mean(0) for i in layers]).mean(0).double().numpy()
    p, r = ex.tokens.prompt_positions(), ex.tokens.response_positions()
    return mean[np.ix_(r - 1, p)], np.tril(mean[np.ix_(r - 1, r)], -1).sum(1)


@pytest.mark.parametrize("arch", ["llama-gqa", "qwen2", "gemma3"])
def test_jvp_matches_per_token_backward_and_eager_attention(tokenizer, arch):
    config = dict(configs(len(tokenizer)))[arch]
    model = tiny_model(config, dtype=torch.float64)
    exs = record_examples(tokenizer)
    torch.manual_seed(1)
    tail = tail_parameters(model, 4)
    v = {n: torch.randn_like(p) for n, p in tail.items()}
    ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v, attention_layers=3)
    scores = BridgeScorer(ctx).score(exs)  # one padded batch of three

    eager = tiny_model(config, dtype=torch.float64)
    eager.load_state_dict(model.state_dict())
    eager.set_attn_implementation("eager")
    n_layers = config.num_hidden_layers
    for ex, sc in zip(exs, scores):
        a_ref = reference_a(eager, ex, v)
        a = sc.a.numpy().astype(np.float64)
        # stored as float32: compare at float32 resolution, far inside the 1e-6 target
        assert np.max(np.abs(a - a_ref)) <= 1e-6 * np.max(np.abs(a_ref))
        A_ref, c_ref = reference_rows(eager, ex, list(range(n_layers - 3, n_layers)))
        assert sc.A.dtype == "float16"
        np.testing.assert_allclose(sc.A.numpy(), A_ref, atol=1e-3, rtol=1e-3)
        np.testing.assert_allclose(sc.c.numpy(), c_ref, atol=1e-6)
        assert np.all(sc.A.numpy().sum(1) + sc.c.numpy() <= 1 + 1e-3)


def test_exact_scorer_agrees_with_jvp(tokenizer):
    model = tiny_model(tiny_llama_config(len(tokenizer)), dtype=torch.float64)
    exs = record_examples(tokenizer)[:2]
    torch.manual_seed(2)
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 2).items()}
    ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v, attention_layers=4)
    fast, slow = BridgeScorer(ctx).score(exs), ExactScorer(ctx).score(exs)
    for f, s in zip(fast, slow):
        np.testing.assert_allclose(f.a.numpy(), s.a.numpy(), rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(f.A.numpy(), s.A.numpy())
        np.testing.assert_allclose(f.loss.numpy(), s.loss.numpy(), rtol=1e-6)


def test_batching_does_not_change_scores(tokenizer):
    model = tiny_model(tiny_llama_config(len(tokenizer)))
    exs = record_examples(tokenizer)
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 4).items()}
    scorer = BridgeScorer(ScoringContext(model=model, tokenizer=tokenizer, direction=v))
    together = scorer.score(exs)
    for ex, t in zip(exs, together):
        alone = scorer.score([ex])[0]
        np.testing.assert_allclose(t.a.numpy(), alone.a.numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(t.A.numpy(), alone.A.numpy(), atol=2e-3)
        np.testing.assert_allclose(t.c.numpy(), alone.c.numpy(), atol=1e-5)


def test_shapes_follow_eligible_positions(tokenizer):
    model = tiny_model(tiny_llama_config(len(tokenizer)))
    exs = record_examples(tokenizer, chat_template=False)
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 4).items()}
    for ex, sc in zip(exs, BridgeScorer(ScoringContext(model=model, tokenizer=tokenizer, direction=v)).score(exs)):
        m, n = len(ex.tokens.prompt_positions()), len(ex.tokens.response_positions())
        assert sc.A.shape == [n, m] and sc.a.shape == [n] and sc.c.shape == [n] and sc.loss.shape == [n]
        assert sc.c.numpy()[0] == 0.0  # the first response token has no response history
        assert np.all(sc.loss.numpy() > 0)

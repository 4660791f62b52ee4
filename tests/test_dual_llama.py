"""The hand-fused Llama-family tail against the generic forward-mode AD path (float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bridgecli.modeling.params import tail_parameters
from bridgecli.modeling.scoring import BridgeScorer, ScoringContext

from tiny import record_examples as examples
from tiny import tiny_llama_config, tiny_model


def qwen2(vocab):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=5,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                       tie_word_embeddings=True)


@pytest.mark.integration  # a model's fast pass against forward AD (seconds)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_fast_tail_equals_forward_ad(tokenizer, family):
    cfg = tiny_llama_config(len(tokenizer)) if family == "llama" else qwen2(len(tokenizer))
    model = tiny_model(cfg, dtype=torch.float64)
    torch.manual_seed(3)
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 3).items()}
    exs = examples(tokenizer)
    fast_scorer = BridgeScorer(ScoringContext(model=model, tokenizer=tokenizer, direction=v, attention_layers=4))
    assert fast_scorer.fast is not None
    generic = BridgeScorer(ScoringContext(model=model, tokenizer=tokenizer, direction=v, attention_layers=4,
                                          options={"fast_tail": False}))
    assert generic.fast is None
    # HF's RMSNorm normalises in float32 even for a float64 model, so both paths are float32-accurate
    for f, g in zip(fast_scorer.score(exs), generic.score(exs)):
        np.testing.assert_allclose(f.a.numpy(), g.a.numpy(), rtol=3e-5, atol=1e-6)
        np.testing.assert_allclose(f.loss.numpy(), g.loss.numpy(), rtol=1e-6)
        np.testing.assert_array_equal(f.A.numpy(), g.A.numpy())
        np.testing.assert_allclose(f.c.numpy(), g.c.numpy(), atol=1e-7)


def test_unsupported_families_use_forward_ad(tokenizer):
    from transformers import Gemma3TextConfig

    cfg = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=8, max_position_embeddings=256)
    model = tiny_model(cfg)
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 2).items()}
    assert BridgeScorer(ScoringContext(model=model, tokenizer=tokenizer, direction=v)).fast is None

"""Tiny random models built from configs (fast, deterministic) for tests."""

from __future__ import annotations


def tiny_llama_config(vocab_size: int, layers: int = 6, hidden: int = 32, heads: int = 4, kv_heads: int = 2):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=1024, tie_word_embeddings=False)


def tiny_model(config, seed: int = 0, dtype=None):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()

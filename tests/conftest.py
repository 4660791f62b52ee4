"""Shared fixtures: the real SmolLM2 tokenizer and tiny random models built from configs."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("BRIDGE_NO_PROGRESS", "1")


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


@pytest.fixture(scope="session")
def tokenizer():
    """The embedded default model's tokenizer (chat template included)."""
    from bridgecli.modeling.loading import load_tokenizer

    return load_tokenizer(None)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """A tiny random Llama with the real tokenizer, saved as an HF folder (for CLI tests)."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    model = tiny_model(tiny_llama_config(len(tokenizer), layers=5, hidden=48))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder

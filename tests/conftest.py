"""Shared fixtures: the real SmolLM2 tokenizer and tiny random models built from configs."""

from __future__ import annotations

import os

import pytest

from tiny import tiny_llama_config, tiny_model  # noqa: F401  (re-exported for fixtures)

os.environ.setdefault("BRIDGE_NO_PROGRESS", "1")


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

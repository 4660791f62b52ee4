"""The real models the benchmarks time with random weights, as ``LlamaConfig`` keyword arguments.

``SHAPES[name]`` is a model's architecture as its config.json gives it (vocabulary, sizes, position
settings, tied embeddings); :func:`sizes` is the part that sets what a step costs, for scripts that
take the vocabulary from a tokenizer and leave the position settings at ``LlamaConfig``'s defaults.
``TINY[name]``, in the same columns, are small bodies (no real model) for the scripts' CPU runs.
Not part of the package: bench scripts in every folder import it from ``bench/``.
"""

from __future__ import annotations

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

_COLUMNS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rope_theta",
)
_ROWS = {  # in the order of _COLUMNS; every one ties its input and output embeddings
    "smollm2-135m": (49152, 576, 1536, 30, 9, 3, 64, 100000.0),
    "smollm2-360m": (49152, 960, 2560, 32, 15, 5, 64, 100000.0),
    "llama-3.2-1b": (128256, 2048, 8192, 16, 32, 8, 64, 500000.0),
    "llama-3.2-3b": (128256, 3072, 8192, 28, 24, 8, 128, 500000.0),
}
_POSITION = ("rope_theta", "rope_scaling")


def _shape(name: str, row: tuple) -> dict:
    shape = dict(zip(_COLUMNS, row))
    if name.startswith("llama-3"):
        shape["rope_scaling"] = LLAMA3_ROPE
    shape["tie_word_embeddings"] = True
    return shape


_TINY_ROWS = {  # not real models, in the order of _COLUMNS
    "tiny-score": (49152, 32, 64, 5, 2, 1, 16, 10000.0),  # score/e2e.py and score/host_profile.py
    "tiny-train": (4096, 128, 512, 4, 4, 2, 32, 10000.0),  # train/run.py (its vocabulary from --vocab)
}

SHAPES = {name: _shape(name, row) for name, row in _ROWS.items()}
TINY = {name: _shape(name, row) for name, row in _TINY_ROWS.items()}


def sizes(name: str) -> dict:
    """``SHAPES[name]`` (or ``TINY[name]``) without its vocabulary and position settings."""
    shape = SHAPES[name] if name in SHAPES else TINY[name]
    return {k: v for k, v in shape.items() if k != "vocab_size" and k not in _POSITION}

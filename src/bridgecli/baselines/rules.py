"""The scoring rules of the compared methods, as pure numpy functions (docs/compared-methods.md).

Each returns one score per eligible token; the selectors keep the top-b (ties: lower position first,
bridgecli.core.topk.top_b), so every rule here is tested against a direct computation.
"""

from __future__ import annotations

import numpy as np

#: ssToken's min-max epsilon: (x - min) / (max - min + 1e-8)
MINMAX_EPS = 1e-8


def minmax(x: np.ndarray) -> np.ndarray:
    """Min-max normalise to [0, 1] as ssToken does; a constant (or empty) input maps to zeros."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x
    return (x - x.min()) / (x.max() - x.min() + MINMAX_EPS)


def excess_loss(current: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """RHO-1: L_delta = L_current - L_reference (high: learnable tokens the reference already knows)."""
    return np.asarray(current, dtype=np.float64) - np.asarray(reference, dtype=np.float64)


def token_cleaning(base: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Token Cleaning: loss under the base model minus loss under the reference model."""
    return np.asarray(base, dtype=np.float64) - np.asarray(reference, dtype=np.float64)


def sstoken(history: np.ndarray, current: np.ndarray, attention: np.ndarray, gamma: float) -> np.ndarray:
    """ssToken: gamma * minmax(L_hist - L_cur) + (1 - gamma) * Attn, min-max over the example's
    response tokens; Attn (the attention mass onto the prompt) is used as is, as in the authors' code."""
    rel = np.asarray(history, dtype=np.float64) - np.asarray(current, dtype=np.float64)
    return gamma * minmax(rel) + (1.0 - gamma) * np.asarray(attention, dtype=np.float64)


def tokenseek(received: np.ndarray, grad_norm: np.ndarray) -> np.ndarray:
    """tokenseek-approx: the mean of min-max(attention received) and min-max(||dL/de||), min-max over
    the tokens ranked together."""
    return 0.5 * (minmax(received) + minmax(grad_norm))


def self_information(loss: np.ndarray) -> np.ndarray:
    """LLMLingua-1: the self-information -log p(x_i | x_<i) of a token is its cross-entropy loss."""
    return np.asarray(loss, dtype=np.float64)

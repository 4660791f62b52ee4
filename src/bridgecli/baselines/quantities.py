"""Looking up per-token quantities in a stream's examples, with errors that say which step adds them.

Names are those given to ``bridge reference --as NAME``. Two are special:

- ``warmup``: the warmup checkpoint theta_bar. When the stream has no reference named ``warmup``, its
  response losses come from ``Scores.loss``, which ``bridge score`` computed with that checkpoint.
- ``scores``: always ``Scores.loss`` (response side only).
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError
from ..format.records import Example

SCORES = "scores"
WARMUP = "warmup"

_HOW = {
    "loss": "bridge reference STREAM --model MODEL --as {name}",
    "attention": "bridge reference STREAM --model MODEL --as {name}  (attention is on by default)",
    "received": "bridge reference STREAM --model MODEL --as {name}  (attention is on by default)",
    "grad": "bridge reference STREAM --model MODEL --as {name} --grad-norms",
}


def _hint(name: str, what: str) -> str:
    if name == "base":
        how = _HOW[what].replace("--model MODEL ", "")  # --model defaults to the stream's base model
    elif name == WARMUP:
        how = _HOW[what].replace("MODEL", "runs/warmup")
    else:
        how = _HOW[what]
    return "run `" + how.format(name=name) + "` first, or name another one with --option"


def _check(arr: np.ndarray, size: int, example: Example, what: str) -> np.ndarray:
    if arr.shape != (size,):
        raise FormatError(f"{what} has shape {list(arr.shape)}, expected [{size}]", record=example.index)
    return arr.astype(np.float64)


def _scores_loss(example: Example, name: str) -> np.ndarray:
    s = example.scores
    if s is None or s.loss is None:
        raise FormatError(
            f"no response losses '{name}': the example's scores carry no loss",
            record=example.index,
            hint=_hint(WARMUP, "loss"),
        )
    return _check(s.loss.numpy(), len(example.tokens.response_positions()), example, "scores.loss")


def losses(example: Example, name: str, side: str) -> np.ndarray:
    """Per-token losses of model ``name`` over the eligible ``side`` ("prompt"/"response") positions."""
    size = len(example.tokens.prompt_positions() if side == "prompt" else example.tokens.response_positions())
    ref = example.references.get(name) if name != SCORES else None
    if ref is not None and getattr(ref, f"{side}_loss") is not None:
        return _check(getattr(ref, f"{side}_loss").numpy(), size, example, f"references.{name}.{side}_loss")
    if side == "response" and (name == SCORES or (name == WARMUP and ref is None)):
        return _scores_loss(example, name)
    known = ", ".join(sorted(example.references)) or "none"
    raise FormatError(
        f"no {side} losses named '{name}' in the stream (references: {known})",
        record=example.index,
        hint=_hint(name, "loss"),
    )


def quantity(example: Example, name: str, field: str) -> np.ndarray:
    """A per-token array of reference ``name`` (``response_attention``, ``prompt_received``, ...)."""
    side = field.split("_", 1)[0]
    size = len(example.tokens.prompt_positions() if side == "prompt" else example.tokens.response_positions())
    ref = example.references.get(name)
    arr = getattr(ref, field, None) if ref is not None else None
    if arr is None:
        what = "attention" if field == "response_attention" else ("grad" if field.endswith("grad") else "received")
        known = ", ".join(sorted(example.references)) or "none"
        raise FormatError(
            f"no {field.replace('_', ' ')} from a model named '{name}' in the stream (references: {known})",
            record=example.index,
            hint=_hint(name, what),
        )
    return _check(arr.numpy(), size, example, f"references.{name}.{field}")


def attention_rows(example: Example) -> np.ndarray:
    """The substitute for ssToken's Attn: row sums of the stream's A (response query rows onto the
    eligible prompt columns, averaged over the scored layers and heads)."""
    s = example.scores
    if s is None:
        raise FormatError("the example has no scores", record=example.index, hint="run `bridge score` first")
    n, m = len(example.tokens.response_positions()), len(example.tokens.prompt_positions())
    return s.A.numpy().astype(np.float64).reshape(n, m).sum(axis=1)

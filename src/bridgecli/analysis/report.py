"""The JSON reports of ``bridge analyze``: JSON-safe values and a layout that stays readable."""

from __future__ import annotations

import json

import numpy as np


def clean(x):
    """JSON-safe values: NaN and infinities become None, numpy scalars Python numbers, tuples lists."""
    if isinstance(x, float) and not np.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, np.generic):
        return clean(x.item())
    return x


def dumps(obj, level: int = 0) -> str:
    """JSON with nested maps indented and lists of scalars on one line (reports stay readable and
    small: kappa, pairs and swaps are long lists)."""
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(str(k))}: {dumps(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(x, dict) for x in obj):
        return "[\n" + ",\n".join(inner + dumps(x, level + 1) for x in obj) + "\n" + pad + "]"
    return json.dumps(obj, allow_nan=False, separators=(",", ": ") if not isinstance(obj, list) else (",", ":"))

"""Shared by the issue-28 diagnostics (aj_check.py, supervision_compare.py): provenance of a result
(commit, device, model, command, date), small statistics, and atomic writes of the JSON result and
its markdown summary; and the items of an eval result (generation_failures.py, code_failures.py). Not part of the package: bench scripts import it from this folder."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from provenance import commit  # noqa: E402  (re-exported: the scripts call dc.commit())


def eval_items(path: Path) -> list[dict]:
    """The ``items`` of a ``bridge eval`` result file, plain or zstd-compressed (``.zst``); [] when it has none."""
    raw = path.read_bytes()
    if path.suffix == ".zst":
        import zstandard

        raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    return json.loads(raw).get("items") or []


def device_info(device: str) -> dict:
    """What ran the measurement: the torch device, the GPU's name or the CPU and its thread count."""
    import torch

    out = {"device": device, "torch": torch.__version__, "platform": platform.platform()}
    if device.startswith("cuda") and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
    else:
        out["cpu_threads"] = torch.get_num_threads()
        out["cpu_count"] = os.cpu_count()
        out["processor"] = platform.processor() or platform.machine()
    return out


def provenance(device: str, model: str | None, extra: dict | None = None) -> dict:
    return {
        "commit": commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
        "model": model,
        **device_info(device),
        **(extra or {}),
    }


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: str | Path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=1, default=_plain) + "\n")


def _plain(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON: {type(x).__name__}")


# -- statistics -----------------------------------------------------------------------------------


def pearson(x, y) -> float | None:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def spearman(x, y) -> float | None:
    from bridgecli.analysis.metrics import rankdata

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2:
        return None
    return pearson(rankdata(x), rankdata(y))


def quantiles(x, qs=(0.1, 0.25, 0.5, 0.75, 0.9)) -> dict:
    """Mean and quantiles of ``x`` (None when empty)."""
    x = np.asarray(x, dtype=np.float64)
    if len(x) == 0:
        return {"n": 0, "mean": None, **{f"q{round(q * 100)}": None for q in qs}}
    return {"n": int(len(x)), "mean": float(x.mean()), **{f"q{round(q * 100)}": float(np.quantile(x, q)) for q in qs}}


def fmt(x, digits: int = 3) -> str:
    """A number for a markdown table: fixed digits, scientific when tiny or huge, '-' for None."""
    if x is None:
        return "-"
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}"
    x = float(x)
    if x != 0 and (abs(x) < 0.01 or abs(x) >= 1e5):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}f}"


def table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(c if isinstance(c, str) else fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(out)

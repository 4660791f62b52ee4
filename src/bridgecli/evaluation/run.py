"""Run a registered eval task, save its result, tabulate results."""

from __future__ import annotations

import json
import os
from typing import Any

from rich.table import Table

from .. import registry
from ..errors import PluginError
from ..io import atomic_path
from .tasks import EvalOptions


def evaluate(
    model: Any,
    tokenizer: Any,
    task: str,
    data: str,
    *,
    limit: int | None = None,
    few_shot: int = 0,
    few_shot_data: str | None = None,
    batch_size: int = 8,
    max_new_tokens: int = 256,
    chat_template: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the eval task registered as ``task`` on ``data``: ``{"task", "summary", "items"}``."""
    entry = registry.get("eval_task", task)
    options = EvalOptions(data=str(data), limit=limit, few_shot=few_shot, few_shot_data=few_shot_data,
                          batch_size=batch_size, max_new_tokens=max_new_tokens,
                          chat_template=chat_template, progress=progress)
    run = entry.obj(model, tokenizer, options)
    if not isinstance(run, dict) or "summary" not in run or "items" not in run:
        raise PluginError(f"eval task '{task}' (plugin {entry.plugin}) returned no summary/items")
    summary = dict(run["summary"])
    summary.setdefault("task", task)
    return {"task": task, "summary": summary, "items": list(run["items"])}


def write_result(result: dict[str, Any], path: str | os.PathLike) -> None:
    """Write one result (or a list of them) as JSON, atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(result, fh, ensure_ascii=False, indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())


def render_table(results: list[dict[str, Any]]) -> Table:
    """One row per task: task, n, accuracy (%), correct."""
    table = Table(title="bridge eval")
    table.add_column("task")
    table.add_column("n", justify="right")
    table.add_column("accuracy", justify="right")
    table.add_column("correct", justify="right")
    for result in results:
        s = result["summary"]
        table.add_row(str(result.get("task", s.get("task", "?"))), str(s["n"]),
                      f"{100 * s['accuracy']:.1f}%", str(s["correct"]))
    return table

"""Run a registered eval task, save its result, tabulate results."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from rich.table import Table

from .. import registry
from ..contracts import as_eval_task
from ..errors import PluginError, UsageError
from ..io import atomic_path
from .journal import Journal, check_same_request, recording
from .tasks import task_options


def evaluate(
    model: Any,
    tokenizer: Any,
    task: str,
    data: str,
    *,
    journal: Journal | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Run the eval task registered as ``task`` on ``data``: ``{"task", "summary", "items"}``.
    ``settings`` are the fields of :class:`~bridgecli.evaluation.tasks.EvalOptions` (``limit``,
    ``few_shot``, ``batch_size``, ...; checked against their declared ranges first).

    ``summary["seconds"]`` is the task's wall time (data loading, generation/scoring, grading).
    With a ``journal``, every generated continuation and scored log-likelihood is recorded there as
    it comes, and those it already holds are reused (see :mod:`bridgecli.evaluation.journal`)."""
    options = task_options(data, settings)
    entry = registry.get("eval_task", task)
    start = time.perf_counter()
    with recording(journal):
        run = entry.obj(model, tokenizer, options)
    seconds = time.perf_counter() - start
    if not isinstance(run, dict) or "summary" not in run or "items" not in run:
        raise PluginError(f"eval task '{task}' (plugin {entry.plugin}) returned no summary/items")
    check_summary(run["summary"], as_eval_task(entry.obj).metric, f"eval task '{task}' (plugin {entry.plugin})")
    summary = dict(run["summary"])
    summary.setdefault("task", task)
    summary.setdefault("seconds", round(seconds, 3))
    return {"task": task, "summary": summary, "items": list(run["items"])}


def check_summary(summary: Any, metric: str, what: str) -> None:
    """A task's summary holds what its declared ``metric`` says (:class:`~bridgecli.hookspecs.EvalTask`):
    ``loss`` with its interval for a loss, else ``accuracy`` and ``correct``; and a ``metric`` field, where
    it has one, names the declared metric. Otherwise the task is at fault (:class:`PluginError`)."""
    if not isinstance(summary, dict):
        raise PluginError(f"{what} returned a summary that is not a mapping")
    fields = ("loss", "ci_low", "ci_high") if metric == "loss" else ("accuracy", "correct")
    absent = [f for f in fields if not isinstance(summary.get(f), (int, float))]
    if absent:
        raise PluginError(f"{what} declares the metric {metric!r} but its summary has no number {absent[0]!r}")
    # a loss summary says so itself (results read back, by ``is_loss``, carry no declaration)
    if summary.get("metric", None if metric == "loss" else metric) != metric:
        raise PluginError(f"{what} declares the metric {metric!r} but its summary says {summary.get('metric')!r}")


def default_data(task: str) -> str | None:
    """Where the task's data lies under a data folder such as data/ (None: not known)."""
    value = as_eval_task(registry.get("eval_task", task).obj).default_data
    return value if isinstance(value, str) else None


def write_result(result: dict[str, Any], path: str | os.PathLike) -> None:
    """Write one result (or a list of them) as JSON, atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(result, fh, ensure_ascii=False, indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())


def reusable(path: str | os.PathLike, request: dict[str, Any]) -> dict[str, Any] | None:
    """For ``bridge eval --resume``: the result already at ``path`` when it was made by the same
    request (model fingerprint, data, settings), None when there is none yet. A result made by another
    request is an error naming the first setting that differs, so nothing is silently mixed."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            old = json.load(fh)
    except (OSError, ValueError) as err:
        raise UsageError(
            f"cannot read the earlier result ({err})",
            file=str(path),
            hint="remove it, or drop --resume to evaluate again",
        ) from None
    before = old.get("request") if isinstance(old, dict) else None
    if not isinstance(before, dict):
        raise UsageError(
            "the earlier result records no request (written without --resume support)",
            file=str(path),
            hint="remove it, or drop --resume to evaluate again",
        )
    check_same_request(before, request, "the earlier result", file=str(path), field="request")
    return old


def is_loss(summary: dict[str, Any]) -> bool:
    """A loss task's summary (``heldout-loss``): ``loss`` with its interval instead of ``accuracy``."""
    return summary.get("metric") == "loss" and isinstance(summary.get("loss"), (int, float))


def loss_text(summary: dict[str, Any]) -> str:
    """``1.234 [1.201, 1.270]``: the loss and its interval."""
    return f"{summary['loss']:.4f} [{summary['ci_low']:.4f}, {summary['ci_high']:.4f}]"


def render_table(results: list[dict[str, Any]]) -> Table:
    """One row per task: task, n, metric, accuracy (%), correct, acc_norm (%) where the task has it;
    a loss task shows its loss with the 95% interval and its token count instead."""
    losses = any(is_loss(r["summary"]) for r in results)
    scores = not all(is_loss(r["summary"]) for r in results)
    table = Table(title="bridge eval")
    table.add_column("task")
    table.add_column("n", justify="right")
    table.add_column("metric")
    if scores:
        table.add_column("accuracy", justify="right")
        table.add_column("correct", justify="right")
        table.add_column("acc_norm", justify="right")
    if losses:
        table.add_column("loss [95% CI]", justify="right")
        table.add_column("tokens", justify="right")
    for result in results:
        s = result["summary"]
        name = str(result.get("task", s.get("task", "?")))
        if is_loss(s):
            table.add_row(
                name, str(s["n"]), "loss", *(["", "", ""] if scores else []), loss_text(s), str(s.get("tokens", ""))
            )
            continue
        norm = s.get("acc_norm")
        table.add_row(
            name,
            str(s["n"]),
            str(s.get("metric", "accuracy")),
            f"{100 * s['accuracy']:.1f}%",
            str(s["correct"]),
            f"{100 * norm:.1f}%" if isinstance(norm, (int, float)) else "",
            *(["", ""] if losses else []),
        )
    return table

"""``bridge eval --compare RUN...``: the paper's Table 1 from saved results.

Each run is a folder holding ``eval-<task>.json`` files (what ``bridge eval`` writes) or one such
JSON file. Rows are runs; columns are the general-capability tasks (default: ARC-C, HellaSwag,
MMLU, HumanEval, those that any run has), their mean ("General Avg."), the target task, and
"Overall" = (General Avg. + Target) / 2, the paper's definition (Llama-3.2-3B Pretrained:
(45.52 + 0.62) / 2 = 23.07). All numbers are percentages; a run missing a column gets "-" there
and in every average that needs it.

Loss results (``heldout-loss``) get one column per held-out file, after the accuracy columns:
the loss with its 95% bootstrap interval, ``1.2345 [1.2011, 1.2702]``. Lower is better; a run
whose interval lies wholly below another's is better on that file beyond resampling noise.

Paired differences (``bridge compare --paired``, :func:`paired_difference`): each run after the
first against the first, on every task (and loss file) both have, over the items both evaluated
(matched by ``index``; an item whose ``id``/``unique_id``/``question``/``problem``/``task_id``
differs between the runs is an error: not the same data). The difference is this run minus the
first: accuracy in points (items' ``correct``, or ``correct_norm`` with ``--metric acc_norm``),
a loss in nats (``answer-loss``: the mean of the items' ``loss``; ``heldout-loss``: the token mean
``sum(loss_sum) / sum(tokens)``), with a 95% paired bootstrap interval over the items
(:func:`bridgecli.evaluation.bootstrap.paired_bootstrap`, seed 0, 1000 resamples). An interval
that excludes 0 is a difference beyond resampling noise of the items.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from rich.table import Table

from ..errors import InputError, UsageError
from .run import is_loss, loss_text

GENERAL = ("arc_challenge", "hellaswag", "mmlu", "humaneval")
TARGETS = ("gsm8k", "math")
LABELS = {
    "arc_challenge": "ARC-C",
    "arc_easy": "ARC-E",
    "hellaswag": "HellaSwag",
    "mmlu": "MMLU",
    "humaneval": "HumanEval",
    "mbpp": "MBPP",
    "gsm8k": "GSM8K",
    "math": "MATH",
}


@dataclass
class Run:
    name: str
    path: Path
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # task -> summary
    losses: dict[str, dict[str, Any]] = field(default_factory=dict)  # loss column label -> summary
    # task or loss column label -> the whole result (items included) and the file it came from
    full: dict[str, tuple[dict[str, Any], Path]] = field(default_factory=dict)


def _read_result(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read: {err}", file=str(path)) from None
    except json.JSONDecodeError as err:
        raise InputError(f"not valid JSON ({err.msg} at line {err.lineno})", file=str(path)) from None
    results = data if isinstance(data, list) else [data]
    for k, result in enumerate(results):
        if not isinstance(result, dict) or not isinstance(result.get("summary"), dict):
            raise InputError(
                "not a bridge eval result (no 'summary')", file=str(path), record=None if len(results) == 1 else k
            )
        summary = result["summary"]
        if "task" not in result and "task" not in summary:
            raise InputError("no 'task' in the result", file=str(path))
        if is_loss(summary):
            for name in ("ci_low", "ci_high"):
                if not isinstance(summary.get(name), (int, float)):
                    raise InputError(
                        f"no numeric '{name}' in the loss summary", file=str(path), field=f"summary.{name}"
                    )
        elif not isinstance(summary.get("accuracy"), (int, float)):
            raise InputError("no numeric 'accuracy' in the summary", file=str(path), field="summary.accuracy")
    return results


def load_run(path: str | Path) -> Run:
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("eval-*.json"))
        if not files:
            raise InputError(
                "no eval-*.json results in this folder", file=str(p), hint=f"run `bridge eval {p} --task ...` first"
            )
        name = p.name or str(p)
    elif p.is_file():
        files, name = [p], p.stem
    else:
        raise InputError("no such run folder or result file", file=str(p))
    run = Run(name, p)
    for f in files:
        for result in _read_result(f):
            task = result.get("task") or result["summary"]["task"]
            if is_loss(result["summary"]):
                label = loss_label(task, result)
                run.losses[label] = result["summary"]
            else:
                label = task
                run.results[task] = result["summary"]
            run.full[label] = (result, f)
    return run


def loss_label(task: str, result: dict[str, Any]) -> str:
    """A loss column: the task and the name of its data file (``heldout-loss test.jsonl``), so
    losses on different files never share a column."""
    data = result["summary"].get("data") or (result.get("request") or {}).get("data")
    return f"{task} {Path(str(data)).name}" if data else task


def score(summary: dict[str, Any], metric: str | None) -> float:
    """The number a column shows (percent): ``metric`` from the summary when it has it, else ``accuracy``."""
    value = summary.get(metric) if metric else None
    if not isinstance(value, (int, float)):
        value = summary["accuracy"]
    return 100.0 * float(value)


@dataclass
class Comparison:
    general: list[str]
    target: str | None
    rows: list[dict[str, Any]]  # name, one value per general task and target, general_avg, overall (None = missing)
    losses: list[str] = field(default_factory=list)  # loss columns; each row's "losses" maps them to summaries


def compare(
    runs: Sequence[Run], *, general: Sequence[str] | None = None, target: str | None = None, metric: str | None = None
) -> Comparison:
    """Table 1 values for ``runs``; see the module docstring."""
    if not runs:
        raise UsageError("no run folder to compare")
    present = {task for run in runs for task in run.results}
    losses = list(dict.fromkeys(label for run in runs for label in run.losses))
    columns = list(general) if general else [t for t in GENERAL if t in present]
    if target is None:
        target = next((t for t in TARGETS if t in present), None)
    elif target not in present:
        raise UsageError(
            f"no run has a result for the target task '{target}'",
            hint=f"tasks found: {', '.join(sorted(present)) or 'none'}",
        )
    columns = [c for c in columns if c != target]
    rows = []
    for run in runs:
        row: dict[str, Any] = {"name": run.name, "path": str(run.path)}
        for task in columns + ([target] if target else []):
            row[task] = score(run.results[task], metric) if task in run.results else None
            row[f"{task}_n"] = run.results[task]["n"] if task in run.results else None
        values = [row[c] for c in columns]
        row["general_avg"] = sum(values) / len(values) if values and None not in values else None
        t = row.get(target) if target else None
        row["overall"] = (row["general_avg"] + t) / 2 if row["general_avg"] is not None and t is not None else None
        row["losses"] = {label: run.losses.get(label) for label in losses}
        rows.append(row)
    return Comparison(columns, target, rows, losses)


def render(comparison: Comparison, *, title: str = "bridge eval --compare") -> Table:
    table = Table(title=title)
    table.add_column("run")
    # the averages need general columns; a table of losses (and at most a target) leaves them out
    averages = bool(comparison.general or not comparison.losses)
    for task in comparison.general:
        table.add_column(LABELS.get(task, task), justify="right")
    if averages:
        table.add_column("General Avg.", justify="right")
    if comparison.target:
        table.add_column(f"{LABELS.get(comparison.target, comparison.target)} (target)", justify="right")
    if averages:
        table.add_column("Overall", justify="right")
    for label in comparison.losses:
        table.add_column(f"{label} loss [95% CI]", justify="right")

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for row in comparison.rows:
        cells = [row["name"]] + [fmt(row[t]) for t in comparison.general]
        if averages:
            cells.append(fmt(row["general_avg"]))
        if comparison.target:
            cells.append(fmt(row[comparison.target]))
        if averages:
            cells.append(fmt(row["overall"]))
        for label in comparison.losses:
            found = row["losses"].get(label)
            cells.append("-" if found is None else loss_text(found))
        table.add_row(*cells)
    return table


# -------------------------------------------------------------------------------- paired differences

_IDENTITY = ("id", "unique_id", "task_id", "question", "problem")


@dataclass(frozen=True)
class PairedDifference:
    """``b - a`` on the items two results share, with a paired bootstrap interval. Accuracies are
    fractions here (the table shows points); losses are in nats."""

    label: str  # the task, or "task file" for a loss
    metric: str  # "accuracy" (or the item field used, e.g. correct_norm) or "loss"
    a: float  # the first result's statistic on the shared items
    b: float
    difference: float  # b - a
    low: float
    high: float
    n: int  # items both results hold
    only_a: int  # items only the first holds (left out)
    only_b: int
    level: float
    resamples: int
    seed: int


def _item_values(result: dict[str, Any], file: str, metric: str | None) -> tuple[str, dict[int, tuple]]:
    """``(metric name, {index: (value, weight, item)})`` of one result's items."""
    summary = result["summary"]
    items = result.get("items")
    if not isinstance(items, list) or not items:
        raise InputError(
            "no per-item records to pair", file=file, field="items", hint="rerun `bridge eval` to write them"
        )
    loss = is_loss(summary)
    if loss:
        by_items = summary.get("average") == "items"
        fields = ("loss",) if by_items else ("loss_sum", "tokens")
        name = "loss"
    else:
        name = "correct_norm" if metric == "acc_norm" and "correct_norm" in items[0] else "correct"
        fields = (name,)
    out: dict[int, tuple] = {}
    for k, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("index"), int):
            raise InputError("an item without an integer 'index'", file=file, record=f"items[{k}]", field="index")
        for f in fields:
            if not isinstance(item.get(f), (int, float)):
                raise InputError(f"no numeric '{f}' in the item", file=file, record=f"items[{k}]", field=f)
        if item["index"] in out:
            raise InputError(f"item index {item['index']} appears twice", file=file, record=f"items[{k}]")
        if loss and not by_items:
            value, weight = float(item["loss_sum"]), float(item["tokens"])
        else:
            value, weight = float(item[fields[0]]), 1.0
        out[item["index"]] = (value, weight, item)
    return ("accuracy" if name == "correct" else name), out


def paired_difference(
    a: dict[str, Any],
    b: dict[str, Any],
    *,
    files: tuple[str, str] = ("first result", "second result"),
    metric: str | None = None,
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> PairedDifference:
    """Result ``b`` minus result ``a`` (two ``bridge eval`` results of one task on the same data)
    over the items both hold, with a paired bootstrap interval (see the module docstring)."""
    from .bootstrap import paired_bootstrap

    task_a = a.get("task") or a["summary"].get("task")
    task_b = b.get("task") or b["summary"].get("task")
    if task_a != task_b:
        raise UsageError(f"cannot pair results of different tasks ({task_a} in {files[0]}, {task_b} in {files[1]})")
    label_a = loss_label(task_a, a) if is_loss(a["summary"]) else task_a
    label_b = loss_label(task_b, b) if is_loss(b["summary"]) else task_b
    if label_a != label_b:
        raise UsageError(f"cannot pair losses on different files ({label_a} in {files[0]}, {label_b} in {files[1]})")
    name, values_a = _item_values(a, files[0], metric)
    _, values_b = _item_values(b, files[1], metric)
    shared = sorted(set(values_a) & set(values_b))
    if not shared:
        raise UsageError(f"{files[0]} and {files[1]} share no item (by index)")
    for index in shared:
        item_a, item_b = values_a[index][2], values_b[index][2]
        for f in _IDENTITY:
            if f in item_a and f in item_b and item_a[f] != item_b[f]:
                raise InputError(
                    f"item {index} has another '{f}' than in {files[0]}: not the same data",
                    file=files[1],
                    field=f"items[index={index}].{f}",
                )
    ci = paired_bootstrap(
        [values_b[i][0] for i in shared],
        [values_b[i][1] for i in shared],
        [values_a[i][0] for i in shared],
        [values_a[i][1] for i in shared],
        resamples=resamples,
        level=level,
        seed=seed,
    )
    stat_a = sum(values_a[i][0] for i in shared) / sum(values_a[i][1] for i in shared)
    stat_b = sum(values_b[i][0] for i in shared) / sum(values_b[i][1] for i in shared)
    return PairedDifference(
        label_a,
        name,
        stat_a,
        stat_b,
        ci.mean,
        ci.low,
        ci.high,
        len(shared),
        len(values_a) - len(shared),
        len(values_b) - len(shared),
        ci.level,
        ci.resamples,
        ci.seed,
    )


def paired_rows(runs: Sequence[Run], *, metric: str | None = None) -> list[tuple[str, PairedDifference]]:
    """``(run name, difference)`` for every run after the first, against the first, on every task
    and loss column both have (in the first run's order)."""
    if len(runs) < 2:
        raise UsageError("--paired needs at least two runs: the first is the baseline")
    base = runs[0]
    out = []
    for run in runs[1:]:
        for label, (result, path) in base.full.items():
            if label in run.full:
                other, other_path = run.full[label]
                diff = paired_difference(result, other, files=(str(path), str(other_path)), metric=metric)
                out.append((run.name, diff))
    return out


def difference_text(d: PairedDifference) -> str:
    """``+1.52 [+0.30, +2.81]``: points for accuracy, nats (4 decimals) for a loss."""
    if d.metric == "loss":
        return f"{d.difference:+.4f} [{d.low:+.4f}, {d.high:+.4f}]"
    return f"{100 * d.difference:+.2f} [{100 * d.low:+.2f}, {100 * d.high:+.2f}]"


def render_paired(rows: list[tuple[str, PairedDifference]], baseline: str, *, title: str) -> Table:
    table = Table(title=f"{title}: paired differences from {baseline} (95% CI over items)")
    for name, justify in (("run", "left"), ("task", "left"), ("n", "right"), (baseline, "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    table.add_column("this run", justify="right")
    table.add_column("difference [95% CI]", justify="right")
    for name, d in rows:
        shown = (lambda v: f"{v:.4f}") if d.metric == "loss" else (lambda v: f"{100 * v:.2f}")
        n = str(d.n) + (f" (+{d.only_a}/{d.only_b} unpaired)" if d.only_a or d.only_b else "")
        table.add_row(name, f"{d.label} ({d.metric})", n, shown(d.a), shown(d.b), difference_text(d))
    return table

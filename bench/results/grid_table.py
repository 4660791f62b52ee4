"""The grid as markdown tables (held-out loss, accuracy, answer-span loss, cost), paired differences, and the
Finding-3 plot.

    python3 bench/results/grid_table.py OUT/results.json [--plot OUT/finding3.png] [--resamples 1000]
        [--versus METHOD ...] [--seed SEED ...]

Reads the results.json that bench/results/grid.sh accumulates (one entry per METHOD/RHO/SEED) and
prints, for each method and retention rho (rho_p = rho_r), the held-out loss on GSM8K test and on
MATH-500 with a 95% interval, the executed and supervised training tokens, and the wall time
(select .. train .. eval, summed over the seeds' runs, mean per seed).

Intervals: percentile bootstrap over the held-out examples (seed 0). With several seeds, each
resample draws one set of examples and the row's loss is the mean over seeds of the token-mean
loss on it; the spread between seeds is shown separately (``seed sd``). A difference between two
rows is bootstrapped *paired* (both models scored on the same resampled examples), which is
tighter than comparing two intervals. Finding 3 of the paper: BRIDGE minus Independent as
retention falls (negative = BRIDGE's held-out loss is lower), one line per held-out file.

When the runs hold accuracy (GSM8K test, MATH-500: 0/1 per item) or the answer-span loss (per item),
the same is done for them: seed-mean over items with a percentile bootstrap over items, and every row
minus ``random`` at the same retention, paired over items (an interval above 0 for accuracy, below 0
for a loss, is a win beyond resampling noise); every row minus full SFT (what the selection costs); and
for each loss, how many pairs of trained rows it orders as accuracy does. ``--seed`` keeps one seed's runs
(and base), so a difference is seed-matched: the same training order, and the same draw for the random
rows. The cost table gives each row's GPU seconds per run (select..compact, train, eval) next to the
shared steps (warm-up, scoring, reference passes).

With the general-capability tasks (ARC-Challenge, HellaSwag, MMLU, HumanEval per item): each task and their
mean (General Avg.) per row, and each task and the average minus full SFT, minus the untrained model, minus
``random`` and minus every ``--versus`` row at the same retention, paired over items.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))  # this checkout's bridgecli
from bridgecli.analysis.grid_stats import interval, item_interval, item_paired, paired, task_mean  # noqa: E402


FILES = (("gsm8k", "GSM8K test"), ("math500", "MATH-500"))
ORDER = [
    "base",
    "full",
    "random",
    "random-close",
    "independent",
    "one-pass",
    "bridge",
    "bridge-atp",
    "bridge-global",
    "rho1",
    "tokencleaning",
    "llm+tc",
    "bridge-fill",
    "bridge-global-fill",
    "bridge-answer",
    "importance",
    "tilt",
    "stratified",
    "random-resp",
    "bridge-resp",
    "bridge-digits",
    "importance-resp",
    "importance-loss-resp",
    "tilt-resp",
    "bridge-resp-answer",
    "bridge-debiased",
    "bridge-resp-debiased",
    "example-importance",
    "rho-loss",
    "importance-loss-resp-trim",
    "bridge-resp-trim",
]
#: the general-capability tasks (grid.sh GENERAL), in the paper's column order
GENERAL = (("arc_challenge", "ARC-C"), ("hellaswag", "HellaSwag"), ("mmlu", "MMLU"), ("humaneval", "HumanEval"))
#: per-item measures: (results key, sub-key, label, higher is better)
ITEMS = (
    ("gsm8k_accuracy", None, "GSM8K acc", True),
    ("math500_accuracy", None, "MATH-500 acc", True),
    ("answer_loss", "gsm8k", "GSM8K answer loss", False),
    ("answer_loss", "math500", "MATH-500 answer loss", False),
)


def _order(method: str) -> tuple[int, str]:
    """Table order: ORDER's, a control full-match-X right after X, anything else last."""
    base = method[len("full-match-") :] if method.startswith("full-match-") else method
    rank = ORDER.index(base) if base in ORDER else len(ORDER)
    return (rank, method)


def _summary_only(m: dict) -> bool:
    """Whether a general task's entry was recorded from its summary alone: no items, a score and its n."""
    return m.get("items") is None and bool(m.get("n")) and m.get("score") is not None


def _items_array(items: list) -> np.ndarray:
    """A run's per-item values as floats, None as NaN."""
    return np.array([np.nan if v is None else v for v in items], dtype=np.float64)


class Group:
    """The runs (seeds) of one method at one retention."""

    def __init__(self, method: str, rho: float, runs: list[dict]):
        self.method, self.rho, self.runs = method, rho, sorted(runs, key=lambda r: r["seed"] or 0)

    def _stacked(self, *path: str) -> np.ndarray | None:
        """Every seed's ``items`` under ``path`` in its run (None values as NaN), stacked: [seeds, ...]; None
        when a seed lacks them or the seeds disagree on their shape."""
        arrs = []
        for r in self.runs:
            m = r
            for key in path:
                m = (m or {}).get(key)
            if not m or not m.get("items"):
                return None
            arrs.append(_items_array(m["items"]))
        return np.stack(arrs) if len({a.shape for a in arrs}) == 1 else None

    def items(self, name: str) -> np.ndarray | None:
        """[seeds, examples, 2] per-example (loss sum, tokens), or None when a seed lacks them."""
        return self._stacked("heldout", name)

    def loss(self, name: str) -> float | None:
        vals = [r["heldout"][name]["loss"] for r in self.runs if (r.get("heldout") or {}).get(name)]
        return float(np.mean(vals)) if vals else None

    def seed_sd(self, name: str) -> float | None:
        vals = [r["heldout"][name]["loss"] for r in self.runs if (r.get("heldout") or {}).get(name)]
        return float(np.std(vals, ddof=1)) if len(vals) > 1 else None

    def item_values(self, key: str, sub: str | None) -> np.ndarray | None:
        """[seeds, items] per-item values (accuracy 0/1, or a loss; NaN where missing), or None when a
        seed lacks them or the seeds disagree on the items."""
        return self._stacked(key, sub) if sub is not None else self._stacked(key)

    def general(self, task: str) -> np.ndarray | None:
        """[seeds, items] of a general-capability task's per-item score (the metric its average uses). A seed
        whose task was recorded from its summary alone (``items`` null: its per-item results were lost) stands
        as its share of right items in item order (``lost`` says so, and its differences are drawn unpaired)."""
        stacked = self._stacked("general", task)
        if stacked is not None or not self.lost(task):
            return stacked
        arrs = []
        for r in self.runs:
            m = (r.get("general") or {}).get(task) or {}
            if m.get("items"):
                arrs.append(_items_array(m["items"]))
            elif _summary_only(m):
                right = round(m["score"] * m["n"])
                arrs.append(np.concatenate([np.ones(right), np.zeros(m["n"] - right)]))
            else:
                return None
        return np.stack(arrs) if len({a.shape for a in arrs}) == 1 else None

    def lost(self, task: str) -> bool:
        """Whether a seed's ``task`` was recorded from its summary alone (``items`` null, a score and its n)."""
        return any(_summary_only((r.get("general") or {}).get(task) or {}) for r in self.runs)

    def general_all(self) -> list[np.ndarray] | None:
        """Every general task's items, or None when a task is missing (no average then)."""
        tasks = [self.general(t) for t, _ in GENERAL]
        return None if any(t is None for t in tasks) else tasks  # type: ignore[return-value]

    def unpaired(self, other: Group | None = None) -> list[int]:
        """The indices (in GENERAL) of the tasks recorded from their summary alone, here or in ``other``."""
        return [k for k, (t, _) in enumerate(GENERAL) if self.lost(t) or (other is not None and other.lost(t))]

    def mean_of(self, *keys: str) -> float | None:
        vals = []
        for r in self.runs:
            v = r
            for k in keys:
                v = (v or {}).get(k)
            if v is not None:
                vals.append(v)
        return float(np.mean(vals)) if vals else None


def groups_of(results: dict) -> dict[tuple[str, float], Group]:
    by: dict[tuple[str, float], list[dict]] = defaultdict(list)
    for run in results["runs"].values():
        by[(run["method"], float(run["rho"]))].append(run)
    return {k: Group(k[0], k[1], v) for k, v in by.items()}


def fmt(ci) -> str:
    return "n/a" if ci is None else f"{ci[0]:.4f} [{ci[1]:.4f}, {ci[2]:.4f}]"


def fmt_int(x) -> str:
    return "" if x is None else f"{x:,.0f}"


def table(groups: dict, resamples: int) -> str:
    acc = any(r.get("gsm8k_accuracy") for g in groups.values() for r in g.runs)
    multi = any(len(g.runs) > 1 for g in groups.values())
    head = ["method", "rho", "seeds"]
    for _, label in FILES:
        head.append(f"{label} loss [95% CI]")
        if multi:
            head.append("seed sd")
    head += ["executed tokens", "supervised tokens", "wall s / run"]
    if acc:
        head.append("GSM8K acc")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(groups, key=lambda k: (_order(k[0]), -k[1])):
        g = groups[key]
        row = [g.method, "-" if g.method in ("base", "full") else f"{g.rho:g}", str(len(g.runs))]
        for name, _ in FILES:
            h = [r["heldout"][name] for r in g.runs if (r.get("heldout") or {}).get(name)]
            fallback = (
                (np.mean([x["loss"] for x in h]), np.mean([x["ci_low"] for x in h]), np.mean([x["ci_high"] for x in h]))
                if h
                else None
            )
            row.append(fmt(interval(g.items(name), resamples, fallback)))
            if multi:
                sd = g.seed_sd(name)
                row.append("" if sd is None else f"{sd:.4f}")
        row += [
            fmt_int(g.mean_of("tokens", "executed")),
            fmt_int(g.mean_of("tokens", "supervised")),
            fmt_int(g.mean_of("seconds", "total")),
        ]
        if acc:
            a = g.mean_of("gsm8k_accuracy", "accuracy")
            row.append("" if a is None else f"{100 * a:.1f}%")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _measures(groups: dict) -> list[tuple]:
    return [m for m in ITEMS if any(g.item_values(m[0], m[1]) is not None for g in groups.values())]


def fmt_item(ci, accuracy: bool) -> str:
    if ci is None:
        return "n/a"
    if accuracy:
        return f"{100 * ci[0]:.1f} [{100 * ci[1]:.1f}, {100 * ci[2]:.1f}]"
    return fmt(ci)


def item_table(groups: dict, resamples: int) -> str:
    """Accuracy and answer-span loss per row, with 95% intervals over items (accuracy in %)."""
    measures = _measures(groups)
    if not measures:
        return ""
    head = ["method", "rho", "seeds"] + [f"{label} [95% CI]" + (" %" if hi else "") for _, _, label, hi in measures]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(groups, key=lambda k: (_order(k[0]), -k[1])):
        g = groups[key]
        row = [g.method, "-" if g.method in ("base", "full") else f"{g.rho:g}", str(len(g.runs))]
        row += [fmt_item(item_interval(g.item_values(k, sub), resamples), hi) for k, sub, _, hi in measures]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def versus(groups: dict, resamples: int, ref: str = "random") -> str:
    """Every row minus ``ref`` at the same retention, paired over items (accuracy in points) and over
    held-out examples (losses); ``beats`` marks an interval entirely on the winning side of 0."""
    measures = _measures(groups)
    cols = [(m, label) for m in measures for label in [m[2]]] + [(None, f"{label} loss") for _, label in FILES]
    lines = [
        f"| minus {ref} | rho | " + " | ".join(c[1] + " (paired 95% CI)" for c in cols) + f" | beats {ref} on |",
        "|---|---|" + "---|" * (len(cols) + 1),
    ]
    for (method, rho), g in sorted(groups.items(), key=lambda kv: (_order(kv[0][0]), -kv[0][1])):
        if method == ref or (method == "base" and ref != "full"):  # against full, base says what training adds
            continue
        if (ref, rho) in groups:
            refs = [(ref, rho)]
        elif ref == "full" and (ref, 1.0) in groups:  # full SFT has no retention: every row against it
            refs = [(ref, 1.0)]
        elif method == "full":  # full against the reference at each retention
            refs = [k for k in groups if k[0] == ref]
        else:
            continue
        for rk in refs:
            other = groups[rk]
            cells, wins = [], []
            for m, label in cols:
                if m is not None:
                    key, sub, _, higher = m
                    d = item_paired(g.item_values(key, sub), other.item_values(key, sub), resamples)
                    cells.append(fmt_item(d, higher) if higher else fmt(d))
                else:
                    name = next(n for n, lab in FILES if f"{lab} loss" == label)
                    d = paired(g.items(name), other.items(name), resamples)
                    higher = False
                    cells.append(fmt(d))
                if d is not None and ((higher and d[1] > 0) or (not higher and d[2] < 0)):
                    wins.append(label)
            shown = rho if rk == ("full", 1.0) else rk[1]  # against full: the row's own retention
            shown_rho = "-" if method == "base" else f"{shown:g}"
            lines.append(f"| {method} | {shown_rho} | " + " | ".join(cells) + f" | {', '.join(wins) or '-'} |")
    return "\n".join(lines)


def rank_agreement(groups: dict) -> str:
    """Does a loss order the trained rows as accuracy does? Per file, over the rows (method, rho; base left
    out) that have both: how many pairs of rows the loss orders as accuracy does (a lower loss with a higher
    accuracy), of the pairs whose accuracies differ."""
    pairs = [
        ("gsm8k_accuracy", ("answer_loss", "gsm8k"), "GSM8K answer loss"),
        ("gsm8k_accuracy", ("heldout", "gsm8k"), "GSM8K test loss"),
        ("math500_accuracy", ("answer_loss", "math500"), "MATH-500 answer loss"),
        ("math500_accuracy", ("heldout", "math500"), "MATH-500 loss"),
    ]
    lines = []
    for acc_key, (key, sub), label in pairs:
        points = []
        for (method, _rho), g in sorted(groups.items()):
            acc = g.mean_of(acc_key, "accuracy")
            loss = g.mean_of(key, sub, "loss")
            if method != "base" and acc is not None and loss is not None:
                points.append((acc, loss))
        judged = [(a, b) for i, a in enumerate(points) for b in points[i + 1 :] if a[0] != b[0]]
        if len(points) < 3 or not judged:
            continue
        same = sum((a[0] - b[0]) * (a[1] - b[1]) < 0 for a, b in judged)
        lines.append(f"| {label} | {len(points)} | {same} of {len(judged)} |")
    if not lines:
        return ""
    head = "| loss against accuracy | trained rows | pairs of rows it orders as accuracy does |\n|---|---|---|\n"
    return head + "\n".join(lines)


def costs(results: dict, groups: dict) -> str:
    """GPU seconds: the shared steps once, and per run (mean over seeds) select..compact, train, eval."""
    shared = results.get("shared") or {}
    lines = []
    if shared:
        lines.append("shared steps (s): " + ", ".join(f"{k} {v}" for k, v in shared.items()))
        lines.append("")
    lines += ["| method | rho | select..compact s | train s | eval s | train s / full's |", "|---|---|---|---|---|---|"]
    full = groups.get(("full", 1.0))
    full_train = full.mean_of("seconds", "train") if full else None
    for key in sorted(groups, key=lambda k: (_order(k[0]), -k[1])):
        g = groups[key]
        prep = [
            sum((r.get("seconds") or {}).get(k, 0) for k in ("select", "close", "inspect", "compact")) for r in g.runs
        ]
        train = g.mean_of("seconds", "train")
        ratio = f"{train / full_train:.2f}" if train and full_train else ""
        lines.append(
            f"| {g.method} | {'-' if g.method in ('base', 'full') else f'{g.rho:g}'} | "
            f"{fmt_int(np.mean(prep)) if g.method != 'base' else ''} | {fmt_int(train)} | "
            f"{fmt_int(g.mean_of('seconds', 'eval'))} | {ratio} |"
        )
    return "\n".join(lines)


def _markdown(head: list[str], rows: list[list[str]]) -> str:
    """A markdown table: the header, its rule, one line per row."""
    return "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    )


def _in_order(groups: dict, keys=None) -> list[Group]:
    """The groups (of ``keys``, default all) in table order."""
    return [groups[k] for k in sorted(groups if keys is None else keys, key=lambda k: (_order(k[0]), -k[1]))]


def _rho(g: Group) -> str:
    return "-" if g.method in ("base", "full") else f"{g.rho:g}"


def _pct(ci) -> str:
    return "n/a" if ci is None else f"{100 * ci[0]:.1f} [{100 * ci[1]:.1f}, {100 * ci[2]:.1f}]"


def _ratio(x: float | None, of: float | None) -> str:
    return f"{x / of:.2f}" if x and of else ""


def general_table(groups: dict, resamples: int) -> str:
    """The paper's retention columns: each general task's score (%, 95% interval over items), their average,
    and the average minus full SFT's and minus the untrained model's, paired (a stratified bootstrap)."""
    have = [k for k, g in groups.items() if any(g.general(t) is not None for t, _ in GENERAL)]
    refs = [groups.get(("full", 1.0)), groups.get(("base", 1.0))]
    rows = []
    for g in _in_order(groups, have):
        tasks = g.general_all()
        row = [g.method, _rho(g), str(len(g.runs))]
        row += [_pct(item_interval(g.general(t), resamples)) + _lost(g.lost(t)) for t, _ in GENERAL]
        row.append(_pct(task_mean(tasks, resamples)) if tasks else "")
        for ref in refs:
            other = ref.general_all() if ref is not None and ref is not g else None
            if not (tasks and other):
                row.append("")
                continue
            lost = g.unpaired(ref)
            row.append(_pct(task_mean(tasks, resamples, against=other, unpaired=lost)) + _lost(lost))
        rows.append(row)
    head = ["method", "rho", "seeds", *(f"{label} %" for _, label in GENERAL)]
    head += ["General Avg. %", "minus full SFT (paired)", "minus base (paired)"]
    return _markdown(head, rows) + _lost_note(rows) if rows else ""


LOST = " †"


def _lost(lost) -> str:
    """The mark of a cell whose task (or one of whose tasks) was recorded from its summary alone."""
    return LOST if lost else ""


def _lost_note(rows: list[list[str]]) -> str:
    """The footnote of a table with a marked cell."""
    if not any(c.endswith(LOST) for r in rows for c in r):
        return ""
    return (
        "\n\n†: a task recorded from its run's summary alone (its per-item results were lost; results.json says"
        " where the numbers come from): its interval, and those of the averages and differences it enters, are"
        " drawn unpaired, so wider than paired ones (two fine-tunings of one model agree on most items)."
    )


def general_versus(groups: dict, resamples: int, ref: str) -> str:
    """Each general task of every row minus ``ref``'s, paired over items, in points, and the General Avg.'s
    difference (paired per task, as in the retention table). Against full SFT or the untrained model (one
    row, no retention) every row is compared; against a selection, each row at ``ref``'s retention."""
    rows = []
    head_tasks: list[tuple[str, str]] = []
    for g in _in_order(groups):
        if g.method == ref or (g.method == "base" and ref not in ("full", "base")):
            continue
        other = groups.get((ref, 1.0)) if ref in ("full", "base") else groups.get((ref, g.rho))
        if other is None:
            continue
        tasks = [(t, label) for t, label in GENERAL if other.general(t) is not None]
        if not tasks or not any(g.general(t) is not None for t, _ in tasks):
            continue
        head_tasks = head_tasks or tasks
        mine, theirs = g.general_all(), other.general_all()
        lost = g.unpaired(other)
        avg = _pct(task_mean(mine, resamples, against=theirs, unpaired=lost)) + _lost(lost) if mine and theirs else ""
        cells = []
        for t, _ in head_tasks:
            unpaired = g.lost(t) or other.lost(t)
            d = item_paired(g.general(t), other.general(t), resamples, unpaired=unpaired)
            cells.append(_pct(d) + _lost(unpaired))
        rows.append([g.method, _rho(g), str(len(g.runs)), *cells, avg])
    head = [f"minus {ref}", "rho", "seeds", *(f"{label} (paired)" for _, label in head_tasks), "General Avg. (paired)"]
    return _markdown(head, rows) + _lost_note(rows) if rows else ""


def _cost(g: Group | None, *keys: str) -> float | None:
    return g.mean_of("cost", *keys) if g is not None else None


def _shared_gpu(g: Group | None) -> int:
    """How many rows shared the GPU of any seed of ``g`` (grid.sh PROCS_PER_GPU; 1: each ran alone). Such a
    row's seconds are a shared GPU's wall time, not GPU-seconds of its own: they enter no GPU-second ratio."""
    return max((int((r.get("cost") or {}).get("gpu_processes", 1)) for r in g.runs), default=1) if g else 1


def _gpu_seconds(g: Group | None, key: str) -> float | None:
    """``cost.KEY`` (seconds) where they are GPU-seconds of the row's own: None for a row that shared its GPU."""
    return None if _shared_gpu(g) > 1 else _cost(g, key)


def _shared_seconds(g: Group) -> float:
    """The mean over seeds of the shared steps' seconds in the row's pipeline (everything but its own steps)."""
    own = ("select", "close", "compact", "train")
    return float(
        np.mean(
            [
                sum(v for k, v in (r.get("cost") or {}).get("pipeline_seconds", {}).items() if k not in own)
                for r in g.runs
            ]
        )
    )


def _user_seconds(g: Group) -> float | None:
    """The row's pipeline GPU-seconds less the time between its training steps (the grid's checkpoints, which
    a user's run without --save-every does not pay); None where a seed's log did not record it."""
    if _shared_gpu(g) > 1 or any("train_between_steps_seconds" not in (r.get("cost") or {}) for r in g.runs):
        return None
    return float(np.mean([r["cost"]["pipeline_total"] - r["cost"]["train_between_steps_seconds"] for r in g.runs]))


def cost_table(groups: dict) -> str:
    """Cost as users pay it (bench/results/grid_cost.py): training tokens executed (padding counted apart),
    training FLOPs by the stated formula, and the GPU-seconds of the row's whole pipeline (the warm-up, scoring
    and reference passes it needs, select to compact, train), each also as a share of full SFT's; from the training
    log, the steps' own seconds (what a row's length can change) and the seconds between steps (the grid's
    checkpoints), and the pipeline's seconds less those as a share of full SFT's (where both logs have them). A row
    that shared its GPU with other rows (grid.sh PROCS_PER_GPU) shows its wall seconds, marked, and no GPU-second
    ratio."""
    full = groups.get(("full", 1.0))
    rows = []
    full_user = _user_seconds(full) if full is not None else None
    full_secs = _gpu_seconds(full, "pipeline_total")
    for g in _in_order(groups, [k for k, g in groups.items() if any(r.get("cost") for r in g.runs)]):
        flops, secs, shared = _cost(g, "train_flops"), _cost(g, "pipeline_total"), _shared_gpu(g)
        wall = f"{fmt_int(secs)} (wall, {shared} rows on one GPU)" if shared > 1 and secs is not None else fmt_int(secs)
        rows.append([
            g.method, _rho(g), str(len(g.runs)), fmt_int(_cost(g, "train_steps")), fmt_int(_cost(g, "train_executed")),
            fmt_int(_cost(g, "train_computed")), "" if flops is None else f"{flops:.3g}",
            _ratio(flops, _cost(full, "train_flops")), wall, fmt_int(_shared_seconds(g)),
            _ratio(_gpu_seconds(g, "pipeline_total"), full_secs), fmt_int(_cost(g, "train_step_seconds")),
            fmt_int(_cost(g, "train_between_steps_seconds")), _ratio(_user_seconds(g), full_user),
        ])  # fmt: skip
    head = ["method", "rho", "seeds", "train steps", "train tokens executed", "with padding", "train FLOPs",
            "FLOPs / full SFT", "pipeline GPU-s", "of which shared steps", "GPU-s / full SFT",
            "training steps' own s", "between steps s (checkpoints)", "GPU-s less checkpoints / full SFT"]  # fmt: skip
    return _markdown(head, rows) if rows else ""


def verdict(groups: dict, resamples: int) -> str:
    """What a user decides on: per trained row, GSM8K accuracy minus full SFT, the general average minus full
    SFT (both paired, in points) and the training FLOPs and pipeline GPU-seconds relative to full SFT's."""
    full = groups.get(("full", 1.0))
    if full is None or full.general_all() is None:
        return ""
    rows = []
    for g in _in_order(groups):
        if g is full:
            continue
        target = item_paired(g.item_values("gsm8k_accuracy", None), full.item_values("gsm8k_accuracy", None), resamples)
        tasks = g.general_all()
        lost = g.unpaired(full)
        general = task_mean(tasks, resamples, against=full.general_all(), unpaired=lost) if tasks else None
        untrained = "0" if g.method == "base" else ""
        rows.append([
            g.method, _rho(g), str(len(g.runs)), _pct(target), _pct(general) + _lost(lost and general),
            _ratio(_cost(g, "train_flops"), _cost(full, "train_flops")) or untrained,
            _ratio(_gpu_seconds(g, "pipeline_total"), _gpu_seconds(full, "pipeline_total"))
            or ("shared GPU" if _shared_gpu(g) > 1 else untrained),
        ])  # fmt: skip
    head = ["method", "rho", "seeds", "GSM8K acc minus full SFT", "General Avg. minus full SFT",
            "training FLOPs / full", "pipeline GPU-s / full"]  # fmt: skip
    return _markdown(head, rows) + _lost_note(rows)


def differences(groups: dict, resamples: int, ref: str = "bridge") -> str:
    """bridge minus every other row at the same retention (and minus full SFT), paired."""
    lines = [
        f"| {ref} minus | rho | " + " | ".join(f"{label} (paired 95% CI)" for _, label in FILES) + " |",
        "|---|---|" + "---|" * len(FILES),
    ]
    rhos = sorted({k[1] for k in groups if k[0] == ref}, reverse=True)
    for rho in rhos:
        mine = groups[(ref, rho)]
        others = [k for k in groups if k[1] == rho and k[0] != ref] + [k for k in groups if k[0] == "full"]
        for key in sorted(others, key=lambda k: _order(k[0])):
            other = groups[key]
            cells = [fmt(paired(mine.items(n), other.items(n), resamples)) for n, _ in FILES]
            lines.append(f"| {other.method} | {rho:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if rhos else ""


def plot(groups: dict, path: Path, resamples: int) -> bool:
    """Finding 3: BRIDGE - Independent held-out loss as retention falls. False when no pair exists."""
    rhos = sorted({k[1] for k in groups if k[0] == "bridge" and ("independent", k[1]) in groups}, reverse=True)
    if not rhos:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for shift, (name, label) in zip((-0.004, 0.004), FILES):
        xs, ys, errs = [], [], [[], []]
        for rho in rhos:
            d = paired(groups[("bridge", rho)].items(name), groups[("independent", rho)].items(name), resamples)
            if d is None:
                continue
            xs.append(rho + shift)
            ys.append(d[0])
            errs[0].append(d[0] - d[1])
            errs[1].append(d[2] - d[0])
        if xs:
            ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=label)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlim(max(rhos) + 0.05, min(rhos) - 0.05)  # retention falls to the right
    ax.set_xticks(rhos)
    ax.set_xlabel("retention rho_p = rho_r")
    ax.set_ylabel("held-out loss: BRIDGE - Independent")
    ax.set_title("Finding 3 (negative: BRIDGE lower), 95% paired CI", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--plot", type=Path, help="also draw Finding 3 (bridge minus independent) into this PNG")
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument(
        "--versus",
        action="append",
        default=[],
        metavar="METHOD",
        help="also every row minus METHOD at the same retention, paired (repeatable; random and full always)",
    )
    ap.add_argument(
        "--seed",
        action="append",
        type=int,
        default=[],
        help="only the runs of this training seed (repeatable; the untrained base row is kept): "
        "a seed-matched comparison instead of the mean over seeds",
    )
    args = ap.parse_args(argv)
    if not args.results.is_file():
        print(f"grid_table.py: error: {args.results}: no such file", file=sys.stderr)
        return 2
    try:
        results = json.loads(args.results.read_text())
    except json.JSONDecodeError as exc:  # a results.json cut short (a copy that did not finish)
        print(
            f"grid_table.py: error: {args.results}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            file=sys.stderr,
        )
        return 2
    if args.seed:
        runs = results.get("runs", {})
        results["runs"] = {k: r for k, r in runs.items() if r.get("seed") is None or r["seed"] in args.seed}
    groups = groups_of(results)
    if not groups:
        seeds = f" of seed {', '.join(map(str, args.seed))}" if args.seed else ""
        print(f"grid_table.py: error: {args.results}: no runs{seeds} recorded", file=sys.stderr)
        return 2
    absent = [m for m in args.versus if not any(k[0] == m for k in groups)]
    if absent:
        print(f"grid_table.py: error: {args.results}: no {', '.join(absent)} row to compare with", file=sys.stderr)
        return 2
    print(table(groups, args.resamples))
    for part in (
        item_table(groups, args.resamples),
        versus(groups, args.resamples),
        versus(groups, args.resamples, ref="full") if ("full", 1.0) in groups else "",
        *(versus(groups, args.resamples, ref=m) for m in args.versus),
        rank_agreement(groups),
        differences(groups, args.resamples),
        costs(results, groups),
        general_table(groups, args.resamples),
        general_versus(groups, args.resamples, "full"),
        general_versus(groups, args.resamples, "base"),
        general_versus(groups, args.resamples, "random"),
        *(general_versus(groups, args.resamples, m) for m in args.versus if m not in ("full", "base", "random")),
        cost_table(groups),
        verdict(groups, args.resamples),
    ):
        if part:
            print()
            print(part)
    if args.plot is None:  # the tables only: a PNG is written where asked for (a default one beside RESULTS
        return 0  # once overwrote the committed plot of another grid in the same folder)
    if plot(groups, args.plot, args.resamples):
        print(f"\nFinding-3 plot: {args.plot}", file=sys.stderr)
    else:
        print("\nno bridge/independent pair at any retention yet: no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""PNG figures (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..io import atomic_path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> None:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=130, bbox_inches="tight", format="png")


STYLES = {
    ("exact", "prompt"): ("tab:blue", "-", "o"),
    ("exact", "response"): ("tab:orange", "-", "s"),
    ("surrogate", "prompt"): ("tab:blue", "--", "o"),
    ("surrogate", "response"): ("tab:orange", "--", "s"),
}


def shift_plot(report: dict, path: str | Path) -> None:
    """1 - Spearman against opposite-side retention, one line per (scores, side), mean with a band
    of +- one standard error."""
    plt = _pyplot()
    levels = report["levels"]
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for scores, sides in report["summary"].items():
        for side, per_level in sides.items():
            mean = np.array([np.nan if s["mean"] is None else s["mean"] for s in per_level])
            std = np.array([np.nan if s["std"] is None else s["std"] for s in per_level])
            cnt = np.array([max(1, s["count"]) for s in per_level])
            se = std / np.sqrt(cnt)
            color, ls, marker = STYLES.get((scores, side), (None, "-", "o"))
            label = f"{side} ({scores})"
            ax.plot(levels, mean, ls=ls, marker=marker, color=color, label=label, ms=4)
            ax.fill_between(levels, mean - se, mean + se, color=color, alpha=0.12, lw=0)
    ax.set_xlabel("opposite-side retention ratio")
    ax.set_ylabel("ranking shift (1 - Spearman)")
    ax.invert_xaxis()
    n = report.get("examples_used")
    ax.set_title(f"Ranking shift vs. opposite-side retention (n = {n})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)


def stats_plot(dists: dict, path: str | Path, title: str = "") -> None:
    """Histograms of the ``bridge inspect --stats`` distributions that are present."""
    plt = _pyplot()
    panels = [(k, v) for k, v in dists.items() if v]
    if not panels:
        panels = [("no selection or closure data", [])]
    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.0 * cols, 3.0 * rows), squeeze=False)
    for ax, (name, values) in zip(axes.ravel(), panels):
        if values:
            vals = np.asarray(values, dtype=np.float64)
            integer = name.startswith("closure unit")
            bins = np.arange(vals.min() - 0.5, vals.max() + 1.5) if integer and vals.max() - vals.min() < 60 else 30
            ax.hist(vals, bins=bins, color="tab:blue", alpha=0.8)
            if integer:
                ax.set_yscale("log")  # a few long units beside many one-token ones
                ax.set_xlabel("tokens")
            ax.axvline(float(np.median(vals)), color="k", lw=1, ls="--", label=f"median {np.median(vals):.3g}")
            ax.legend(fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(panels) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)

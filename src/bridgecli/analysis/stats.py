"""``bridge inspect --stats``: per-example distributions of a stream's selection and closure."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..format.reader import open_reader
from .tokenclass import CLASSES, Retention

#: distribution name -> what it measures
DISTRIBUTIONS = {
    "prompt kept ratio": "selected prompt tokens / eligible prompt tokens, per example",
    "response kept ratio": "selected response tokens / eligible response tokens, per example (token level)",
    "supervised ratio (closure)": "supervised response tokens after closure / eligible response tokens",
    "U_sur relative gain over rounds": "(U_sur after the last update - after the first) / |after the first|",
    "U_sur gain over rounds": "U_sur after the last update - after the first",
    "closure unit size": "tokens per closure unit (all units)",
    "closure chosen unit size": "tokens per chosen closure unit",
}


def collect(path: str | None) -> tuple[dict, dict[str, list[float]], list[list[float]]]:
    """(stream info, distributions, U_sur trajectories normalised by their first value)."""
    d: dict[str, list[float]] = {k: [] for k in DISTRIBUTIONS}
    trajectories: list[list[float]] = []
    kept_p, kept_r = Retention(), Retention()
    with open_reader(path) as reader:
        info: dict[str, Any] = {"file": reader.name, "stage": reader.header.stage, "examples": 0}
        for ex in reader:
            info["examples"] += 1
            prompt, resp = ex.tokens.prompt_positions(), ex.tokens.response_positions()
            m, n = len(prompt), len(resp)
            sel = ex.selection
            if sel is not None:
                spans = ex.tokens.spans()
                kept_p.add(ex.text, spans[prompt], np.isin(prompt, sel.prompt_keep))
                supervised = ex.closure.supervise if ex.closure is not None else sel.response_keep
                kept_r.add(ex.text, spans[resp], np.isin(resp, supervised))
                if m:
                    d["prompt kept ratio"].append(len(sel.prompt_keep) / m)
                if n:
                    d["response kept ratio"].append(len(sel.response_keep) / n)
                u = sel.u_sur
                if len(u) > 1:
                    d["U_sur gain over rounds"].append(u[-1] - u[0])
                    if u[0] != 0:
                        d["U_sur relative gain over rounds"].append((u[-1] - u[0]) / abs(u[0]))
                        trajectories.append([x / abs(u[0]) for x in u])
            cl = ex.closure
            if cl is not None:
                if n:
                    d["supervised ratio (closure)"].append(len(cl.supervise) / n)
                units = np.asarray(cl.units, dtype=np.int64).reshape(-1, 2)
                sizes = (units[:, 1] - units[:, 0]).tolist()
                d["closure unit size"] += sizes
                d["closure chosen unit size"] += [sizes[k] for k in cl.chosen]
    if sum(kept_p.total.values()) + sum(kept_r.total.values()):
        info["token_classes"] = {
            "response_set": "closure" if info["stage"] == "closure" else "selection",
            "prompt": kept_p.table(),
            "response": kept_r.table(),
        }
    return info, d, trajectories


def describe(values: list[float]) -> dict | None:
    if not values:
        return None
    v = np.asarray(values, dtype=np.float64)
    q = np.quantile(v, [0.0, 0.1, 0.5, 0.9, 1.0])
    return {
        "count": int(v.size),
        "mean": float(v.mean()),
        "std": float(v.std()),
        "min": float(q[0]),
        "p10": float(q[1]),
        "median": float(q[2]),
        "p90": float(q[3]),
        "max": float(q[4]),
    }


def histogram(values: list[float], bins: int = 10) -> dict | None:
    if not values:
        return None
    counts, edges = np.histogram(np.asarray(values, dtype=np.float64), bins=bins)
    return {"counts": counts.tolist(), "edges": [float(e) for e in edges]}


def summarize_stats(path: str | None) -> tuple[dict, dict[str, list[float]]]:
    """(the JSON summary: per distribution its quantiles and a 10-bin histogram; the raw values)."""
    info, dists, traj = collect(path)
    out = {**info, "distributions": {}}
    for name, values in dists.items():
        desc = describe(values)
        if desc is not None:
            out["distributions"][name] = {"what": DISTRIBUTIONS[name], **desc, "histogram": histogram(values)}
    if traj:
        width = max(len(t) for t in traj)
        cols = [[t[k] for t in traj if len(t) > k] for k in range(width)]
        out["u_sur_mean_trajectory"] = [float(np.mean(c)) for c in cols]
    return out, dists


def render(summary: dict):
    """A rich table of the distributions."""
    from rich.table import Table

    t = Table(title=f"{summary['file']}  (stage {summary['stage']}, {summary['examples']} examples)")
    t.add_column("distribution", style="bold")
    for col in ("count", "mean", "min", "p10", "median", "p90", "max"):
        t.add_column(col, justify="right")
    for name, d in summary["distributions"].items():
        t.add_row(name, str(d["count"]), *(f"{d[c]:.4g}" for c in ("mean", "min", "p10", "median", "p90", "max")))
    if "u_sur_mean_trajectory" in summary:
        t.caption = "mean U_sur / |first U_sur| after each update: " + " ".join(
            f"{x:.3f}" for x in summary["u_sur_mean_trajectory"]
        )
    return t


def render_classes(summary: dict):
    """A rich table of retention per token class (None when the stream has no selection)."""
    from rich.table import Table

    tc = summary.get("token_classes")
    if tc is None:
        return None
    resp_word = "supervised" if tc["response_set"] == "closure" else "selected"
    t = Table(title=f"retention per token class (response: {resp_word} after {tc['response_set']})")
    t.add_column("class", style="bold")
    for col in ("prompt tokens", "kept", "response tokens", resp_word):
        t.add_column(col, justify="right")

    def cell(c: dict) -> str:
        return "-" if c["fraction"] is None else f"{c['kept']} ({100 * c['fraction']:.1f}%)"

    for c in CLASSES:
        p, r = tc["prompt"][c], tc["response"][c]
        t.add_row(c, str(p["tokens"]), cell(p), str(r["tokens"]), cell(r))
    return t


def run_stats(path: str | None, *, as_json: bool = False, png: str | None = None) -> dict:
    """Print the distributions (a table, or JSON) and optionally draw their histograms."""
    import json

    from rich.console import Console

    from ..io import check_output
    from ..progress import note

    if png:
        check_output(png, inputs=(path,), stdout=False)
    summary, dists = summarize_stats(path)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        console = Console(highlight=False)
        console.print(render(summary))
        classes = render_classes(summary)
        if classes is not None:
            console.print(classes)
        if not summary["distributions"]:
            note("no selection or closure in this stream: run `bridge select` (and `bridge close`) first")
    if png:
        from .plots import stats_plot

        shown = {k: v for k, v in dists.items() if k != "U_sur gain over rounds"}
        stats_plot(shown, png, title=f"{summary['file']} ({summary['examples']} examples)")
        note(f"wrote {png}")
    return summary

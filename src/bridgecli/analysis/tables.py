"""Rich tables of the ``bridge analyze`` reports (the JSON reports hold every number) and of ``bridge inspect``'s
summary of a stream."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .fidelity import METRIC_TITLES, METRICS, PAPER_TABLE2, fmt

if TYPE_CHECKING:
    from rich.console import JustifyMethod


def _side_table(title: str, second: str):
    """A table whose first column names the side (prompt or response) and whose second is ``second``."""
    from rich.table import Table

    t = Table(title=title)
    t.add_column("side", style="bold")
    t.add_column(second)
    return t


def fidelity_table(report: dict):
    p = report["params"]
    t = _side_table(
        f"Selection-level fidelity: rho_p={p['rho_p']}, rho_r={p['rho_r']}, T={p['rounds']}, "
        f"{p['perturb']} perturbation, n={report['examples_used']}",
        "proxy",
    )
    t.add_column("source", style="dim")
    for m in METRICS:
        t.add_column(METRIC_TITLES[m] + (" ↓" if m == "regret" else " ↑"), justify="right")
    last_side = None
    for row in report["table"]:
        if last_side is not None and row["side"] != last_side:
            t.add_section()
        last_side = row["side"]
        t.add_row(
            row["side"],
            row["proxy"],
            f"ours (n={row['examples']})",
            *(fmt(row[m], with_std=m in ("spearman", "overlap")) for m in METRICS),
        )
        paper = PAPER_TABLE2.get((row["side"], row["proxy"]))
        if paper is not None:
            t.add_row(
                "", "", "paper (n=200)", *(fmt({"mean": paper[m][0], "std": paper[m][1]}) for m in METRICS), style="dim"
            )
    t.caption = (
        "Spearman and top-b overlap: mean ± std over examples; Jaccard and regret: mean. "
        "paper: Table 2, 200 MetaMathQA examples, Llama-3.2-3B"
    )
    return t


def shift_table(report: dict):
    levels = report["levels"]
    p = report["params"]
    t = _side_table(
        f"Ranking shift (1 - Spearman with full retention), {p['subset']} opposite-side subsets, "
        f"n={report['examples_used']}",
        "scores",
    )
    for rho in levels:
        t.add_column(f"{rho:g}", justify="right")
    for scores, sides in report["summary"].items():
        for side, per_level in sides.items():
            t.add_row(side, scores, *(fmt(s, with_std=False, digits=3) for s in per_level))
    t.caption = "columns: the opposite side's retention ratio; cells: mean over examples (std in the JSON)"
    return t


def robustness_table(report: dict):
    from rich.table import Table

    p = report["params"]
    t = Table(
        title=f"Full-state selection robustness (Theorem 1): rho_p={p['rho_p']}, rho_r={p['rho_r']}, "
        f"n={report['examples_used']}"
    )
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("side", "left"),
        ("examples", "right"),
        ("mean b", "right"),
        ("mean b_opp", "right"),
        ("robust at b_opp", "right"),
        ("robust at every q", "right"),
        ("first q<0 / n (median)", "right"),
        ("robust from q / n (median)", "right"),
    )
    for col, just in columns:
        t.add_column(col, justify=just, style="bold" if col == "side" else None)
    for row in report["table"]:
        if not row.get("examples"):
            t.add_row(row["side"], "0", *["—"] * 6)
            continue
        fn, rf = row["first_negative_fraction"], row["robust_from_fraction"]
        t.add_row(
            row["side"],
            str(row["examples"]),
            f"{row['mean_b']:.1f}",
            f"{row['mean_b_opposite']:.1f}",
            "—" if row["robust_at_b_opposite"] is None else f"{row['robust_at_b_opposite']:.1%}",
            f"{row['robust_at_every_q']:.1%}",
            "—" if fn["median"] is None else f"{fn['median']:.3f}",
            "—" if rf["median"] is None else f"{rf['median']:.3f}",
        )
    t.caption = (
        "robust at b_opp: kappa_q >= 0 at q = the opposite side's budget, i.e. the full-state top-b stays "
        "optimal for every opposite subset of that size; robust from q: kappa_q' >= 0 for all q' >= q"
    )
    return t


def _share(x) -> str:
    return "—" if x is None else f"{x:.1%}"


def _num(x, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def decompose_table(report: dict):
    """Per token class: the share of a_j > 0, of the target part > 0 (no anchor), the signs the anchor
    decides and the median |anchor| / |target|; with a common direction the debiased a_j's too."""
    from rich.table import Table

    lam = report["direction"].get("lambda")
    deb = report.get("debiased")
    t = Table(
        title=f"a_j = target part + anchor part (lambda {lam:g}), by token class, "
        f"{report['tokens']:,} response tokens of {report['examples_used']} examples"
    )
    columns = ["class", "tokens", "a_j > 0", "target > 0 (lambda 0)", "sign set by anchor", "median |anchor|/|target|"]
    if deb is not None:
        columns += ["debiased > 0", "debiased: sign set by anchor"]
    for col in columns:
        t.add_column(col, justify="left" if col == "class" else "right", style="bold" if col == "class" else None)
    for cls, row in report["a"]["classes"].items():
        cells = [
            cls,
            f"{row['tokens']:,}",
            _share(row["share_positive"]),
            _share(row["share_target_positive"]),
            _share(row["share_sign_set_by_anchor"]),
            _share(row["median_anchor_over_target"]),
        ]
        if deb is not None:
            d = deb["classes"].get(cls, {})
            cells += [_share(d.get("share_positive")), _share(d.get("share_sign_set_by_anchor"))]
        t.add_row(*cells)
        if cls == "all":
            t.add_section()
    ids = report["a"]["ids"]
    lines = [
        f"token id ({ids['ids']} ids with >= {ids['min_count']} tokens, {_share(ids['share_of_tokens'])} of the tokens): "
        f"explains {_share(ids['r2_on_id'])} of a_j's variance and {_share(ids['r2_sign_on_id'])} of its sign's; "
        f"{_share(ids['majority_sign_share'])} of tokens carry their id's majority sign"
    ]
    if deb is not None:
        di = deb["ids"]
        lines.append(
            f"debiased a_j - beta u_j (beta {deb['beta']:.4g} from the warm-up's D_val; these tokens' own slope "
            f"{deb['beta_of_these_tokens']:.4g}): the id explains {_share(di['r2_on_id'])} of its variance and "
            f"{_share(di['r2_sign_on_id'])} of its sign's; {_share(di['majority_sign_share'])} carry the majority sign; "
            f"Pearson with u_j {_num(deb['pearson_a_u'])} for a_j, {_num(deb['pearson_debiased_u'])} debiased"
        )
    else:
        lines.append("no common direction in this warm-up run (rerun `bridge warmup` for the debiased a_j)")
    t.caption = "\n".join(lines)
    return t


# -- bridge inspect ------------------------------------------------------------------------------

_SUMMARY_KEYS = (
    "producer",
    "created",
    "source",
    "examples",
    "tokens",
    "eligible_prompt_tokens",
    "eligible_response_tokens",
)


def _cell(v) -> str:
    """A value of the summary as a table cell: the stream's strings are data, shown with no markup and
    no control character (bridgecli.display)."""
    import json

    from ..display import markup

    if isinstance(v, float):
        return f"{v:.4g}"
    return markup(json.dumps(v) if isinstance(v, (dict, list)) else v)


def _short(v, width: int = 48) -> str:
    """:func:`_cell`, cut to ``width`` characters (before markup is escaped, so no escape is cut)."""
    import json

    from ..display import markup, printable

    text = printable(f"{v:.4g}" if isinstance(v, float) else json.dumps(v) if isinstance(v, (dict, list)) else v)
    return markup(text if len(text) <= width else text[: width - 1] + "…")


def summary_tables(info: dict) -> list:
    """``bridge inspect``'s tables of a stream's summary (:func:`bridgecli.steps.inspect.summarize`): the
    header and totals, then every step with its parameters."""
    from rich.table import Table

    from ..display import markup

    t = Table(title=markup(f"{info['file']}  (format {info['format']}, stage {info['stage']})"), show_header=False)
    t.add_column(style="bold")
    t.add_column()
    for key in _SUMMARY_KEYS:
        t.add_row(key, _cell(info[key]))
    for key, val in info["model"].items():
        t.add_row(f"model.{markup(key)}", _cell(val))
    for section in ("scores", "selection", "closure", "rows"):
        for key, val in (info.get(section) or {}).items():
            t.add_row(f"{section}.{markup(key)}", _cell(val))
    steps = Table(title="steps", show_lines=True)
    steps.add_column("step", style="bold")
    steps.add_column("by / at")
    steps.add_column("parameters")
    for s in info["steps"]:
        params = "\n".join(f"{markup(k)} = {_short(v)}" for k, v in s["params"].items())
        steps.add_row(_cell(s["step"]), f"{_cell(s['producer'])}\n{_cell(s['time'])}", params)
    return [t, steps]

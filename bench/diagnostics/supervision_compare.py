#!/usr/bin/env python3
"""What BRIDGE supervises against what random supervises at the same budget (issue 28, item 2).

    python bench/diagnostics/supervision_compare.py \\
        --stream bridge:0.5=closed-0.5.bridge --stream bridge:0.75=closed-0.75.bridge \\
        --stream random:0.5=random-0.5.bridge --stream random:0.75=random-0.75.bridge \\
        --json results/supervision.json --md results/supervision.md

Each ``--stream METHOD:RHO=FILE`` is one selection of the same scored examples (the same records, in
any order): after ``bridge close`` its supervised tokens are the closure's, else the selection's
``response_keep``. For a closed stream the selection before closure is reported too
(``METHOD-select``). The streams need the scores (a_j and the per-token loss at theta_bar,
``Scores.loss``) and, for the loss at theta_old, ``bridge reference`` run on them (``--ref NAME``,
default ``base``).

Per method and retention: the supervised share of b_r; the share of supervised tokens with a_j > 0;
the per-token loss at theta_old and at theta_bar of the supervised and the unsupervised tokens (mean
and quantiles); the supervised share per token class and per decile of position in the response
and of loss at theta_old. For closed streams, the budget left unspent (sum over examples of
b_r - |supervised|, when positive) split by cause, per example:

- ``q<=0``: every unit with q(u) > 0 was chosen; the rest of b_r would have had to come from units
  with q(u) <= 0, which closure never takes;
- ``no fit``: some units with q(u) > 0 were left out, each longer than the budget left over;
- ``other``: a unit with q(u) > 0 that would have fitted was left out (not expected from the exact
  knapsack; float rounding), or anything else.

Token classes (first that applies): answer (the final ``#### N`` line or ``\\boxed{}``), calc (inside
a GSM8K ``<<...>>``), latex (inside a LaTeX region), digits, operators (``= + - * / ^ \\ { } < > %``
and the like), newline, words, space/punct. Pure reading of streams: no model, seconds.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import diag_common as dc  # noqa: E402

from bridgecli.analysis.tokenclass import _CALCULATION, _overlaps, classify_tokens, math_spans  # noqa: E402
from bridgecli.core.closure import unit_values  # noqa: E402
from bridgecli.core.protect import region  # noqa: E402
from bridgecli.format.reader import open_reader  # noqa: E402

CLASSES = ("answer", "calc", "latex", "digits", "operators", "newline", "words", "space/punct")
_OPERATOR = re.compile(r"[=+\-*/^\\{}<>×÷≤≥%]")


def fine_classes(text: str, token_spans) -> list[str]:
    """One class of :data:`CLASSES` per token (``token_spans`` index ``text``): the package's classes
    (``analysis.tokenclass``), with its math split into calc, latex and operators (which take in
    ``-`` too, and come before digits inside a calculation or a LaTeX region) and newline split off."""
    token_spans = np.asarray(token_spans, dtype=np.int64).reshape(-1, 2)
    calcs = [m.span() for m in _CALCULATION.finditer(text)]
    calc = _overlaps(token_spans, calcs)
    latex = _overlaps(token_spans, [s for s in math_spans(text) if s not in calcs])
    out = []
    for t, (cls, (s, e)) in enumerate(zip(classify_tokens(text, token_spans), token_spans.tolist())):
        piece = text[s:e]
        if cls == "answer":
            pass
        elif calc[t] or latex[t]:
            cls = "calc" if calc[t] else "latex"
        elif cls == "digits":
            pass
        elif cls == "math" or _OPERATOR.search(piece):
            cls = "operators"
        elif "\n" in piece:
            cls = "newline"
        out.append(cls)
    return out


def unspent_causes(units: np.ndarray, chosen: list[int], q: np.ndarray, b_r: int, supervised: int) -> dict:
    """The budget an example leaves unspent and its cause (see the module docstring)."""
    left = b_r - supervised
    out = {"unspent": max(0, left), "q<=0": 0, "no fit": 0, "other": 0}
    if left <= 0:
        return out
    sizes = units[:, 1] - units[:, 0]
    taken = np.zeros(len(units), dtype=bool)
    taken[np.asarray(chosen, dtype=np.int64)] = True
    missed = (~taken) & (q > 0)
    if not missed.any():
        out["q<=0"] = left
    elif sizes[missed].min() > left:
        out["no fit"] = left
    else:
        out["other"] = left
    return out


class Tally:
    """Everything one method/retention supervises, token by token."""

    def __init__(self):
        self.sup: list[np.ndarray] = []
        self.a: list[np.ndarray] = []
        self.loss_old: list[np.ndarray] = []
        self.loss_bar: list[np.ndarray] = []
        self.cls: list[str] = []
        self.decile: list[np.ndarray] = []
        self.ids: list[np.ndarray] = []
        self.text: dict[int, str] = {}  # a token id's text (its first occurrence)
        self.b_r = 0
        self.n = 0
        self.unspent = defaultdict(int)
        self.tokens_in_nonpositive_units = 0
        self.examples = 0
        self.examples_nothing_supervised = 0

    def cat(self, name):
        return np.concatenate(getattr(self, name)) if getattr(self, name) else np.zeros(0)


def supervised_mask(ex, use_closure: bool) -> np.ndarray:
    resp = ex.tokens.response_positions()
    chosen = ex.closure.supervise if use_closure else ex.selection.response_keep
    return np.isin(resp, np.asarray(chosen, dtype=np.int64))


def read(path: str, ref: str) -> tuple[list, bool]:
    with open_reader(path) as reader:
        exs = list(reader)
    for ex in exs:
        if ex.scores is None or ex.selection is None:
            raise SystemExit(f"{path}: example {ex.index} ({ex.id}) has no scores or no selection")
        if ex.scores.loss is None:
            raise SystemExit(f"{path}: example {ex.index} ({ex.id}) has no per-token loss (Scores.loss)")
        r = ex.references.get(ref)
        if r is None or r.response_loss is None:
            raise SystemExit(
                f"{path}: example {ex.index} ({ex.id}) has no reference {ref!r} response loss: "
                "run `bridge reference` on the scored stream first"
            )
    closed = all(ex.closure is not None for ex in exs)
    return exs, closed


def collect(exs: list, use_closure: bool, ref: str) -> Tally:
    t = Tally()
    for ex in exs:
        resp = ex.tokens.response_positions()
        n = len(resp)
        t.examples += 1
        if n == 0:
            continue
        sup = supervised_mask(ex, use_closure)
        spans = ex.tokens.spans()[resp]
        sub, shifted = region(ex.text, spans)
        t.sup.append(sup)
        t.a.append(ex.scores.a.numpy().astype(np.float64))
        t.loss_old.append(ex.references[ref].response_loss.numpy().astype(np.float64))
        t.loss_bar.append(ex.scores.loss.numpy().astype(np.float64))
        t.cls += fine_classes(sub, shifted)
        ids = np.asarray(ex.tokens.input_ids, dtype=np.int64)[resp]
        t.ids.append(ids)
        for tid, (s, e) in zip(ids.tolist(), shifted.tolist()):
            t.text.setdefault(tid, sub[s:e])
        t.decile.append(np.minimum(9, (10 * np.arange(n)) // n))
        t.b_r += int(ex.selection.b_r)
        t.n += n
        t.examples_nothing_supervised += int(not sup.any())
        if use_closure:
            units = np.asarray(ex.closure.units, dtype=np.int64).reshape(-1, 2)
            local = [np.searchsorted(resp, np.arange(s, e)) for s, e in units.tolist()]
            q = unit_values(local, ex.selection.response_scores.numpy().astype(np.float64), ex.closure.alpha)
            t.tokens_in_nonpositive_units += int(sum(len(u) for u, v in zip(local, q) if v <= 0))
            for k, v in unspent_causes(units, ex.closure.chosen, q, ex.selection.b_r, int(sup.sum())).items():
                t.unspent[k] += v
        else:
            t.unspent["unspent"] += max(0, int(ex.selection.b_r) - int(sup.sum()))
    return t


def share(mask: np.ndarray) -> float | None:
    return float(mask.mean()) if len(mask) else None


def id_retention(t: Tally, frequent: np.ndarray) -> dict:
    """How evenly a selection covers the frequent token ids: the spread of the per-id supervised
    share, and the tokens (and loss at theta_old) of ids supervised less than 20% of the time."""
    sup, ids, lo = t.cat("sup").astype(bool), t.cat("ids").astype(np.int64), t.cat("loss_old")
    if not len(frequent):
        return {}
    ret = np.array([sup[ids == i].mean() for i in frequent])
    rare = np.isin(ids, frequent[ret < 0.2])
    return {
        "per_id_retention_std": float(ret.std()),
        "share_tokens_in_ids_below_0.2": float(rare.mean()),
        "share_loss_in_ids_below_0.2": float(lo[rare].sum() / lo.sum()) if lo.sum() > 0 else None,
        "retention": {int(i): float(r) for i, r in zip(frequent, ret)},
    }


def summarize(t: Tally, loss_deciles: np.ndarray) -> dict:
    sup, a = t.cat("sup").astype(bool), t.cat("a")
    lo, lb = t.cat("loss_old"), t.cat("loss_bar")
    cls = np.array(t.cls)
    pos = t.cat("decile").astype(np.int64)
    loss_dec = np.clip(np.searchsorted(loss_deciles, lo, side="right"), 0, 9)
    out = {
        "examples": t.examples,
        "examples_nothing_supervised": t.examples_nothing_supervised,
        "response_tokens": t.n,
        "b_r": t.b_r,
        "supervised": int(sup.sum()),
        "supervised_over_b_r": int(sup.sum()) / t.b_r if t.b_r else None,
        "supervised_over_n": int(sup.sum()) / t.n if t.n else None,
        # the share of all response tokens' loss that lies on supervised tokens (random: about rho)
        "loss_mass_supervised_old": float(lo[sup].sum() / lo.sum()) if lo.sum() > 0 else None,
        "loss_mass_supervised_bar": float(lb[sup].sum() / lb.sum()) if lb.sum() > 0 else None,
        "share_a_positive_supervised": share(a[sup] > 0),
        "share_a_positive_unsupervised": share(a[~sup] > 0),
        "mean_a_supervised": float(a[sup].mean()) if sup.any() else None,
        "loss_old_supervised": dc.quantiles(lo[sup]),
        "loss_old_unsupervised": dc.quantiles(lo[~sup]),
        "loss_bar_supervised": dc.quantiles(lb[sup]),
        "loss_bar_unsupervised": dc.quantiles(lb[~sup]),
        "classes": {
            c: {
                "tokens": int((cls == c).sum()),
                "supervised": int((sup & (cls == c)).sum()),
                "retention": share(sup[cls == c]),
                "share_of_supervised": float((sup & (cls == c)).sum() / sup.sum()) if sup.any() else None,
            }
            for c in CLASSES
        },
        "position_deciles": [share(sup[pos == d]) for d in range(10)],
        "loss_old_deciles": [share(sup[loss_dec == d]) for d in range(10)],
        "unspent": dict(t.unspent),
        "unspent_over_b_r": t.unspent["unspent"] / t.b_r if t.b_r else None,
    }
    if "q<=0" in t.unspent:
        out["tokens_in_nonpositive_units_over_n"] = t.tokens_in_nonpositive_units / t.n if t.n else None
        out["unspent_causes_over_b_r"] = {k: t.unspent[k] / t.b_r for k in ("q<=0", "no fit", "other")}
    return out


def r_squared(y: np.ndarray, groups: np.ndarray) -> float | None:
    """Share of the variance of ``y`` explained by the group means (one-way ANOVA's eta squared)."""
    total = ((y - y.mean()) ** 2).sum()
    if total == 0:
        return None
    _, inv = np.unique(groups, return_inverse=True)
    means = np.bincount(inv, weights=y) / np.bincount(inv)
    return float(1 - ((y - means[inv]) ** 2).sum() / total)


def id_table(t: Tally, min_count: int) -> tuple[dict, np.ndarray]:
    """Is a_j a property of the token id? Over the ids occurring at least ``min_count`` times: the
    variance of a_j and of sign(a_j) their id explains, the share of each id's occurrences that carry
    its majority sign, and the ids one by one (most frequent first)."""
    a, lo, ids = t.cat("a"), t.cat("loss_old"), t.cat("ids").astype(np.int64)
    uniq, counts = np.unique(ids, return_counts=True)
    frequent = uniq[counts >= min_count][np.argsort(-counts[counts >= min_count], kind="stable")]
    m = np.isin(ids, frequent)
    rows = []
    majority = []
    for i in frequent:
        k = ids == i
        pos = float((a[k] > 0).mean())
        majority.append(max(pos, 1 - pos) * k.sum())
        rows.append(
            {
                "id": int(i),
                "text": t.text.get(int(i), ""),
                "tokens": int(k.sum()),
                "share_a_positive": pos,
                "mean_a": float(a[k].mean()),
                "mean_loss_old": float(lo[k].mean()),
            }
        )
    out = {
        "min_count": min_count,
        "ids": int(len(frequent)),
        "share_of_tokens": float(m.mean()) if len(m) else None,
        "r2_a_on_id": r_squared(a[m], ids[m]) if m.any() else None,
        "r2_sign_on_id": r_squared((a[m] > 0).astype(np.float64), ids[m]) if m.any() else None,
        "majority_sign_share": float(sum(majority) / m.sum()) if m.any() else None,
        "frequent": rows,
    }
    return out, frequent


def token_table(t: Tally, loss_deciles: np.ndarray) -> dict:
    """What the scores say about every token, whatever the selection: per class and per loss decile,
    the mean a_j, the share a_j > 0 and the mean losses; and how a_j relates to the loss."""
    a, lo, lb = t.cat("a"), t.cat("loss_old"), t.cat("loss_bar")
    cls = np.array(t.cls)
    dec = np.clip(np.searchsorted(loss_deciles, lo, side="right"), 0, 9)

    def cell(m):
        return {
            "tokens": int(m.sum()),
            "mean_a": float(a[m].mean()) if m.any() else None,
            "share_a_positive": share(a[m] > 0),
            "mean_loss_old": float(lo[m].mean()) if m.any() else None,
            "mean_loss_bar": float(lb[m].mean()) if m.any() else None,
            "loss_mass_old": float(lo[m].sum() / lo.sum()) if lo.sum() > 0 else None,
        }

    return {
        "tokens": int(len(a)),
        "share_a_positive": share(a > 0),
        "spearman_a_loss_old": dc.spearman(a, lo),
        "spearman_abs_a_loss_old": dc.spearman(np.abs(a), lo),
        "spearman_a_loss_bar": dc.spearman(a, lb),
        "spearman_abs_a_loss_bar": dc.spearman(np.abs(a), lb),
        "spearman_loss_old_loss_bar": dc.spearman(lo, lb),
        "loss_old_decile_edges": loss_deciles.tolist(),
        "classes": {c: cell(cls == c) for c in CLASSES},
        "loss_old_deciles": [cell(dec == d) for d in range(10)],
    }


def parse_stream(spec: str) -> tuple[str, str, str]:
    label, sep, path = spec.partition("=")
    method, sep2, rho = label.partition(":")
    if not sep or not sep2 or not path:
        raise SystemExit(f"--stream {spec!r}: write METHOD:RHO=FILE")
    return method, rho, path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stream", action="append", required=True, help="METHOD:RHO=FILE (repeat)")
    ap.add_argument("--ref", default="base", help="the reference whose losses are theta_old's (bridge reference --as)")
    ap.add_argument("--min-id-count", type=int, default=20, help="token ids this frequent get per-id statistics")
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    args = ap.parse_args(argv)

    started = dc.provenance("cpu", None, {"ref": args.ref})
    rows: dict[str, dict] = {}
    tokens = None
    ids = None
    for spec in args.stream:
        method, rho, path = parse_stream(spec)
        exs, closed = read(path, args.ref)
        exs.sort(key=lambda e: e.index)
        these = [e.id for e in exs]
        if ids is None:
            ids = these
        elif these != ids:
            raise SystemExit(f"{path}: not the same examples as the first stream ({len(these)} against {len(ids)})")
        if tokens is None:
            first = collect(exs, False, args.ref)
            edges = np.quantile(first.cat("loss_old"), np.linspace(0.1, 0.9, 9))
            tokens = token_table(first, edges)
            tokens["token_ids"], frequent = id_table(first, args.min_id_count)
        if closed:
            t = collect(exs, False, args.ref)
            rows[f"{method}-select:{rho}"] = {"file": path, **summarize(t, edges), "ids": id_retention(t, frequent)}
        t = collect(exs, closed, args.ref)
        rows[f"{method}:{rho}"] = {
            "file": path,
            "closed": closed,
            **summarize(t, edges),
            "ids": id_retention(t, frequent),
        }

    result = {
        "provenance": started,
        "examples": len(ids or []),
        "tokens": tokens,
        "rows": rows,
    }
    dc.write_json(args.json, result)
    if args.md:
        dc.write_atomic(args.md, markdown(result))
    print(markdown(result))
    return 0


def markdown(r: dict) -> str:
    rows, tok = r["rows"], r["tokens"]
    names = sorted(rows, key=lambda k: (k.split(":")[1], k.split(":")[0]))
    out = [
        "## What BRIDGE supervises against random (supervision_compare.py)",
        "",
        f"commit {r['provenance']['commit']}, {r['provenance']['date']}, {r['examples']} examples, "
        f"{tok['tokens']:,} response tokens. `{r['provenance']['command']}`",
        "",
        f"Every token: a_j > 0 for {dc.fmt(tok['share_a_positive'])}; Spearman(a_j, loss at theta_old) "
        f"{dc.fmt(tok['spearman_a_loss_old'])}, Spearman(|a_j|, loss at theta_old) "
        f"{dc.fmt(tok['spearman_abs_a_loss_old'])}; at theta_bar {dc.fmt(tok['spearman_a_loss_bar'])} and "
        f"{dc.fmt(tok['spearman_abs_a_loss_bar'])}.",
        "",
        dc.table(
            [
                "row",
                "b_r",
                "supervised / b_r",
                "unspent / b_r",
                "q<=0",
                "no fit",
                "other",
                "tokens in q<=0 units / n",
                "loss mass sup. (theta_old / theta_bar)",
                "a_j > 0 (sup.)",
                "a_j > 0 (unsup.)",
                "loss theta_old sup. mean / median",
                "unsup.",
                "loss theta_bar sup. mean / median",
                "unsup.",
            ],
            [
                [
                    k,
                    v["b_r"],
                    v["supervised_over_b_r"],
                    v["unspent_over_b_r"],
                    *(
                        [v["unspent_causes_over_b_r"][c] for c in ("q<=0", "no fit", "other")]
                        if "unspent_causes_over_b_r" in v
                        else ["-", "-", "-"]
                    ),
                    v.get("tokens_in_nonpositive_units_over_n", "-"),
                    f"{dc.fmt(v['loss_mass_supervised_old'])} / {dc.fmt(v['loss_mass_supervised_bar'])}",
                    v["share_a_positive_supervised"],
                    v["share_a_positive_unsupervised"],
                    f"{dc.fmt(v['loss_old_supervised']['mean'])} / {dc.fmt(v['loss_old_supervised']['q50'])}",
                    f"{dc.fmt(v['loss_old_unsupervised']['mean'])} / {dc.fmt(v['loss_old_unsupervised']['q50'])}",
                    f"{dc.fmt(v['loss_bar_supervised']['mean'])} / {dc.fmt(v['loss_bar_supervised']['q50'])}",
                    f"{dc.fmt(v['loss_bar_unsupervised']['mean'])} / {dc.fmt(v['loss_bar_unsupervised']['q50'])}",
                ]
                for k, v in ((k, rows[k]) for k in names)
            ],
        ),
        "",
        "Supervised share per token class (tokens per class in the header; the last rows: what the scores say "
        "about every token of the class):",
        "",
        dc.table(
            ["row", *[f"{c} ({tok['classes'][c]['tokens']})" for c in CLASSES]],
            [[k, *[rows[k]["classes"][c]["retention"] for c in CLASSES]] for k in names]
            + [
                ["mean a_j", *[tok["classes"][c]["mean_a"] for c in CLASSES]],
                ["a_j > 0", *[tok["classes"][c]["share_a_positive"] for c in CLASSES]],
                ["mean loss theta_old", *[tok["classes"][c]["mean_loss_old"] for c in CLASSES]],
                ["share of all loss at theta_old", *[tok["classes"][c]["loss_mass_old"] for c in CLASSES]],
            ],
        ),
        "",
        "Supervised share per decile of position in the response (0 = first tenth):",
        "",
        dc.table(["row", *[str(d) for d in range(10)]], [[k, *rows[k]["position_deciles"]] for k in names]),
        "",
        _id_markdown(r, names),
        "",
        "Supervised share per decile of loss at theta_old (0 = easiest tenth), and what the scores say per decile:",
        "",
        dc.table(
            ["row", *[str(d) for d in range(10)]],
            [[k, *rows[k]["loss_old_deciles"]] for k in names]
            + [
                ["mean loss theta_old", *[c["mean_loss_old"] for c in tok["loss_old_deciles"]]],
                ["mean a_j", *[c["mean_a"] for c in tok["loss_old_deciles"]]],
                ["a_j > 0", *[c["share_a_positive"] for c in tok["loss_old_deciles"]]],
            ],
        ),
        "",
    ]
    return "\n".join(out)


def _id_markdown(r: dict, names: list[str], top: int = 20) -> str:
    ti, rows = r["tokens"]["token_ids"], r["rows"]
    if not ti.get("ids"):
        return ""
    head = (
        f"Token ids occurring at least {ti['min_count']} times ({ti['ids']} ids, {dc.fmt(ti['share_of_tokens'])} of "
        f"the tokens): their id explains {dc.fmt(ti['r2_a_on_id'])} of the variance of a_j and "
        f"{dc.fmt(ti['r2_sign_on_id'])} of that of sign(a_j); {dc.fmt(ti['majority_sign_share'])} of the tokens "
        "carry their id's majority sign. Spread of the per-id supervised share (std) and the tokens in ids "
        "supervised less than 20% of the time: "
        + "; ".join(
            f"{k} {dc.fmt(rows[k]['ids']['per_id_retention_std'])} / "
            f"{dc.fmt(rows[k]['ids']['share_tokens_in_ids_below_0.2'])}"
            for k in names
            if rows[k].get("ids")
        )
        + ". The most frequent ids:"
    )
    table_rows = []
    for row in ti["frequent"][:top]:
        table_rows.append(
            [
                repr(row["text"]).replace("|", "\\|"),
                row["tokens"],
                row["share_a_positive"],
                row["mean_a"],
                row["mean_loss_old"],
                *[
                    rows[k]["ids"]["retention"].get(str(row["id"]), rows[k]["ids"]["retention"].get(row["id"]))
                    for k in names
                ],
            ]
        )
    return head + "\n\n" + dc.table(["token", "count", "a_j > 0", "mean a_j", "loss theta_old", *names], table_rows)


if __name__ == "__main__":
    sys.exit(main())

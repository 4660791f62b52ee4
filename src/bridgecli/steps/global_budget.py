"""``select --budget global``: the first pass that turns one stream-wide budget into per-example budgets.

The gain of a token (docs/method.md, "Global budget") is its marginal gain in U_sur at its example's
own solution under the per-example budgets: with (S_p, S_r) what the schedule selects for that example
at b_p = ceil(rho_p m), b_r = ceil(rho_r n), prompt token i gains Delta_p(i | S_r) and response token j
gains Delta_r(j | S_p). Protected tokens gain +inf (they are taken first). The stream-wide budget is
the sum of the per-example ones, spent on the largest gains (one pool over both sides, or one pool
per side); each example then gets as budget its number of tokens among them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.allocate import GainSpill
from ..core.budgets import budget
from ..core.protect import protected_sets
from ..core.select import surrogate_of
from ..errors import FormatError
from ..format.reader import open_reader
from ..io import reporting_write_errors
from ..format.records import Example
from ..contracts import first_pass_sees
from ..hookspecs import Plan, Selector
from .common import naming, require_stage

#: --budget choice -> allocate pool
MODES = {"global": "shared", "global-sides": "sides"}


def example_gains(
    example: Example, selector: Selector, b_p: int, b_r: int, options: dict, f_p: np.ndarray, f_r: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(prompt gains [m], response gains [n]) of one example at its per-example solution."""
    sur = surrogate_of(example)
    if len(f_p) or len(f_r):
        options = {**options, "_protect_prompt": f_p, "_protect_response": f_r}
    res = selector(example, b_p, b_r, options)
    gp = sur.delta_p(np.asarray(res.response, dtype=np.int64)).astype(np.float64)
    gr = sur.delta_r(np.asarray(res.prompt, dtype=np.int64)).astype(np.float64)
    if np.isnan(gp).any() or np.isnan(gr).any():
        raise FormatError("the scores give a NaN gain", record=example.index, field="scores")
    gp[f_p] = np.inf
    gr[f_r] = np.inf
    return gp, gr


def plan_global(
    inp: str | None,
    display: str,
    selector: Selector,
    mode: str,
    rho_p: float,
    rho_r: float,
    options: dict,
    protect: tuple[list, list],
) -> Plan:
    """Read the stream once; returns every example's budgets and a summary for the step parameters
    (``options``: what ``selector.parse`` returned)."""
    indices: list[int] = []
    seen: set[int] = set()
    total_p = total_r = 0
    with GainSpill() as spill, reporting_write_errors(Path(spill.paths[0]).parent):  # a full /tmp: one line
        with open_reader(inp) as reader:
            require_stage(reader.header, "scores", display, "run `bridge score` first")
            for ex in reader:
                with naming(display, ex.index):
                    first_pass_sees(seen, ex)
                    if ex.scores is None:
                        raise FormatError("the example has no scores", record=ex.index, hint="run `bridge score` first")
                    m, n = len(ex.tokens.prompt_positions()), len(ex.tokens.response_positions())
                    b_p, b_r = budget(rho_p, m), budget(rho_r, n)
                    f_p, f_r = protected_sets(ex, *protect)
                    spill.add(*example_gains(ex, selector, b_p, b_r, options, f_p, f_r))
                indices.append(ex.index)
                total_p += b_p
                total_r += b_r
        pool = MODES[mode]
        result = spill.allocate(pool, total=total_p + total_r, totals=(total_p, total_r))
    budgets = dict(zip(indices, (tuple(b) for b in result["budgets"])))
    spent_p = sum(b for b, _ in result["budgets"])
    spent_r = sum(b for _, b in result["budgets"])
    summary = {
        "budget": mode,
        "pool": pool,
        "total": total_p + total_r,
        "total_p": spent_p,
        "total_r": spent_r,
        "per_example_total_p": total_p,
        "per_example_total_r": total_r,
        "threshold": result["threshold"],
    }
    return Plan(budgets, summary)

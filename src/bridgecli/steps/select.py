"""``bridge select``: per-example budgets and the chosen selector."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import msgspec
import numpy as np

from ..core.budgets import budget
from ..errors import FormatError
from ..io import is_stdio
from ..format.records import Array, Example, Header, Selection
from ..registry import get
from .common import map_stream, step_record


@dataclass
class SelectOptions:
    inp: str | None = None
    out: str | None = None
    method: str = "bridge"
    rho_p: float = 0.75
    rho_r: float = 0.75
    rounds: int = 4
    options: dict = field(default_factory=dict)  # --option key=value, passed to the selector


def select_example(example: Example, fn, method: str, rho_p: float, rho_r: float, options: dict) -> Example:
    if example.scores is None:
        raise FormatError("the example has no scores", record=example.index, hint="run `bridge score` first")
    prompt = example.tokens.prompt_positions()
    resp = example.tokens.response_positions()
    declared = getattr(fn, "budgets", None)  # a selector may declare its own per-side budgets
    if declared is not None:
        b_p, b_r = (int(b) for b in declared(example, rho_p, rho_r, options))
    else:
        b_p, b_r = budget(rho_p, len(prompt)), budget(rho_r, len(resp))
    result = fn(example, b_p, b_r, options)
    if len(result.prompt) != min(b_p, len(prompt)) or len(result.response) != min(b_r, len(resp)):
        raise FormatError(f"selector '{method}' returned {len(result.prompt)}/{len(result.response)} tokens for "
                          f"budgets {b_p}/{b_r}", record=example.index)
    sel = Selection(
        method=method, b_p=b_p, b_r=b_r,
        prompt_keep=prompt[np.asarray(result.prompt, dtype=np.int64)].tolist(),
        response_keep=resp[np.asarray(result.response, dtype=np.int64)].tolist(),
        response_scores=Array.of(result.response_scores), u_sur=[float(u) for u in result.u_sur],
        achieved_rho_p=len(result.prompt) / len(prompt) if len(prompt) else None,
        achieved_rho_r=len(result.response) / len(resp) if len(resp) else None,
    )
    return msgspec.structs.replace(example, selection=sel, closure=None)


def run_select(opts: SelectOptions) -> int:
    from . import params

    params.real("--rho-p", opts.rho_p, low=0, high=1)
    params.real("--rho-r", opts.rho_r, low=0, high=1)
    params.integer("-T/--rounds", opts.rounds, high=params.MAX_ROUNDS)
    entry = get("selector", opts.method)
    options = {**opts.options, "rounds": opts.rounds}
    params = {"method": opts.method, "rho_p": opts.rho_p, "rho_r": opts.rho_r, "rounds": opts.rounds,
              "plugin": entry.plugin}
    if opts.options:
        params["options"] = dict(opts.options)
    if callable(getattr(entry.obj, "parse", None)):
        entry.obj.parse(options)  # report bad --option values before reading anything

    def fn(ex: Example, header: Header) -> Example:
        return select_example(ex, entry.obj, opts.method, opts.rho_p, opts.rho_r, options)

    prepare = getattr(entry.obj, "prepare", None)  # budgets that depend on the whole stream: read it twice
    from ..baselines.passes import first_pass, rereadable

    display = "<stdin>" if is_stdio(opts.inp) else str(opts.inp)
    with (rereadable(opts.inp) if prepare is not None else nullcontext(opts.inp)) as inp:
        if prepare is not None and (plan := first_pass(prepare, inp, opts.rho_p, opts.rho_r, options, display)):
            params["budgets"] = plan
        return map_stream(inp, opts.out, step=step_record("select", params), stage="selection", needs="scores",
                          hint="run `bridge score` first", fn=fn, label="selecting", display=display)

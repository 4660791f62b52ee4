"""``bridge select``: per-example budgets and the chosen selector."""

from __future__ import annotations

from contextlib import nullcontext

import msgspec
import numpy as np

from ..core.protect import compile_patterns, protected_sets
from ..core.select import SelectionResult
from ..errors import FormatError, UsageError
from ..io import is_stdio
from ..format.records import Array, Example, Header, Selection
from ..contracts import as_selector, plan_budgets
from ..format.spec import MAX_RESULT
from ..optionspec import recorded
from ..hookspecs import Plan, Selector
from ..registry import get
from .common import MapArgs, map_stream, map_stream_parallel, selection_of, step_record
from .options import SelectOptions
from .presets import Expanded, expand


def select_example(
    example: Example,
    selector: Selector,
    method: str,
    rho_p: float,
    rho_r: float,
    options: dict,
    protect: tuple[list, list] = ([], []),
    plan: Plan | None = None,
) -> Example:
    """Select one example. ``options`` is what ``selector.parse`` returned; ``protect`` holds the
    finders of the protected prompt / response tokens; ``plan`` gives the budgets when they come
    from a first pass over the stream (the selector's ``prepare``, or --budget global)."""
    if example.scores is None:
        raise FormatError("the example has no scores", record=example.index, hint="run `bridge score` first")
    prompt = example.tokens.prompt_positions()
    resp = example.tokens.response_positions()
    if plan is not None:
        b_p, b_r = plan_budgets(plan, example)
        if plan.options:
            options = {**options, **plan.options}
    else:
        b_p, b_r = (int(b) for b in selector.budgets(example, rho_p, rho_r, options))
    f_p, f_r = protected_sets(example, *protect)
    if len(f_p) or len(f_r):
        options = {**options, "_protect_prompt": f_p, "_protect_response": f_r}
    result = selector(example, b_p, b_r, options)
    # protected tokens count against the budget; when they alone exceed it, the side holds exactly them
    want_p, want_r = min(max(b_p, len(f_p)), len(prompt)), min(max(b_r, len(f_r)), len(resp))
    if len(result.prompt) != want_p or len(result.response) != want_r:
        raise FormatError(
            f"selector '{method}' returned {len(result.prompt)}/{len(result.response)} tokens for budgets {b_p}/{b_r}",
            record=example.index,
        )
    if (len(f_p) and not np.isin(f_p, result.prompt).all()) or (len(f_r) and not np.isin(f_r, result.response).all()):
        raise FormatError(f"selector '{method}' dropped a protected token", record=example.index)
    check_result(result, method, example.index, len(prompt), len(resp))
    sel = Selection(
        method=method,
        b_p=b_p,
        b_r=b_r,
        prompt_keep=prompt[np.asarray(result.prompt, dtype=np.int64)].tolist(),
        response_keep=resp[np.asarray(result.response, dtype=np.int64)].tolist(),
        response_scores=Array.of(result.response_scores),
        u_sur=[float(u) for u in result.u_sur],
        achieved_rho_p=len(result.prompt) / len(prompt) if len(prompt) else None,
        achieved_rho_r=len(result.response) / len(resp) if len(resp) else None,
        protected_prompt=prompt[f_p].tolist(),
        protected_response=resp[f_r].tolist(),
        response_weights=None if result.response_weights is None else Array.of(result.response_weights),
    )
    return msgspec.structs.replace(example, selection=sel, closure=None)


def check_result(result: SelectionResult, method: str, record: int, m: int, n: int) -> None:
    """What a selector returned fits the stream format, or :class:`FormatError` (no stream is written that
    the next step refuses): indices ascending, distinct and within each side's ``m`` / ``n`` eligible
    tokens; ``n`` response scores; the response scores and U_sur values finite and within float32's range
    (``MAX_RESULT``). Every selector is checked alike (a few microseconds an example). The built-in selectors
    meet it on every stream the reader accepts (docs/format.md, "Numbers"); a plugin's may not."""
    for side, indices, size in (("prompt", result.prompt, m), ("response", result.response, n)):
        idx = np.asarray(indices)
        if len(idx) and (
            idx.dtype.kind not in "iu" or idx.ndim != 1 or idx[0] < 0 or idx[-1] >= size or (idx[1:] <= idx[:-1]).any()
        ):
            raise FormatError(
                f"selector '{method}' returned {side} indices that are not ascending, distinct integers in [0, {size})",
                record=record,
            )
    scores = np.asarray(result.response_scores)
    if scores.shape != (n,) or scores.dtype.kind not in "fiu":
        raise FormatError(
            f"selector '{method}' returned response scores of shape {list(scores.shape)} for {n} response tokens",
            record=record,
        )
    bad = None
    # a sum of squares within MAX_RESULT^2 (one dot product) bounds every value; NaN compares False
    if (
        n
        and not float(scores @ scores) <= MAX_RESULT**2
        and not (scores.min() >= -MAX_RESULT and scores.max() <= MAX_RESULT)
    ):
        bad = "selection.response_scores", next(float(x) for x in scores if not abs(x) <= MAX_RESULT)
    elif not all(-MAX_RESULT <= u <= MAX_RESULT for u in result.u_sur):
        bad = "selection.u_sur", next(float(u) for u in result.u_sur if not abs(u) <= MAX_RESULT)
    if bad is not None:
        raise FormatError(
            f"selector '{method}' computed {bad[1]}, which the stream format does not allow (values lie within "
            f"+-3.4e38, float32's range)",
            record=record,
            field=bad[0],
        )


def _finders(opts: "SelectOptions") -> tuple[list, list]:
    out = []
    for flag, patterns in (("--protect-prompt", opts.protect_prompt), ("--protect-response", opts.protect_response)):
        try:
            out.append(compile_patterns(patterns or [], flag))
        except ValueError as err:
            raise UsageError(str(err)) from None
    return out[0], out[1]


def run_select(opts: SelectOptions) -> int:
    from ..runtime import params as checks

    checks.check(opts)
    run = expand(opts.preset, opts.method, opts.rho_p, opts.options)  # what runs: the preset under the flags given
    entry, selector = _selector_of(opts, run.method)
    if "rounds" in run.options:  # -T would win over it unseen
        raise UsageError("--option rounds=...: the rounds are -T/--rounds", hint=f"pass -T {run.options['rounds']}")
    options = selector.parse({**run.options, "rounds": opts.rounds})  # once, before reading anything
    protect = _finders(opts)
    params = _step_params(opts, run, entry.plugin, selector)

    from .first_pass import rereadable

    display = "<stdin>" if is_stdio(opts.inp) else str(opts.inp)
    own_plan = selector.needs_plan(options)  # budgets that depend on the whole stream: read it twice
    twice = own_plan or opts.budget != "example"
    over = [0]  # examples whose protected tokens alone exceed a budget
    with rereadable(opts.inp) if twice else nullcontext(opts.inp) as inp:
        # the budgets from a first pass: the selector's own, or --budget global
        plan = _plan(opts, run.rho_p, inp, display, selector, options, protect, params, own_plan=own_plan)

        def fn(ex: Example, header: Header) -> Example:
            new = select_example(ex, selector, run.method, run.rho_p, opts.rho_r, options, protect, plan)
            if opts.workers == 1:
                over[0] += _over_budget(new)
            return new

        kwargs: MapArgs = {
            "step": step_record("select", params),
            "stage": "selection",
            "needs": "scores",
            "hint": "run `bridge score` first",
            "fn": fn,
            "label": "selecting",
            "display": display,
        }
        if opts.workers > 1:
            count, over[0] = map_stream_parallel(inp, opts.out, workers=opts.workers, tally=_over_budget, **kwargs)
        else:
            count = map_stream(inp, opts.out, **kwargs)
    if over[0]:
        from ..progress import note

        note(
            f"{over[0]} example(s) have more protected tokens than their budget: all of them are kept there, "
            f"so those examples exceed b_p / b_r"
        )
    return count


def _selector_of(opts: SelectOptions, method: str):
    """(the registry entry of ``method``, its selector), refused where ``--budget`` asks what it cannot do."""
    from .global_budget import MODES

    if opts.budget != "example" and opts.budget not in MODES:
        raise UsageError(f"--budget must be one of example, {', '.join(MODES)}; got {opts.budget!r}")
    entry = get("selector", method)
    selector = as_selector(entry.obj, method)
    if opts.budget != "example" and not selector.surrogate:
        raise UsageError(
            f"--budget {opts.budget} needs a selector that ranks by BRIDGE's surrogate (bridge, "
            f"one-pass, independent), not '{method}' (compared methods: --option ranking=global)"
        )
    return entry, selector


def _step_params(opts: SelectOptions, run: Expanded, plugin, selector: Selector) -> dict:
    """The parameters the output's step record keeps: every recorded field of the options
    (:func:`~bridgecli.optionspec.recorded`), with what ran (the preset expanded); protected tokens
    refused for a selector that cannot keep them."""
    if (opts.protect_prompt or opts.protect_response) and not selector.protects:
        raise UsageError(
            f"selector '{run.method}' cannot keep protected tokens (--protect-prompt/"
            f"--protect-response): it ranks both sides jointly or is a plugin's that does not "
            f"declare `protects`"
        )
    return recorded(opts, method=run.method, rho_p=run.rho_p, options=dict(run.options), plugin=plugin)


def _plan(
    opts: SelectOptions,
    rho_p: float,
    inp,
    display: str,
    selector: Selector,
    options: dict,
    protect: tuple[list, list],
    params: dict,
    *,
    own_plan: bool,
) -> Plan | None:
    """The budgets from a first pass over ``inp`` (the selector's own plan; --budget global's, which
    prevails), noted in ``params``; None where the budgets are per example."""
    plan: Plan | None = None
    if own_plan:
        from .first_pass import first_pass

        plan = first_pass(selector, inp, rho_p, opts.rho_r, options, display)
        if plan.summary:
            params["budgets"] = plan.summary
    if opts.budget != "example":
        from .global_budget import plan_global

        plan = plan_global(inp, display, selector, opts.budget, rho_p, opts.rho_r, options, protect)
        params["global_budget"] = plan.summary
    return plan


def _over_budget(new: Example) -> int:
    """1 when the protected tokens of a selected example alone exceed one of its budgets, else 0."""
    sel = selection_of(new)
    return int(len(sel.protected_prompt) > sel.b_p or len(sel.protected_response) > sel.b_r)

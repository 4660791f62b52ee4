"""``bridge analyze``: check BRIDGE's claims on your own checkpoint and data.

- ``fidelity``: surrogate vs exact state-conditioned scores (paper Table 2)
- ``shift``: ranking shift with the opposite side's retention (paper Finding 2)
- ``robustness``: kappa_q of the full-state selection (paper Theorem 1), from a scores stream
- ``decompose``: a_j split into its target and anchor parts by token class, and its common direction

The numbers are computed in :mod:`bridgecli.analysis`; this module loads the checkpoint, picks the
examples, runs the passes and writes the JSON report.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from .. import PRODUCER
from ..artifacts.warmup_run import WarmupMeta, WarmupRun
from ..analysis import fidelity as fid
from ..analysis import report as report_json
from ..analysis import robustness as rob
from ..analysis import shift as sh
from ..analysis.matrix_cache import MatrixCache
from ..analysis.tables import (  # noqa: F401  (re-exported: what `bridge analyze` prints)
    decompose_table,
    fidelity_table,
    robustness_table,
    shift_table,
)
from ..contracts import as_selector, build_scorer
from ..core.budgets import budget
from ..data.examples import file_digest, iter_pairs
from ..data.tokenize import tokenize_pair
from ..errors import UsageError
from ..format.reader import open_reader
from ..format.records import Example
from ..hookspecs import Selector
from ..io import atomic_path, check_output, is_stdio
from ..progress import note, progress_bar
from ..registry import get
from .common import now, plugin_spec, require_stage
from .options import DecomposeOptions, FidelityOptions, RobustnessOptions, ShiftOptions, Source

if TYPE_CHECKING:
    from ..modeling.scoring import BridgeScorer, ScoringContext


@dataclass
class Loaded:
    ctx: ScoringContext
    scorer: BridgeScorer
    meta: WarmupMeta
    run: WarmupRun

    @property
    def root(self) -> Path:
        return self.run.root


def load(src: Source) -> Loaded:
    """The warmup checkpoint, its tokenizer and v, as ``bridge score`` loads them."""
    from ..io import check_input
    from ..modeling.loading import claim_device, resolve_device
    from ..modeling.scoring import BridgeScorer, load_scoring_checkpoint

    check_input(src.data)  # before the checkpoint loads
    run = WarmupRun.open(src.run)
    src.device = device = claim_device(resolve_device(src.device))
    note(f"scoring checkpoint {run.checkpoint} on {device} ({src.dtype})")
    ck = load_scoring_checkpoint(run, src.dtype, device)
    ctx = ck.context(src.attention_layers, device)
    return Loaded(ctx=ctx, scorer=BridgeScorer(ctx), meta=ck.meta, run=run)


def pick_examples(src: Source, tokenizer, meta: WarmupMeta) -> list[Example]:
    """``n`` examples of DATA (a seeded uniform sample, or the first ``n`` with ``first``), leaving
    out the ids warmup used when DATA is the file it read, and those over ``--max-length``."""
    opts = src.data_opts
    leave_out = meta.leave_out(file_digest(src.data))
    if leave_out is not None and meta.warm_ids is None:
        note(
            "warning: DATA is the file warmup read, and warmup recorded no warm ids (no `bridge warmup --warm-fraction`): "
            "the sample may include warm examples"
        )
    leave_out = leave_out or frozenset()
    pairs = [(i, w, p) for i, w, p in iter_pairs(src.data, opts) if p.id not in leave_out]
    if leave_out:
        note(f"left out {len(leave_out)} examples used by warmup")
    if not src.first:
        random.Random(src.seed).shuffle(pairs)  # a seeded uniform sample: the first n usable of a shuffle
    out: list[Example] = []
    too_long = 0
    for index, where, pair in pairs:
        tok = tokenize_pair(tokenizer, pair, chat_template=opts.chat_template, file=str(src.data), where=where)
        if opts.max_length is not None and len(tok.tokens.input_ids) > opts.max_length:
            too_long += 1
            continue
        ex = Example(id=pair.id, index=index, text=tok.text, tokens=tok.tokens)
        if len(ex.tokens.prompt_positions()) < 2 or len(ex.tokens.response_positions()) < 2:
            continue
        out.append(ex)
        if len(out) == src.n:
            break
    if too_long:
        note(f"skipped {too_long} examples longer than --max-length")
    if not out:
        raise UsageError(f"no usable examples in {src.data}")
    if len(out) < src.n:
        note(f"only {len(out)} usable examples (asked for {src.n})")
    return sorted(out, key=lambda e: e.index)


def _check_perturb(perturb: str) -> None:
    from ..analysis.exact import PERTURBATIONS

    if perturb not in PERTURBATIONS:
        raise UsageError(f"unknown perturbation {perturb!r}; choose one of {', '.join(PERTURBATIONS)}")


def _exact_scores(loaded: Loaded, src: Source, perturb: str, neutral: str | None):
    from ..analysis.exact import ExactScores, exact_base_scorer, neutral_token_id

    neutral_id = None
    if perturb == "replace":
        try:
            neutral_id = neutral_token_id(loaded.ctx.tokenizer, neutral)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    try:
        return ExactScores(
            exact_base_scorer(loaded.ctx), perturb=perturb, neutral_id=neutral_id, batch_size=src.batch_size
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def matrix_cache(src: Source, loaded: Loaded, exact) -> MatrixCache:
    """The cache of exact prompt matrices (``--cache``), keyed by the checkpoint, v, the perturbation
    and the dtype."""
    if src.cache is None:
        return MatrixCache(None)
    from ..modeling.loading import fingerprint, resolve

    run = loaded.run
    direction = run.direction_path
    return MatrixCache(
        src.cache,
        [
            fingerprint(resolve(str(run.checkpoint))),
            file_digest(direction) if direction.exists() else None,
            exact.perturb,
            exact.neutral_id,
            src.dtype,
        ],
    )


def _score(loaded: Loaded, examples: list[Example], batch_size: int) -> list[Example]:
    out = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        for ex, sc in zip(chunk, loaded.scorer.score(chunk)):
            out.append(msgspec.structs.replace(ex, scores=sc))
    return out


def write_report(report: dict, out: str | Path | None) -> None:
    text = report_json.dumps(report)
    if out is None or is_stdio(out):
        print(text)
        return
    with atomic_path(out) as tmp:
        Path(tmp).write_text(text + "\n")
    note(f"wrote {out}")


def _header(command: str, loaded: Loaded | None, params: dict) -> dict:
    out = {"command": command, "producer": PRODUCER, "created": now(), "params": params}
    if loaded is not None:
        out["checkpoint"] = {
            "run": str(loaded.root),
            "base_model": loaded.meta.base_model,
            "warm_examples": loaded.meta.warm_examples,
            "val_examples": loaded.meta.val_examples,
            "val_loss": loaded.meta.val_loss,
        }
    return out


# --------------------------------------------------------------------------------------------- fidelity


def check_source(src: Source) -> None:
    """Fidelity's and shift's common options in their ranges (see :mod:`bridgecli.runtime.params`)."""
    from ..runtime import params

    params.check(src)
    params.check_data_options(src.data_opts)
    params.check_device(src.device)


def run_fidelity(opts: FidelityOptions) -> dict:
    from ..runtime.params import check

    check(opts)
    check_source(opts.src)
    check_output(opts.out, inputs=(opts.src.data,))
    _check_perturb(opts.perturb)
    selector = as_selector(get("selector", opts.method).obj, opts.method)
    options = selector.parse({"rounds": opts.rounds})
    specs = {spec: plugin_spec(spec, "--proxy") for spec in opts.proxies}
    extra_entries = {spec: get("scorer", name) for spec, (name, _) in specs.items()}
    loaded = load(opts.src)
    exact = _exact_scores(loaded, opts.src, opts.perturb, opts.neutral)
    cache = matrix_cache(opts.src, loaded, exact)
    extra = {}
    for spec, entry in extra_entries.items():
        ctx = dataclasses.replace(loaded.ctx, options={**loaded.ctx.options, "scorer_options": specs[spec][1]})
        extra[spec] = build_scorer(entry.obj, ctx, f"--proxy {spec}", entry.plugin)
    examples = pick_examples(opts.src, loaded.ctx.tokenizer, loaded.meta)
    note(
        f"fidelity on {len(examples)} examples: rho_p={opts.rho_p}, rho_r={opts.rho_r}, T={opts.rounds}, "
        f"perturbation {opts.perturb}"
    )
    results: list[fid.ExampleFidelity] = []
    started = time.perf_counter()
    with progress_bar() as bar:
        task = bar.add_task("exact scores", total=len(examples), unit="ex")
        for start in range(0, len(examples), opts.src.batch_size):
            chunk = _score(loaded, examples[start : start + opts.src.batch_size], opts.src.batch_size)
            extra_scores = {name: s.score(chunk) for name, s in extra.items()}
            for k, ex in enumerate(chunk):
                t0 = time.perf_counter()
                results.append(
                    _fidelity_example(
                        ex, {n: v[k] for n, v in extra_scores.items()}, exact, cache, selector, options, opts
                    )
                )
                results[-1].seconds = round(time.perf_counter() - t0, 3)
                bar.update(task, advance=1)
    rows = fid.aggregate(results)
    report = _header(
        "analyze fidelity",
        loaded,
        {
            **opts.src.describe(),
            "rho_p": opts.rho_p,
            "rho_r": opts.rho_r,
            "rounds": opts.rounds,
            "method": opts.method,
            "perturb": opts.perturb,
            "neutral_token_id": exact.neutral_id,
            "proxies": list(opts.proxies),
        },
    )
    report.update(
        {
            "examples_used": len(results),
            "seconds": round(time.perf_counter() - started, 1),
            "cache_hits": cache.hits,
            "table": rows,
            "paper_setting": fid.PAPER_SETTING,
            "examples": [r.as_dict() for r in results],
        }
    )
    report = report_json.clean(report)
    write_report(report, opts.out)
    return report


def _fidelity_example(
    ex: Example, extra_scores: dict, exact, cache: MatrixCache, selector: Selector, options: dict, opts: FidelityOptions
) -> fid.ExampleFidelity:
    sc = ex.scores
    assert sc is not None  # scored by _score
    a, c, A = sc.a.numpy(), sc.c.numpy(), sc.A.numpy()
    m, n = A.shape[1], A.shape[0]
    b_p, b_r = budget(opts.rho_p, m), budget(opts.rho_r, n)
    sel = selector(ex, b_p, b_r, options)
    s_p, s_r = np.asarray(sel.prompt, dtype=np.int64), np.asarray(sel.response, dtype=np.int64)
    a_full, beta = cache.prompt_matrix(exact, ex)
    a_red = exact.reduced_utilities(ex, [s_p])[0]
    p_prox = fid.prompt_proxies(a, A, s_r)
    r_prox = fid.response_proxies(a, c, A, s_p)
    for name, other in extra_scores.items():
        oa, oc, oA = other.a.numpy(), other.c.numpy(), other.A.numpy()
        if other.B is not None:  # the scorer's own interaction matrix, as `select` uses it
            p_prox[name], r_prox[name] = fid.interaction_proxies(oa, other.B.numpy(), s_r, s_p)
            continue
        p_prox[f"{name} (A x a)"] = fid.prompt_proxies(oa, oA, s_r)[fid.BRIDGE]
        r_prox[f"{name} (A x a)"] = fid.response_proxies(oa, oc, oA, s_p)[fid.BRIDGE]
    return fid.ExampleFidelity(
        id=ex.id,
        index=ex.index,
        m=m,
        n=n,
        b_p=b_p,
        b_r=b_r,
        sides={
            "prompt": fid.evaluate(p_prox, fid.exact_prompt(beta, s_r), b_p),
            "response": fid.evaluate(r_prox, a_red, b_r),
        },
    )


# --------------------------------------------------------------------------------------------- shift


def _shift_png(opts: ShiftOptions) -> str | None:
    """Where the shift plot goes: ``--png``, else the JSON report's path with ``.png``."""
    if opts.png is None and opts.out is not None and not is_stdio(opts.out):
        return str(Path(opts.out).with_suffix(".png"))
    return opts.png


def run_shift(opts: ShiftOptions) -> dict:
    from ..runtime.params import check

    check(opts)
    check_source(opts.src)
    check_output(opts.out, inputs=(opts.src.data,))
    check_output(_shift_png(opts), inputs=(opts.src.data,), stdout=False)
    if not opts.levels:
        raise UsageError("--levels is empty")
    # each level a retention ratio, but not 0: an empty opposite side leaves nothing to rank against
    bad = [x for x in opts.levels if not 0.0 < x <= 1.0]
    if bad:
        raise UsageError(f"--levels must lie in (0, 1], got {bad[0]}")
    if opts.scores != "surrogate":
        _check_perturb(opts.perturb)
    loaded = load(opts.src)
    want_exact = opts.scores in ("both", "exact")
    want_sur = opts.scores in ("both", "surrogate")
    exact = _exact_scores(loaded, opts.src, opts.perturb, opts.neutral) if want_exact else None
    cache = matrix_cache(opts.src, loaded, exact) if want_exact else None
    examples = pick_examples(opts.src, loaded.ctx.tokenizer, loaded.meta)
    rng = np.random.default_rng(opts.src.seed)
    levels = list(opts.levels)
    note(
        f"shift on {len(examples)} examples at opposite-side retention {', '.join(map(str, levels))} "
        f"({opts.subset} subsets, {opts.scores} scores)"
    )
    per_example = []
    started = time.perf_counter()
    with progress_bar() as bar:
        task = bar.add_task("ranking shift", total=len(examples), unit="ex")
        for start in range(0, len(examples), opts.src.batch_size):
            for ex in _score(loaded, examples[start : start + opts.src.batch_size], opts.src.batch_size):
                sc = ex.scores
                assert sc is not None  # scored by _score
                a, c, A = sc.a.numpy(), sc.c.numpy(), sc.A.numpy()
                s_r_levels, s_p_levels = sh.states(a, c, A, levels, opts.subset, rng)
                res = {}
                if want_sur:
                    res["surrogate"] = sh.surrogate_shifts(a, c, A, s_r_levels, s_p_levels)
                if want_exact:
                    assert exact is not None and cache is not None  # built above when want_exact
                    a_full, beta = cache.prompt_matrix(exact, ex)
                    a_red = exact.reduced_utilities(ex, s_p_levels)
                    res["exact"] = sh.exact_shifts(beta, a_full, s_r_levels, a_red)
                per_example.append({"id": ex.id, "index": ex.index, "m": A.shape[1], "n": A.shape[0], "shift": res})
                bar.update(task, advance=1)
    summary = sh.aggregate([e["shift"] for e in per_example], levels)
    report = _header(
        "analyze shift",
        loaded,
        {
            **opts.src.describe(),
            "levels": levels,
            "subset": opts.subset,
            "scores": opts.scores,
            "perturb": opts.perturb if want_exact else None,
            "neutral_token_id": exact.neutral_id if exact is not None else None,
        },
    )
    report.update(
        {
            "examples_used": len(per_example),
            "seconds": round(time.perf_counter() - started, 1),
            "cache_hits": cache.hits if cache is not None else 0,
            "levels": levels,
            "summary": summary,
            "examples": per_example,
        }
    )
    report = report_json.clean(report)
    write_report(report, opts.out)
    png = _shift_png(opts)
    if png:
        from ..analysis.plots import shift_plot

        shift_plot(report, png)
        note(f"wrote {png}")
        report["png"] = png
    return report


# --------------------------------------------------------------------------------------------- robustness


def run_robustness(opts: RobustnessOptions) -> dict:
    from ..runtime.params import check

    check(opts)
    check_output(opts.out, inputs=(opts.inp,))
    examples = []
    with open_reader(opts.inp) as reader:
        require_stage(reader.header, "scores", reader.name, "run `bridge score` first")
        source, header = reader.name, reader.header
        with progress_bar() as bar:
            task = bar.add_task("kappa", total=None)
            for ex in reader:
                examples.append(
                    {
                        "id": ex.id,
                        "index": ex.index,
                        "prompt": rob.example_side("prompt", ex, opts.rho_p, opts.rho_r, opts.full),
                        "response": rob.example_side("response", ex, opts.rho_r, opts.rho_p, opts.full),
                    }
                )
                bar.update(task, advance=1)
    report = _header(
        "analyze robustness",
        None,
        {"input": source, "rho_p": opts.rho_p, "rho_r": opts.rho_r, "model": header.model.source},
    )
    report.update({"examples_used": len(examples), "table": rob.table(examples), "examples": examples})
    report = report_json.clean(report)
    write_report(report, opts.out)
    return report


# --------------------------------------------------------------------------------------------- decompose

#: the token classes of the decomposition, in table order (analysis/tokenclass.py's, newline split off)
DECOMPOSE_CLASSES = ("answer", "digits", "math", "words", "newline", "space/punct")
#: the most frequent token ids listed one by one in the report
TOP_IDS = 30


def run_decompose(opts: DecomposeOptions) -> dict:
    """a_j = t_j + n_j (target and anchor parts, one JVP each) for the response tokens of ``n``
    examples, by token class; with the run's common direction, the same for a_j - beta u_j."""
    from ..analysis import decompose as dec
    from ..analysis.tokenclass import response_strata
    from ..analysis.parts import anchor_of, score_parts, split_direction
    from ..runtime.params import check

    check(opts)
    check_source(opts.src)
    loaded = load(opts.src)
    meta = loaded.meta
    if meta.direction is None:
        raise UsageError(f"{loaded.run.meta_path} records no lambda or norms of v: rerun `bridge warmup`")
    common = loaded.ctx.common() if loaded.run.common_path.exists() and loaded.ctx.common is not None else None
    params = dict(loaded.ctx.model.named_parameters())
    note(f"theta_old from {opts.base_model or meta.base_model}")
    g_anchor = anchor_of(meta, {n: params[n] for n in loaded.ctx.direction}, opts.base_model)
    split = split_direction(loaded.ctx.direction, g_anchor, meta.direction.lam, meta.direction.eps)
    examples = pick_examples(opts.src, loaded.ctx.tokenizer, meta)
    note(
        f"decompose on {len(examples)} examples (lambda {split.lam:g}"
        + (f", common direction beta {common.beta:.4g})" if common is not None else ", no common direction stored)")
    )
    started = time.perf_counter()
    with progress_bar() as bar:
        task = bar.add_task("a_j in two parts", total=len(examples), unit="ex")
        parts = score_parts(
            loaded.ctx,
            split,
            examples,
            d=common.d if common is not None else None,
            batch_size=opts.src.batch_size,
            on_batch=lambda k: bar.update(task, advance=k),
        )
    classes, ids = [], []
    for ex in examples:
        resp = ex.tokens.response_positions()
        classes += response_strata(ex.text, ex.tokens.spans()[resp])
        ids.append(np.asarray(ex.tokens.input_ids, dtype=np.int64)[resp])
    t = np.concatenate([p.target for p in parts])
    n = np.concatenate([p.anchor for p in parts])
    u = np.concatenate([p.u for p in parts if p.u is not None]) if common is not None else None
    all_ids = np.concatenate(ids)
    body = dec.report(
        t,
        n,
        classes,
        all_ids,
        DECOMPOSE_CLASSES,
        min_count=opts.min_count,
        u=u,
        beta=common.beta if common is not None else None,
    )
    report = _header(
        "analyze decompose",
        loaded,
        {**opts.src.describe(), "base_model": opts.base_model or meta.base_model, "min_id_count": opts.min_count},
    )
    report["direction"] = {
        **msgspec.to_builtins(meta.direction),
        "g_anchor_norm_rebuilt": split.anchor_norm,
    }
    report["common_direction"] = msgspec.to_builtins(common.meta.fit) if common is not None else None
    report.update(
        {
            "examples_used": len(examples),
            "seconds": round(time.perf_counter() - started, 1),
            **body,
            "frequent_ids": _frequent_ids(loaded.ctx.tokenizer, all_ids, t, n, u, common.beta if common else None),
            "examples": [
                {
                    "id": ex.id,
                    "index": ex.index,
                    "target": _floats(p.target),
                    "anchor": _floats(p.anchor),
                    "loss": _floats(p.loss),
                    **({"u": _floats(p.u)} if p.u is not None else {}),
                }
                for ex, p in zip(examples, parts)
            ],
        }
    )
    report = report_json.clean(report)
    write_report(report, opts.out)
    return report


def _floats(x: np.ndarray) -> list[float]:
    """Per-token values for the JSON report, to the 7 significant digits of the float32 scores."""
    return [float(f"{v:.7g}") for v in np.asarray(x, dtype=np.float64).tolist()]


def _frequent_ids(tokenizer, ids: np.ndarray, t: np.ndarray, n: np.ndarray, u, beta) -> list[dict]:
    """The :data:`TOP_IDS` most frequent response token ids: their text, count, and share of a_j > 0
    (and of target > 0, and of a_j - beta u_j > 0 with a common direction)."""
    uniq, counts = np.unique(ids, return_counts=True)
    order = np.argsort(-counts, kind="stable")[:TOP_IDS]
    out = []
    a = t + n
    for k in order:
        m = ids == uniq[k]
        row = {
            "id": int(uniq[k]),
            "text": tokenizer.decode([int(uniq[k])]),
            "tokens": int(counts[k]),
            "share_positive": float((a[m] > 0).mean()),
            "share_target_positive": float((t[m] > 0).mean()),
        }
        if u is not None and beta is not None:
            row["share_debiased_positive"] = float((a[m] - beta * u[m] > 0).mean())
        out.append(row)
    return out

"""``bridge analyze``: check BRIDGE's claims on your own checkpoint and data.

- ``fidelity``: surrogate vs exact state-conditioned scores (paper Table 2)
- ``shift``: ranking shift with the opposite side's retention (paper Finding 2)
- ``robustness``: kappa_q of the full-state selection (paper Theorem 1), from a scores stream

The numbers are computed in :mod:`bridgecli.analysis`; this module loads the checkpoint, picks the
examples, runs the passes and writes the JSON report.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from .. import PRODUCER
from ..analysis import fidelity as fid
from ..analysis import robustness as rob
from ..analysis import shift as sh
from ..core.budgets import budget
from ..data.examples import file_digest, iter_pairs
from ..data.tokenize import tokenize_pair
from ..errors import UsageError
from ..format.reader import open_reader
from ..format.records import Example
from ..io import atomic_path, is_stdio
from ..progress import note, progress_bar
from ..registry import get
from .common import now, plugin_spec, require_stage
from .options import FidelityOptions, RobustnessOptions, ShiftOptions, Source


@dataclass
class Loaded:
    ctx: object  # ScoringContext
    scorer: object  # BridgeScorer
    meta: dict
    root: Path


def load(src: Source) -> Loaded:
    """The warmup checkpoint, its tokenizer and v, as ``bridge score`` loads them."""
    from ..modeling.loading import resolve_device
    from ..modeling.scoring import BridgeScorer, ScoringContext
    from ..runfolder import WarmupRun
    from .score import load_checkpoint

    from ..io import check_input

    check_input(src.data)  # before the checkpoint loads
    run = WarmupRun.open(src.run)
    device = resolve_device(src.device)
    src.device = device
    note(f"scoring checkpoint {run.checkpoint} on {device} ({src.dtype})")
    meta, tokenizer, _, model, direction = load_checkpoint(run, src.dtype, device)
    ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=direction.v,
                         attention_layers=src.attention_layers, device=device)
    return Loaded(ctx=ctx, scorer=BridgeScorer(ctx), meta=meta, root=run.root)


def pick_examples(src: Source, tokenizer, meta: dict) -> list[Example]:
    """``n`` examples of DATA (a seeded uniform sample, or the first ``n`` with ``first``), leaving
    out the ids warmup used when DATA is the file it read, and those over ``--max-length``."""
    opts = src.data_opts
    leave_out: set[str] = set()
    if meta.get("data_digest") and meta.get("data_digest") == file_digest(src.data):
        leave_out = set(meta.get("warm_ids") or []) | set(meta.get("val_ids") or [])
        if meta.get("warm_ids") is None:
            note("warning: DATA is the file warmup read, and warmup recorded no warm ids (no --warm-fraction): "
                 "the sample may include warm examples")
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


def _exact_reference(loaded: Loaded, src: Source, perturb: str, neutral: str | None):
    from ..analysis.exact import ExactReference, reference_scorer, neutral_token_id

    neutral_id = None
    if perturb == "replace":
        try:
            neutral_id = neutral_token_id(loaded.ctx.tokenizer, neutral)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    try:
        return ExactReference(reference_scorer(loaded.ctx), perturb=perturb, neutral_id=neutral_id,
                              batch_size=src.batch_size)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


class MatrixCache:
    """Exact prompt perturbation matrices on disk, keyed by the checkpoint, v, the perturbation
    and the example's tokens, so that ``fidelity`` and ``shift`` (and reruns) compute each once."""

    def __init__(self, folder: str | Path | None, loaded: Loaded, ref, dtype: str):
        self.folder = Path(folder) if folder is not None else None
        self.hits = 0
        if self.folder is None:
            return
        from ..modeling.loading import fingerprint, resolve

        self.folder.mkdir(parents=True, exist_ok=True)
        direction = next(iter(sorted(loaded.root.glob("direction*"))), None)
        self.base = json.dumps([fingerprint(resolve(str(loaded.root / "checkpoint"))),
                                file_digest(direction) if direction is not None else None,
                                ref.perturb, ref.neutral_id, dtype])

    def prompt_matrix(self, ref, ex: Example) -> tuple[np.ndarray, np.ndarray]:
        if self.folder is None:
            return ref.prompt_matrix(ex)
        import hashlib

        h = hashlib.sha256(self.base.encode())
        h.update(json.dumps(ex.tokens.input_ids).encode())
        h.update(ex.tokens.kinds)
        path = self.folder / f"{h.hexdigest()[:32]}.npz"
        if path.exists():
            with np.load(path) as z:
                self.hits += 1
                return z["a_full"], z["beta"]
        a_full, beta = ref.prompt_matrix(ex)
        with atomic_path(path, suffix=".npz") as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, a_full=a_full, beta=beta)
        return a_full, beta


def _score(loaded: Loaded, examples: list[Example], batch_size: int) -> list[Example]:
    out = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        for ex, sc in zip(chunk, loaded.scorer.score(chunk)):
            out.append(msgspec.structs.replace(ex, scores=sc))
    return out


def dumps(obj, level: int = 0) -> str:
    """JSON with nested maps indented and lists of scalars on one line (reports stay readable and
    small: kappa, pairs and swaps are long lists)."""
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(str(k))}: {dumps(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(x, dict) for x in obj):
        return "[\n" + ",\n".join(inner + dumps(x, level + 1) for x in obj) + "\n" + pad + "]"
    return json.dumps(obj, allow_nan=False, separators=(",", ": ") if not isinstance(obj, list) else (",", ":"))


def write_report(report: dict, out: str | Path | None) -> None:
    text = dumps(report)
    if is_stdio(out):
        print(text)
        return
    with atomic_path(out) as tmp:
        Path(tmp).write_text(text + "\n")
    note(f"wrote {out}")


def _clean(x):
    """JSON-safe floats (NaN/inf -> None)."""
    if isinstance(x, float) and not np.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.generic):
        return _clean(x.item())
    return x


def _header(command: str, loaded: Loaded | None, params: dict) -> dict:
    out = {"command": command, "producer": PRODUCER, "created": now(), "params": params}
    if loaded is not None:
        out["checkpoint"] = {"run": str(loaded.root), "base_model": loaded.meta.get("base_model"),
                             "warm_examples": loaded.meta.get("warm_examples"),
                             "val_examples": loaded.meta.get("val_examples"),
                             "val_loss": loaded.meta.get("val_loss")}
    return out


# --------------------------------------------------------------------------------------------- fidelity

def check_source(src: Source) -> None:
    """Fidelity's and shift's common options in their ranges (see :mod:`.params`)."""
    from . import params

    params.check(src)
    params.check_data_options(src.data_opts)
    params.check_device(src.device)


def run_fidelity(opts: FidelityOptions) -> dict:
    from .params import check

    check(opts)
    check_source(opts.src)
    _check_perturb(opts.perturb)
    selector = get("selector", opts.method)
    specs = {spec: plugin_spec(spec, "--proxy") for spec in opts.proxies}
    extra_entries = {spec: get("scorer", name) for spec, (name, _) in specs.items()}
    loaded = load(opts.src)
    ref = _exact_reference(loaded, opts.src, opts.perturb, opts.neutral)
    cache = MatrixCache(opts.src.cache, loaded, ref, opts.src.dtype)
    extra = {}
    for spec, entry in extra_entries.items():
        ctx = dataclasses.replace(loaded.ctx, options={**loaded.ctx.options, "scorer_options": specs[spec][1]})
        try:
            extra[spec] = entry.obj(ctx)
        except ValueError as exc:
            raise UsageError(f"--proxy {spec}: {exc}") from None
    examples = pick_examples(opts.src, loaded.ctx.tokenizer, loaded.meta)
    note(f"fidelity on {len(examples)} examples: rho_p={opts.rho_p}, rho_r={opts.rho_r}, T={opts.rounds}, "
         f"perturbation {opts.perturb}")
    results: list[fid.ExampleFidelity] = []
    started = time.perf_counter()
    with progress_bar() as bar:
        task = bar.add_task("exact scores", total=len(examples), unit="ex")
        for start in range(0, len(examples), opts.src.batch_size):
            chunk = _score(loaded, examples[start:start + opts.src.batch_size], opts.src.batch_size)
            extra_scores = {name: s.score(chunk) for name, s in extra.items()}
            for k, ex in enumerate(chunk):
                t0 = time.perf_counter()
                results.append(_fidelity_example(ex, {n: v[k] for n, v in extra_scores.items()}, ref, cache,
                                                 selector, opts))
                results[-1].seconds = round(time.perf_counter() - t0, 3)
                bar.update(task, advance=1)
    rows = fid.aggregate(results)
    report = _header("analyze fidelity", loaded, {
        **opts.src.describe(), "rho_p": opts.rho_p, "rho_r": opts.rho_r, "rounds": opts.rounds, "method": opts.method,
        "perturb": opts.perturb, "neutral_token_id": ref.neutral_id, "proxies": list(opts.proxies)})
    report.update({"examples_used": len(results), "seconds": round(time.perf_counter() - started, 1),
                   "cache_hits": cache.hits,
                   "table": rows, "paper_setting": fid.PAPER_SETTING,
                   "examples": [r.as_dict() for r in results]})
    report = _clean(report)
    write_report(report, opts.out)
    return report


def _fidelity_example(ex: Example, extra_scores: dict, ref, cache: MatrixCache, selector,
                      opts: FidelityOptions) -> fid.ExampleFidelity:
    sc = ex.scores
    a, c, A = sc.a.numpy(), sc.c.numpy(), sc.A.numpy()
    m, n = A.shape[1], A.shape[0]
    b_p, b_r = budget(opts.rho_p, m), budget(opts.rho_r, n)
    sel = selector.obj(ex, b_p, b_r, {"rounds": opts.rounds})
    s_p, s_r = np.asarray(sel.prompt, dtype=np.int64), np.asarray(sel.response, dtype=np.int64)
    a_full, beta = cache.prompt_matrix(ref, ex)
    a_red = ref.reduced_utilities(ex, [s_p])[0]
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
        id=ex.id, index=ex.index, m=m, n=n, b_p=b_p, b_r=b_r,
        sides={"prompt": fid.evaluate(p_prox, fid.exact_prompt(beta, s_r), b_p),
               "response": fid.evaluate(r_prox, a_red, b_r)})


# --------------------------------------------------------------------------------------------- shift

def run_shift(opts: ShiftOptions) -> dict:
    from .params import check

    check(opts)
    check_source(opts.src)
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
    ref = _exact_reference(loaded, opts.src, opts.perturb, opts.neutral) if want_exact else None
    cache = MatrixCache(opts.src.cache, loaded, ref, opts.src.dtype) if want_exact else None
    examples = pick_examples(opts.src, loaded.ctx.tokenizer, loaded.meta)
    rng = np.random.default_rng(opts.src.seed)
    levels = list(opts.levels)
    note(f"shift on {len(examples)} examples at opposite-side retention {', '.join(map(str, levels))} "
         f"({opts.subset} subsets, {opts.scores} scores)")
    per_example = []
    started = time.perf_counter()
    with progress_bar() as bar:
        task = bar.add_task("ranking shift", total=len(examples), unit="ex")
        for start in range(0, len(examples), opts.src.batch_size):
            for ex in _score(loaded, examples[start:start + opts.src.batch_size], opts.src.batch_size):
                sc = ex.scores
                a, c, A = sc.a.numpy(), sc.c.numpy(), sc.A.numpy()
                s_r_levels, s_p_levels = sh.states(a, c, A, levels, opts.subset, rng)
                res = {}
                if want_sur:
                    res["surrogate"] = sh.surrogate_shifts(a, c, A, s_r_levels, s_p_levels)
                if want_exact:
                    a_full, beta = cache.prompt_matrix(ref, ex)
                    a_red = ref.reduced_utilities(ex, s_p_levels)
                    res["exact"] = sh.exact_shifts(beta, a_full, s_r_levels, a_red)
                per_example.append({"id": ex.id, "index": ex.index, "m": A.shape[1], "n": A.shape[0],
                                    "shift": res})
                bar.update(task, advance=1)
    summary = sh.aggregate([e["shift"] for e in per_example], levels)
    report = _header("analyze shift", loaded, {**opts.src.describe(), "levels": levels, "subset": opts.subset,
                                               "scores": opts.scores, "perturb": opts.perturb if want_exact else None,
                                               "neutral_token_id": ref.neutral_id if ref is not None else None})
    report.update({"examples_used": len(per_example), "seconds": round(time.perf_counter() - started, 1),
                   "cache_hits": cache.hits if cache is not None else 0,
                   "levels": levels, "summary": summary, "examples": per_example})
    report = _clean(report)
    write_report(report, opts.out)
    png = opts.png
    if png is None and not is_stdio(opts.out):
        png = str(Path(opts.out).with_suffix(".png"))
    if png:
        from ..analysis.plots import shift_plot

        shift_plot(report, png)
        note(f"wrote {png}")
        report["png"] = png
    return report


# --------------------------------------------------------------------------------------------- robustness

def _abs(positions: np.ndarray, idx) -> list[int]:
    return positions[np.asarray(idx, dtype=np.int64)].tolist()


def robustness_side(side: str, ex: Example, rho_side: float, rho_opp: float, full: bool) -> dict:
    sc = ex.scores
    a_x, B = rob.side_problem(side, sc.a.numpy(), sc.c.numpy(), sc.A.numpy())
    N, n = B.shape
    own = ex.tokens.prompt_positions() if side == "prompt" else ex.tokens.response_positions()
    opp = ex.tokens.response_positions() if side == "prompt" else ex.tokens.prompt_positions()
    b, b_opp = budget(rho_side, N), budget(rho_opp, n)
    out: dict = {"size": N, "opposite": n, "b": b, "b_opposite": b_opp}
    if not 1 <= b < N or n == 0:
        out["undefined"] = "needs 1 <= b < |X| and a non-empty opposite side"
        return out
    sel = rob.full_state_selection(a_x, B, b)
    k = rob.kappa(a_x, B, sel)

    def swap(q: int) -> dict:
        i, i2 = int(k.pair_in[q - 1]), int(k.pair_out[q - 1])
        V = rob.witness(B, i, i2, q)
        s = rob.conditional(a_x, B, V)
        return {"q": q, "kappa": float(k.kappa[q - 1]), "out": int(own[i]), "in": int(own[i2]),
                "V": _abs(opp, V), "gain": float(s[i2] - s[i])}

    first_neg = k.first_negative()
    out.update({
        "selected": _abs(own, sel),
        "kappa": [float(x) for x in k.kappa],
        "pairs": [[int(own[i]), int(own[j])] for i, j in zip(k.pair_in, k.pair_out)],
        "first_negative_q": first_neg,
        "robust_from_q": k.robust_from(),
        "kappa_at_b_opposite": float(k.kappa[b_opp - 1]) if b_opp >= 1 else None,
        "robust_at_b_opposite": bool(k.kappa[b_opp - 1] >= 0) if b_opp >= 1 else None,
        "swap_at_first_negative": swap(first_neg) if first_neg is not None else None,
        "swap_at_b_opposite": swap(b_opp) if b_opp >= 1 and k.kappa[b_opp - 1] < 0 else None,
    })
    if full:
        out["swaps"] = [swap(q) for q in range(1, n + 1) if k.kappa[q - 1] < 0]
    return out


def _robustness_table(examples: list[dict]) -> list[dict]:
    rows = []
    for side in ("prompt", "response"):
        defined = [e[side] for e in examples if "kappa" in e[side]]
        if not defined:
            rows.append({"side": side, "examples": 0})
            continue
        frac_first = [(d["first_negative_q"] / d["opposite"]) if d["first_negative_q"] else None for d in defined]
        rows.append({
            "side": side,
            "examples": len(defined),
            "undefined": len(examples) - len(defined),
            "mean_b": float(np.mean([d["b"] for d in defined])),
            "mean_b_opposite": float(np.mean([d["b_opposite"] for d in defined])),
            "robust_at_b_opposite": float(np.mean([d["robust_at_b_opposite"] for d in defined])),
            "robust_at_every_q": float(np.mean([d["first_negative_q"] is None for d in defined])),
            "first_negative_fraction": _stats([x for x in frac_first if x is not None]),
            "robust_from_fraction": _stats([(d["robust_from_q"] - 1) / d["opposite"] for d in defined]),
        })
    return rows


def _stats(values) -> dict:
    from ..analysis.metrics import summary

    return summary(values)


def run_robustness(opts: RobustnessOptions) -> dict:
    from .params import check

    check(opts)
    examples = []
    with open_reader(opts.inp) as reader:
        require_stage(reader.header, "scores", reader.name, "run `bridge score` first")
        source, header = reader.name, reader.header
        with progress_bar() as bar:
            task = bar.add_task("kappa", total=None)
            for ex in reader:
                examples.append({
                    "id": ex.id, "index": ex.index,
                    "prompt": robustness_side("prompt", ex, opts.rho_p, opts.rho_r, opts.full),
                    "response": robustness_side("response", ex, opts.rho_r, opts.rho_p, opts.full),
                })
                bar.update(task, advance=1)
    report = _header("analyze robustness", None, {"input": source, "rho_p": opts.rho_p, "rho_r": opts.rho_r,
                                                  "model": header.model.source})
    report.update({"examples_used": len(examples), "table": _robustness_table(examples), "examples": examples})
    report = _clean(report)
    write_report(report, opts.out)
    return report

#!/usr/bin/env python3
"""Does a_j have the right sign and scale? An end-to-end check of BRIDGE's first-order utility
(issue 28, item 2), on a scored stream and the warm-up run that scored it.

    python bench/diagnostics/aj_check.py SCORED.bridge --from WARM_RUN \\
        --examples 30 --tokens 200 --actual-tokens 200 --etas 1e-2,1e-3,1e-4 \\
        --json results/aj_check.json --md results/aj_check.md

For ``--tokens`` response tokens sampled (``--seed``) from ``--examples`` scored examples:

1. **The gradient.** grad l_j over the tail parameters (the ``--direction-layers`` blocks v lives
   on) at theta_bar, by one backward pass per token, in ``--dtype`` (float64 by default).
2. **The JVP.** a_j as `bridge score` wrote it (float32, its fused or forward-mode path), a_j again
   by forward-mode AD in ``--dtype`` (the package's BridgeScorer, generic path), the direct
   v . grad l_j, and a central finite difference (l_j(theta + h v) - l_j(theta - h v)) / 2h for each
   ``--fd-h``.
3. **The objective.** L(theta) = mean validation loss over D_val (the warm-up's: every response
   token and the EOS, token-level mean, the definition of g_target) with lambda 0. The hidden
   states entering the tail blocks do not depend on the tail, so the blocks before it run once per
   D_val batch and every later L(theta') replays only the tail, the final norm and the LM head
   (checked against a full forward). g_target = grad L(theta_bar) is recomputed here, and with the
   base model theta_old, v is rebuilt from g_target and g_anchor and compared with the stored v.
4. **One SGD step on one token.** theta' = theta_bar - eta grad l_j (tail only) for each eta of
   ``--etas``, on ``--actual-tokens`` of the tokens (a seeded random subset; all by default); the
   actual change L(theta') - L(theta_bar) against the first-order prediction -eta g_target . grad l_j
   and against -eta a_j (stored a_j: lambda and the normalised v, so its slope is not 1).

The steps are evaluated in ``--eval-dtype`` (default ``--dtype``); ``--dtype-check K`` repeats the
smallest eta of the first K tokens in float64 to show the rounding of a float32 evaluation (and
gives that eta's statistics from the float64 values). ``--steps-only`` measures only the SGD steps
of the ``--actual-tokens`` (the same tokens for the same sampling flags), e.g. at smaller etas. In
float64 the models' RMSNorm (which computes in float32 and casts back) is replaced, inside the tail
and the final norm only, by the same formula computed in float64.

Writes a JSON result (commit, device, model, command, date, settings, per-token values, statistics)
and a markdown summary. Cost: one tail + head pass over D_val per (token, eta) pair; on a 2-core
CPU with the default model that is about 0.3-0.5 s per D_val example in float32, so keep D_val and
``--actual-tokens`` small there.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import types
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import diag_common as dc  # noqa: E402

from bridgecli.artifacts.warmup_run import WarmupRun  # noqa: E402
from bridgecli.data.examples import DataOptions, iter_examples, with_model_limit  # noqa: E402
from bridgecli.format.reader import open_reader  # noqa: E402
from bridgecli.modeling.loading import load_model, resolve, resolve_device  # noqa: E402
from bridgecli.modeling.params import blocks_of  # noqa: E402
from bridgecli.modeling.score_batch import make_batch  # noqa: E402
from bridgecli.modeling.scoring import BridgeScorer, ScoringContext, load_scoring_checkpoint  # noqa: E402
from bridgecli.modeling.scoring import _cast_floats as cast_floats  # noqa: E402  (the scorer's own)
from bridgecli.modeling.tail import Tail  # noqa: E402
from bridgecli.training.batching import collate_padded  # noqa: E402
from bridgecli.training.rows import full_response_row  # noqa: E402
from bridgecli.training.sft import token_loss_sum  # noqa: E402

Params = dict[int, dict[str, torch.Tensor]]


def log(msg: str) -> None:
    print(f"[aj_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- parameter dictionaries (block index -> name inside the block -> tensor) ----------------------


def pmap(f, *ps: Params) -> Params:
    return {i: {k: f(*(p[i][k] for p in ps)) for k in ps[0][i]} for i in ps[0]}


def pdot(a: Params, b: Params) -> float:
    return float(sum((a[i][k].double() * b[i][k].double()).sum() for i in a for k in a[i]))


def pnorm(a: Params) -> float:
    return math.sqrt(pdot(a, a))


def leaves(p: Params) -> list[torch.Tensor]:
    return [p[i][k] for i in p for k in p[i]]


# -- float64 RMSNorm inside the tail --------------------------------------------------------------


def _rms_same_dtype(self, hidden: torch.Tensor) -> torch.Tensor:
    if hidden.dtype != torch.float64:
        return self._aj_forward(hidden)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return self.weight.to(hidden.dtype) * (hidden * torch.rsqrt(variance + self.variance_epsilon))


@contextmanager
def float64_norms(modules: list[torch.nn.Module]):
    """Inside: the Llama-style RMSNorms among ``modules`` (and their children) compute in float64
    when given float64 (HF's compute in float32 and cast back). Gemma-style norms (1 + weight) and
    other kinds are left alone and listed in the returned list."""
    patched, skipped = [], []
    for root in modules:
        for mod in root.modules():
            name = type(mod).__name__
            if not name.endswith("RMSNorm"):
                continue
            if "Gemma" in name or not hasattr(mod, "variance_epsilon") or not hasattr(mod, "weight"):
                skipped.append(name)
                continue
            own = mod.__dict__.get("forward")
            mod._aj_forward = mod.forward
            mod.forward = types.MethodType(_rms_same_dtype, mod)
            patched.append((mod, own))
    try:
        yield sorted(set(skipped))
    finally:
        for mod, own in patched:
            del mod._aj_forward
            if own is None:
                del mod.forward
            else:
                mod.forward = own


# -- the model pieces -----------------------------------------------------------------------------


@dataclass
class TailModel:
    tail: Tail
    weight: torch.Tensor  # LM head weight, float32 on the device
    bias: torch.Tensor | None
    row_chunk: int = 1024

    def head_ce(self, h: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-row next-token cross-entropy of final-normed hidden rows ``h`` [N, d], in h's dtype."""
        w = self.weight.to(h.dtype)
        b = self.bias.to(h.dtype) if self.bias is not None else None
        out = []
        for s in range(0, h.shape[0], self.row_chunk):
            logits = F.linear(h[s : s + self.row_chunk], w, b)
            out.append(F.cross_entropy(logits, target[s : s + self.row_chunk], reduction="none"))
        return torch.cat(out) if out else h.new_zeros(0)


class ValObjective:
    """L(theta) = token-mean loss over D_val (response tokens + EOS), with the pre-tail hidden
    states computed once."""

    def __init__(self, tm: TailModel, rows, pad_id: int, device: str, batch: int):
        self.tm = tm
        self.z = sum(r.supervised for r in rows)
        self.chunks = []
        ordered = sorted(range(len(rows)), key=lambda k: len(rows[k].input_ids))  # less padding
        for s in range(0, len(ordered), batch):
            take = ordered[s : s + batch]
            mb = collate_padded([rows[k] for k in take], pad_id).to(device)
            with torch.no_grad():
                hidden, calls = tm.tail.prefix(mb.input_ids, mb.attention_mask)
            # which D_val example (index into ``rows``) each loss position belongs to
            owner = torch.as_tensor(take, device=device)[mb.keep.nonzero(as_tuple=True)[0]]
            self.chunks.append((hidden, calls, mb.keep, mb.target, owner, mb))
        self.supervised = [r.supervised for r in rows]
        self._cast: dict = {}

    def _chunks(self, dtype):
        if dtype not in self._cast:
            self._cast = {dtype: [(h.to(dtype), cast_floats(c, dtype), k, t, o) for h, c, k, t, o, _ in self.chunks]}
        return self._cast[dtype]

    def loss(self, params: Params, dtype) -> float:
        total = 0.0
        with torch.no_grad():
            for h, calls, keep, target, _ in self._chunks(dtype):
                out = self.tm.tail.run(params, h, calls)
                total += float(self.tm.head_ce(out[keep], target).double().sum())
        return total / self.z

    def grad(self, params: Params, dtype, subset: list[int] | None = None) -> tuple[float, Params]:
        """The loss and its gradient; with ``subset`` (indices of D_val examples), those of the token
        mean over these examples only."""
        p = pmap(lambda t: t.detach().clone().requires_grad_(True), params)
        z = self.z if subset is None else sum(self.supervised[k] for k in subset)
        total = 0.0
        with torch.enable_grad():
            for h, calls, keep, target, owner in self._chunks(dtype):
                if subset is not None:
                    w = torch.isin(owner, torch.as_tensor(subset, device=owner.device))
                    if not w.any():
                        continue
                out = self.tm.tail.run(p, h, calls)
                ce = self.tm.head_ce(out[keep], target)
                loss = (ce if subset is None else ce * w.to(ce.dtype)).sum() / z
                loss.backward()
                total += float(loss.detach().double())
        return total, pmap(lambda t: t.grad.detach() if t.grad is not None else torch.zeros_like(t), p)

    def full_forward(self, model) -> float:
        """The same loss by the model's own forward (the warm-up's definition, float32)."""
        with torch.no_grad():
            return sum(float(token_loss_sum(model, c[-1]).double()) for c in self.chunks) / self.z


# -- inputs ---------------------------------------------------------------------------------------


def val_examples(run: WarmupRun, tokenizer, model, args) -> tuple[list, str]:
    meta = run.meta()
    opts = DataOptions(
        prompt_field=args.prompt_field,
        response_field=args.response_field,
        chat_template=meta.chat_template if meta.chat_template is not None else True,
    )
    opts = with_model_limit(opts, model)
    if args.val:
        exs, where = list(iter_examples(args.val, tokenizer, opts)), args.val
    elif meta.val:
        exs, where = list(iter_examples(meta.val, tokenizer, opts)), meta.val
    elif meta.val_ids and meta.data:
        ids = set(meta.val_ids)
        exs = [e for e in iter_examples(meta.data, tokenizer, opts) if e.id in ids]
        where = f"{meta.data} (the warm-up's --val-fraction ids)"
    else:
        raise SystemExit(f"{run.meta_path}: records neither a validation file nor validation ids; pass --val FILE")
    if not Path(where.split(" (")[0]).exists():
        raise SystemExit(f"{where}: the validation data is not there; pass --val FILE")
    if args.val_limit is not None:
        exs = exs[: args.val_limit]
    if not exs:
        raise SystemExit(f"{where}: no validation examples")
    return exs, where


def read_scored(path: str) -> tuple[list, dict]:
    with open_reader(path) as reader:
        header = reader.header
        exs = [ex for ex in reader]
    bad = next((ex for ex in exs if ex.scores is None), None)
    if bad is not None:
        raise SystemExit(f"{path}: example {bad.index} ({bad.id}) has no scores: run `bridge score` first")
    score_steps = [s.params for s in header.steps if s.step == "score"]
    info = {
        "model": header.model.source,
        "tokenizer_fingerprint": header.model.tokenizer_fingerprint,
        "score": score_steps[-1] if score_steps else None,
    }
    return exs, info


def sample_tokens(exs, n_examples: int, n_tokens: int, seed: int) -> list[tuple[int, int]]:
    """(index into exs, j among its response tokens), sorted."""
    rng = np.random.default_rng(seed)
    usable = [k for k, ex in enumerate(exs) if len(ex.tokens.response_positions())]
    picked = rng.choice(usable, size=min(n_examples, len(usable)), replace=False)
    pool = [(int(k), j) for k in sorted(picked) for j in range(len(exs[k].tokens.response_positions()))]
    take = rng.choice(len(pool), size=min(n_tokens, len(pool)), replace=False)
    return sorted(pool[t] for t in take)


# -- statistics -----------------------------------------------------------------------------------


def sign_agreement(x, y) -> float | None:
    x, y = np.asarray(x), np.asarray(y)
    ok = (x != 0) & (y != 0)
    return float((np.sign(x[ok]) == np.sign(y[ok])).mean()) if ok.any() else None


def compare(actual, pred) -> dict:
    """How well ``pred`` predicts ``actual`` (both per token)."""
    actual, pred = np.asarray(actual, dtype=np.float64), np.asarray(pred, dtype=np.float64)
    big = np.abs(pred) > np.median(np.abs(pred))
    ratio = actual[pred != 0] / pred[pred != 0]
    ols = np.polyfit(pred, actual, 1) if len(pred) > 1 and pred.std() > 0 else [None, None]
    return {
        "n": int(len(actual)),
        "pearson": dc.pearson(actual, pred),
        "spearman": dc.spearman(actual, pred),
        "sign_agreement": sign_agreement(actual, pred),
        "sign_agreement_top_half": sign_agreement(actual[big], pred[big]),
        "slope_through_origin": float((actual * pred).sum() / (pred * pred).sum()) if (pred != 0).any() else None,
        "slope_ols": None if ols[0] is None else float(ols[0]),
        "intercept_ols": None if ols[1] is None else float(ols[1]),
        "ratio_median": float(np.median(ratio)) if len(ratio) else None,
        "ratio_q10_q90": [float(np.quantile(ratio, 0.1)), float(np.quantile(ratio, 0.9))] if len(ratio) else None,
        "rel_error_median": float(np.median(np.abs(actual - pred)[pred != 0] / np.abs(pred[pred != 0])))
        if (pred != 0).any()
        else None,
    }


def agreement(x, ref) -> dict:
    """``x`` against a reference ``ref`` (per token): error relative to the reference's RMS."""
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    rms = float(np.sqrt((ref**2).mean())) if len(ref) else 0.0
    err = np.abs(x - ref)
    nz = np.abs(ref) > 1e-3 * rms
    return {
        "n": int(len(x)),
        "pearson": dc.pearson(x, ref),
        "sign_agreement": sign_agreement(x, ref),
        "max_abs_error_over_rms": float(err.max() / rms) if rms else None,
        "median_rel_error": float(np.median(err[nz] / np.abs(ref[nz]))) if nz.any() else None,
        "rms_ref": rms,
    }


# -- main -----------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scored", help="a stream `bridge score --from RUN` wrote (later steps' streams work too)")
    ap.add_argument("--from", dest="run", required=True, help="the warm-up run folder that scored it")
    ap.add_argument("--val", help="D_val file (default: the one the warm-up recorded)")
    ap.add_argument("--val-limit", type=int, help="use only the first N examples of D_val (then g_target is not v's)")
    ap.add_argument("--val-batch", type=int, default=8, help="D_val examples per tail pass")
    ap.add_argument("--examples", type=int, default=30, help="scored examples the tokens are drawn from")
    ap.add_argument("--tokens", type=int, default=200, help="response tokens sampled from them")
    ap.add_argument("--actual-tokens", type=int, help="of those, how many get the SGD steps (default: all)")
    ap.add_argument("--etas", default="1e-2,1e-3,1e-4", help="comma-separated SGD step sizes")
    ap.add_argument("--fd-h", default="1e-2,1e-3", help="comma-separated finite-difference steps along v")
    ap.add_argument("--dtype", default="float64", choices=("float32", "float64"), help="tail dtype")
    ap.add_argument("--eval-dtype", choices=("float32", "float64"), help="dtype of the SGD-step evaluations")
    ap.add_argument("--dtype-check", type=int, default=0, help="repeat the smallest eta of K tokens in float64")
    ap.add_argument(
        "--steps-only",
        action="store_true",
        help="only the --actual-tokens (same sampling): their SGD steps, no JVP or finite-difference checks",
    )
    ap.add_argument("--base", help="theta_old (default: the base model the warm-up recorded)")
    ap.add_argument("--no-base", action="store_true", help="skip loading theta_old (no v rebuild, no anchor terms)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--prompt-field")
    ap.add_argument("--response-field")
    ap.add_argument("--json", required=True, help="write the result here")
    ap.add_argument("--md", help="write the markdown summary here")
    args = ap.parse_args(argv)
    etas = [float(x) for x in args.etas.split(",")]
    fd_hs = [float(x) for x in args.fd_h.split(",")]
    dtype = getattr(torch, args.dtype)
    eval_dtype = getattr(torch, args.eval_dtype or args.dtype)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    run = WarmupRun.open(args.run)
    meta = run.meta()
    device = resolve_device(args.device)
    started = dc.provenance(device, None)  # the commit and date at the start, when the code was read
    log(f"loading {run.checkpoint} on {device}")
    ck = load_scoring_checkpoint(run, "float32", device)
    model, tokenizer, direction = ck.model, ck.tokenizer, ck.direction
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    blocks = blocks_of(model)
    prefix = next(name for name, mod in model.named_modules() if mod is blocks) + "."
    names: dict[int, dict[str, str]] = {}
    for full in direction.v:
        idx, rel = full[len(prefix) :].split(".", 1)
        names.setdefault(int(idx), {})[rel] = full
    params = dict(model.named_parameters())
    theta32 = {i: {rel: params[f].detach() for rel, f in d.items()} for i, d in names.items()}
    theta = pmap(lambda t: t.to(dtype), theta32)
    v = {i: {rel: direction.v[f].to(device=device, dtype=dtype) for rel, f in d.items()} for i, d in names.items()}
    tail = Tail(model, sorted(names))
    head = model.get_output_embeddings()
    tm = TailModel(tail, head.weight.detach(), head.bias.detach() if head.bias is not None else None)
    lam = direction.meta.lam if direction.meta.lam is not None else 0.2
    eps = direction.meta.eps if direction.meta.eps is not None else 1e-8

    scored, scored_info = read_scored(args.scored)
    if scored_info["tokenizer_fingerprint"] != ck.tokenizer_fingerprint:
        raise SystemExit(
            f"{args.scored}: its tokenizer is not the checkpoint's in {run.root}; pass the run that scored it"
        )
    # the scorer registers its attention function on the model; made first, every pass below uses it
    scorer64 = BridgeScorer(
        ScoringContext(
            model=model,
            tokenizer=tokenizer,
            direction=direction.v,
            device=device,
            options={"tail_dtype": dtype, "fast_tail": False},
        )
    )
    with float64_norms([blocks[i] for i in tail.indices] + [tail.norm]) as norms_left:
        # D_val and the objective
        t0 = time.perf_counter()
        vals, val_where = val_examples(run, tokenizer, model, args)
        rows = [full_response_row(e.id, e.tokens) for e in vals]
        obj = ValObjective(tm, rows, pad, device, args.val_batch)
        L_full = obj.full_forward(model)
        L32 = obj.loss(theta32, torch.float32)
        L0, g = obj.grad(theta, dtype)
        L0_eval = obj.loss(pmap(lambda t: t.to(eval_dtype), theta), eval_dtype)
        g_norm = pnorm(g)
        # two disjoint halves of D_val: is g_target . grad l_j reproducible across validation sets?
        halves = None
        if len(rows) >= 2:
            perm = np.random.default_rng(args.seed + 2).permutation(len(rows)).tolist()
            halves = [
                obj.grad(theta, dtype, sorted(perm[: len(rows) // 2]))[1],
                obj.grad(theta, dtype, sorted(perm[len(rows) // 2 :]))[1],
            ]
        timings["val_setup_s"] = time.perf_counter() - t0
        log(
            f"D_val {len(vals)} examples, {obj.z} loss tokens: L full forward {L_full:.7f}, cached tail float32 "
            f"{L32:.7f}, {args.dtype} {L0:.9f}; |g_target| {g_norm:.5g} (warm-up: {direction.meta.g_target_norm})"
        )
        checks = {
            "val_examples": len(vals),
            "val_loss_tokens": obj.z,
            "val_source": val_where,
            "val_loss_full_forward_float32": L_full,
            "val_loss_cached_tail_float32": L32,
            f"val_loss_cached_tail_{args.dtype}": L0,
            "val_loss_cached_minus_full_float32": L32 - L_full,
            "val_loss_warmup_recorded": meta.val_loss,
            "g_target_norm": g_norm,
            "g_target_norm_warmup_recorded": direction.meta.g_target_norm,
            "norms_not_made_float64": norms_left,
        }

        # theta_old: v rebuilt from g_target and g_anchor, and the anchor direction
        anchor = None
        if not args.no_base:
            t0 = time.perf_counter()
            base = load_model(resolve(args.base or meta.base_model), dtype=torch.float32, device=device)
            bparams = dict(base.named_parameters())
            theta_old = {i: {rel: bparams[f].detach().to(dtype) for rel, f in d.items()} for i, d in names.items()}
            del base, bparams
            anchor = pmap(lambda a, b: a - b, theta, theta_old)
            a_norm = pnorm(anchor)
            v_rec = pmap(lambda gt, an: (1 - lam) * gt / (g_norm + eps) + lam * an / (a_norm + eps), g, anchor)
            v_norm = pnorm(v)
            checks.update(
                g_anchor_norm=a_norm,
                g_anchor_norm_warmup_recorded=direction.meta.g_anchor_norm,
                v_rebuilt_cosine=pdot(v_rec, v) / (pnorm(v_rec) * v_norm),
                v_rebuilt_rel_diff=pnorm(pmap(lambda a, b: a - b, v_rec, v)) / v_norm,
                cos_g_target_anchor=pdot(g, anchor) / (g_norm * a_norm),
            )
            timings["base_s"] = time.perf_counter() - t0
            log(f"v rebuilt: cosine {checks['v_rebuilt_cosine']:.8f}, |g_anchor| {a_norm:.5g}")
        theta_norm = pnorm(theta)

        # the tokens
        picks = sample_tokens(scored, args.examples, args.tokens, args.seed)
        rng = np.random.default_rng(args.seed + 1)
        n_actual = len(picks) if args.actual_tokens is None else min(args.actual_tokens, len(picks))
        actual_set = set(rng.permutation(len(picks))[:n_actual].tolist())
        per_ex: dict[int, list[int]] = {}
        for t, (k, j) in enumerate(picks):
            per_ex.setdefault(k, []).append(t)
        log(f"{len(picks)} tokens from {len(per_ex)} examples; SGD steps on {n_actual} of them at eta {etas}")
        tokens: list[dict] = [{} for _ in picks]
        theta_eval = pmap(lambda t: t.to(eval_dtype), theta)
        theta64 = pmap(lambda t: t.to(torch.float64), theta)
        L0_64 = L0 if dtype == torch.float64 else None
        done_actual = 0
        t_tok = time.perf_counter()
        for k, ts in per_ex.items():
            if args.steps_only:
                ts = [t for t in ts if t in actual_set]
                if not ts:
                    continue
            ex = scored[k]
            batch = make_batch([ex], pad, device)
            with torch.no_grad():
                hidden, calls = tail.prefix(batch.input_ids, batch.attention_mask)
            hidden, calls = hidden.to(dtype), cast_floats(calls, dtype)
            b_idx, q_pos, tgt = batch.flat_rows()

            def losses(p):
                return tm.head_ce(tail.run(p, hidden, calls)[b_idx, q_pos], tgt)

            fd: dict = {h: None for h in fd_hs}
            a_jvp = None
            if not args.steps_only:
                with torch.no_grad():
                    for h in fd_hs:
                        plus = losses(pmap(lambda t, d: t + h * d, theta, v))
                        minus = losses(pmap(lambda t, d: t - h * d, theta, v))
                        fd[h] = ((plus - minus) / (2 * h)).double().cpu().numpy()
                a_jvp = scorer64.score([ex])[0].a.numpy().astype(np.float64)
            a_stored = ex.scores.a.numpy().astype(np.float64)
            loss_stored = ex.scores.loss.numpy() if ex.scores.loss is not None else None
            resp = ex.tokens.response_positions()
            p = pmap(lambda t: t.detach().clone().requires_grad_(True), theta)
            with torch.enable_grad():
                ls = losses(p)
                for n_done, t in enumerate(ts):
                    j = picks[t][1]
                    grads = torch.autograd.grad(ls[j], leaves(p), retain_graph=n_done < len(ts) - 1)
                    gj: Params = {}
                    it = iter(grads)
                    for i in p:
                        gj[i] = {kk: next(it).detach() for kk in p[i]}
                    pos = int(resp[j])
                    rec = {
                        "example": ex.id,
                        "index": ex.index,
                        "j": j,
                        "n": len(resp),
                        "position": pos,
                        "token": ex.text[slice(*ex.tokens.spans()[pos].tolist())],
                        "loss": float(ls[j].detach()),
                        "loss_stored": None if loss_stored is None else float(loss_stored[j]),
                        "a_stored": float(a_stored[j]),
                        "a_jvp": None if a_jvp is None else float(a_jvp[j]),
                        "a_direct": pdot(v, gj),
                        **{f"a_fd_{h:g}": None if fd[h] is None else float(fd[h][j]) for h in fd_hs},
                        "g_dot": pdot(g, gj),
                        **({"g_half_dots": [pdot(hg, gj) for hg in halves]} if halves else {}),
                        "grad_norm": pnorm(gj),
                    }
                    if anchor is not None:
                        rec["anchor_dot"] = pdot(anchor, gj)
                    if t in actual_set:
                        gj_eval = pmap(lambda x: x.to(eval_dtype), gj)
                        rec["actual"] = {}
                        for eta in etas:
                            stepped = pmap(lambda th, gr: th - eta * gr, theta_eval, gj_eval)
                            rec["actual"][f"{eta:g}"] = obj.loss(stepped, eval_dtype) - L0_eval
                        if done_actual < args.dtype_check and eval_dtype != torch.float64:
                            eta = min(etas)
                            if L0_64 is None:
                                L0_64 = obj.loss(theta64, torch.float64)
                            stepped = pmap(lambda th, gr: th - eta * gr.to(torch.float64), theta64, gj)
                            rec["actual_float64"] = {f"{eta:g}": obj.loss(stepped, torch.float64) - L0_64}
                        done_actual += 1
                    tokens[t] = rec
            el = time.perf_counter() - t_tok
            log(f"example {ex.id}: {len(ts)} tokens; {sum(1 for r in tokens if r)} done, {el:.0f} s")
        timings["tokens_s"] = time.perf_counter() - t_tok

    # statistics
    tokens = [r for r in tokens if r]
    col = {
        key: np.array([r[key] for r in tokens], dtype=np.float64)
        for key in ("a_stored", "a_direct", "g_dot", "grad_norm", "loss")
    }
    jvp = (
        {}
        if args.steps_only
        else {
            "a_stored_vs_direct": agreement(col["a_stored"], col["a_direct"]),
            "a_jvp_vs_direct": agreement([r["a_jvp"] for r in tokens], col["a_direct"]),
            **{f"a_fd_{h:g}_vs_direct": agreement([r[f"a_fd_{h:g}"] for r in tokens], col["a_direct"]) for h in fd_hs},
            "a_stored_vs_fd": agreement(col["a_stored"], [r[f"a_fd_{min(fd_hs):g}"] for r in tokens]),
            "loss_vs_stored": agreement(col["loss"], [r["loss_stored"] for r in tokens])
            if all(r["loss_stored"] is not None for r in tokens)
            else None,
        }
    )
    target_term = (1 - lam) * col["g_dot"] / (g_norm + eps)
    decomposition = {
        "lambda": lam,
        "a_vs_g_dot": {
            "pearson": dc.pearson(col["a_stored"], col["g_dot"]),
            "spearman": dc.spearman(col["a_stored"], col["g_dot"]),
            "sign_agreement": sign_agreement(col["a_stored"], col["g_dot"]),
        },
        "share_a_positive": float((col["a_stored"] > 0).mean()),
        "share_g_dot_positive": float((col["g_dot"] > 0).mean()),
        "target_term_rms": float(np.sqrt((target_term**2).mean())),
    }
    if anchor is not None:
        anchor_term = lam * np.array([r["anchor_dot"] for r in tokens]) / (checks["g_anchor_norm"] + eps)
        decomposition.update(
            anchor_term_rms=float(np.sqrt((anchor_term**2).mean())),
            share_sign_set_by_anchor=float((np.sign(target_term + anchor_term) != np.sign(target_term)).mean()),
            target_plus_anchor_vs_a=agreement(target_term + anchor_term, col["a_direct"]),
            a_vs_anchor_dot=dc.pearson(col["a_stored"], anchor_term),
        )
    if halves:
        h1 = np.array([r["g_half_dots"][0] for r in tokens])
        h2 = np.array([r["g_half_dots"][1] for r in tokens])
        r12 = dc.pearson(h1, h2)
        decomposition["split_half"] = {
            "cos_g_halves": pdot(halves[0], halves[1]) / (pnorm(halves[0]) * pnorm(halves[1])),
            "pearson": r12,
            "spearman": dc.spearman(h1, h2),
            "sign_agreement": sign_agreement(h1, h2),
            # Spearman-Brown: the reliability of the dot with the whole D_val's gradient
            "pearson_whole_set_estimate": None if r12 is None else 2 * r12 / (1 + r12) if r12 > -1 else None,
            "pearson_half_vs_a": [dc.pearson(h1, col["a_stored"]), dc.pearson(h2, col["a_stored"])],
        }
        if anchor is not None:  # a_j itself (lambda and the anchor included) with each half's g_target
            an = lam * np.array([r["anchor_dot"] for r in tokens]) / (checks["g_anchor_norm"] + eps)
            a1 = (1 - lam) * h1 / (pnorm(halves[0]) + eps) + an
            a2 = (1 - lam) * h2 / (pnorm(halves[1]) + eps) + an
            decomposition["split_half"]["a_pearson"] = dc.pearson(a1, a2)
            decomposition["split_half"]["a_sign_agreement"] = sign_agreement(a1, a2)
    a_loss = {
        "spearman_a_loss": dc.spearman(col["a_stored"], col["loss"]),
        "spearman_abs_a_loss": dc.spearman(np.abs(col["a_stored"]), col["loss"]),
        "spearman_grad_norm_loss": dc.spearman(col["grad_norm"], col["loss"]),
        "spearman_abs_g_dot_grad_norm": dc.spearman(np.abs(col["g_dot"]), col["grad_norm"]),
        "cosine_g_grad_median": float(np.median(col["g_dot"] / (g_norm * col["grad_norm"]))),
        "cosine_g_grad_abs_median": float(np.median(np.abs(col["g_dot"]) / (g_norm * col["grad_norm"]))),
    }
    first_order = {}
    measured = [r for r in tokens if "actual" in r]
    for eta in etas:
        key = f"{eta:g}"
        act = np.array([r["actual"][key] for r in measured])
        pred_g = -eta * np.array([r["g_dot"] for r in measured])
        pred_a = -eta * np.array([r["a_stored"] for r in measured])
        step = eta * np.array([r["grad_norm"] for r in measured])
        first_order[key] = {
            "vs_first_order_g": compare(act, pred_g),
            "vs_minus_eta_a": compare(act, pred_a),
            "actual_abs_median": float(np.median(np.abs(act))) if len(act) else None,
            "step_norm_median": float(np.median(step)) if len(step) else None,
            "step_over_theta_median": float(np.median(step) / theta_norm) if len(step) else None,
        }
    dtype_check = [
        {"eta": k, "eval": r["actual"][k], "float64": val}
        for r in measured
        if "actual_float64" in r
        for k, val in r["actual_float64"].items()
    ]
    checked = [r for r in measured if "actual_float64" in r]
    if len(checked) >= 2:  # the smallest eta's statistics again, from the float64 evaluations
        eta = min(etas)
        act64 = np.array([r["actual_float64"][f"{eta:g}"] for r in checked])
        first_order[f"{eta:g} (float64)"] = {
            "vs_first_order_g": compare(act64, -eta * np.array([r["g_dot"] for r in checked])),
            "vs_minus_eta_a": compare(act64, -eta * np.array([r["a_stored"] for r in checked])),
            "actual_abs_median": float(np.median(np.abs(act64))),
            "step_norm_median": float(np.median(eta * np.array([r["grad_norm"] for r in checked]))),
            "step_over_theta_median": float(np.median(eta * np.array([r["grad_norm"] for r in checked])) / theta_norm),
        }
    timings["total_s"] = time.perf_counter() - t_start
    result = {
        "provenance": {**started, "model": meta.base_model, "checkpoint": str(run.checkpoint)},
        "settings": {
            "scored": args.scored,
            "scored_stream": scored_info,
            "run": args.run,
            "examples": len(per_ex),
            "tokens": len(picks),
            "actual_tokens": len(measured),
            "steps_only": args.steps_only,
            "etas": etas,
            "fd_h": fd_hs,
            "dtype": args.dtype,
            "eval_dtype": args.eval_dtype or args.dtype,
            "seed": args.seed,
            "direction_layers": len(names),
            "tail_parameters": int(sum(t.numel() for t in leaves(theta))),
            "theta_tail_norm": theta_norm,
            "warmup": {k: getattr(meta, k) for k in ("warm_examples", "val_examples", "steps", "sft", "val_loss")},
        },
        "checks": checks,
        "jvp": jvp,
        "decomposition": decomposition,
        "a_and_loss": a_loss,
        "first_order": first_order,
        "dtype_check": dtype_check,
        "timings": timings,
        "tokens": tokens,
    }
    dc.write_json(args.json, result)
    if args.md:
        dc.write_atomic(args.md, markdown(result))
    log(f"wrote {args.json} ({timings['total_s']:.0f} s)")
    return 0


def markdown(r: dict) -> str:
    s, c, p = r["settings"], r["checks"], r["provenance"]
    out = [
        "## a_j end to end (aj_check.py)",
        "",
        f"Model {p['model']}, device {p['device']}{' (' + p['gpu'] + ')' if p.get('gpu') else ''}, "
        f"commit {p['commit']}, {p['date']}.",
        f"`{p['command']}`",
        "",
        f"{s['tokens']} response tokens from {s['examples']} scored examples (seed {s['seed']}); SGD steps on "
        f"{s['actual_tokens']} of them. Tail: {s['direction_layers']} blocks, {s['tail_parameters']:,} parameters, "
        f"{s['dtype']} (steps evaluated in {s['eval_dtype']}). D_val: {c['val_examples']} examples, "
        f"{c['val_loss_tokens']:,} loss tokens. Warm-up: {s['warmup']['warm_examples']} examples, "
        f"{s['warmup']['steps']} steps.",
        "",
        "**Checks.** "
        f"D_val loss by cached tail (float32) {dc.fmt(c['val_loss_cached_tail_float32'], 7)} against a full forward "
        f"{dc.fmt(c['val_loss_full_forward_float32'], 7)} (warm-up recorded "
        f"{dc.fmt(c['val_loss_warmup_recorded'], 7)}); |g_target| {dc.fmt(c['g_target_norm'], 5)} (warm-up "
        f"{dc.fmt(c['g_target_norm_warmup_recorded'], 5)})"
        + (
            f"; v rebuilt from g_target and theta_bar - theta_old: cosine with the stored v "
            f"{c['v_rebuilt_cosine']:.7f}, cos(g_target, g_anchor) {dc.fmt(c['cos_g_target_anchor'])}."
            if "v_rebuilt_cosine" in c
            else "."
        ),
        "",
        "**The JVP** (per token, against the direct v . grad l_j from a backward pass):",
        "",
        (
            dc.table(
                ["estimate", "Pearson", "sign agreement", "max |error| / RMS", "median relative error"],
                [
                    [
                        k.replace("_vs_direct", ""),
                        v["pearson"],
                        v["sign_agreement"],
                        v["max_abs_error_over_rms"],
                        v["median_rel_error"],
                    ]
                    for k, v in r["jvp"].items()
                    if k.endswith("_vs_direct") and v
                ],
            )
            if r["jvp"]
            else "(not measured: --steps-only)"
        ),
        "",
    ]
    d = r["decomposition"]
    out += [
        f"**a_j against g_target . grad l_j** (all {s['tokens']} tokens): Pearson "
        f"{dc.fmt(d['a_vs_g_dot']['pearson'])}, Spearman {dc.fmt(d['a_vs_g_dot']['spearman'])}, sign agreement "
        f"{dc.fmt(d['a_vs_g_dot']['sign_agreement'])}; a_j > 0 for {dc.fmt(d['share_a_positive'])}, "
        f"g_target . grad l_j > 0 for {dc.fmt(d['share_g_dot_positive'])}."
        + (
            f" RMS of the target term (1-lambda) g.grad/|g| {dc.fmt(d['target_term_rms'])}, of the anchor term "
            f"{dc.fmt(d['anchor_term_rms'])}; the anchor sets the sign for {dc.fmt(d['share_sign_set_by_anchor'])} "
            "of the tokens."
            if "anchor_term_rms" in d
            else ""
        ),
        (
            f"Two disjoint halves of D_val: cos(g_1, g_2) {dc.fmt(d['split_half']['cos_g_halves'])}; across tokens "
            f"g_1 . grad l_j against g_2 . grad l_j: Pearson {dc.fmt(d['split_half']['pearson'])} (for the whole D_val, "
            f"Spearman-Brown: {dc.fmt(d['split_half']['pearson_whole_set_estimate'])}), sign agreement "
            f"{dc.fmt(d['split_half']['sign_agreement'])}"
            + (
                f"; a_j made with each half: Pearson {dc.fmt(d['split_half']['a_pearson'])}, sign agreement "
                f"{dc.fmt(d['split_half']['a_sign_agreement'])}."
                if "a_pearson" in d["split_half"]
                else "."
            )
            if "split_half" in d
            else ""
        ),
        f"Spearman(a_j, l_j) {dc.fmt(r['a_and_loss']['spearman_a_loss'])}, Spearman(|a_j|, l_j) "
        f"{dc.fmt(r['a_and_loss']['spearman_abs_a_loss'])}, Spearman(|grad l_j|, l_j) "
        f"{dc.fmt(r['a_and_loss']['spearman_grad_norm_loss'])}; median cos(g_target, grad l_j) "
        f"{dc.fmt(r['a_and_loss']['cosine_g_grad_median'], 4)} (of its absolute value "
        f"{dc.fmt(r['a_and_loss']['cosine_g_grad_abs_median'], 4)}).",
        "",
        f"**One SGD step on one token** ({s['actual_tokens']} tokens): actual change of the D_val loss against "
        "the first-order prediction -eta g_target . grad l_j, and against -eta a_j:",
        "",
    ]
    rows = []
    for eta, f in r["first_order"].items():
        for name, key in (("-eta g.grad", "vs_first_order_g"), ("-eta a_j", "vs_minus_eta_a")):
            v = f[key]
            rows.append(
                [
                    eta,
                    name,
                    v["pearson"],
                    v["spearman"],
                    v["sign_agreement"],
                    v["sign_agreement_top_half"],
                    v["slope_through_origin"],
                    v["ratio_median"],
                    f["actual_abs_median"],
                    f["step_over_theta_median"],
                ]
            )
    out.append(
        dc.table(
            [
                "eta",
                "predictor",
                "Pearson",
                "Spearman",
                "sign agr.",
                "sign agr. |pred| > median",
                "slope",
                "median actual/pred",
                "median |actual|",
                "median |step| / |theta|",
            ],
            rows,
        )
    )
    if r["dtype_check"]:
        out += [
            "",
            "Rounding check (smallest eta, eval dtype against float64): "
            + "; ".join(f"{dc.fmt(x['eval'])} vs {dc.fmt(x['float64'])}" for x in r["dtype_check"]),
        ]
    out += ["", f"Wall time {r['timings']['total_s']:.0f} s.", ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())

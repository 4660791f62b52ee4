#!/usr/bin/env python3
"""How much of a_j is a bag-of-tokens term? (issue 28, item 2)

    python bench/diagnostics/marginal_check.py SCORED.bridge --from WARM_RUN \\
        --json results/marginal.json --md results/marginal.md

g_target is a sum over D_val's tokens of per-token gradients, and at the output each of them is
(p_t - e_{y_t}): predicted distribution minus the target. Summed, these terms no longer depend on
context: they say which token ids the checkpoint under- or over-predicts on D_val. If that common
part dominates g_target, a_j = v . grad l_j mostly measures whether token j's id is one D_val wants
more of, not what token j teaches in its context. Two cheap predictors of a_j, computed from
theta_bar's output distributions alone (no gradient):

- ``u_vocab``: r_{y_j} - p_j . r, with r = f - p_bar over the vocabulary (f: D_val's target
  frequencies, p_bar: the mean predicted distribution over D_val's loss positions): the first-order
  change of the D_val loss from a gradient step on token j if only an output bias could move;
- ``u_hidden``: d . d_j, with d_j = w_{y_j} - W^T p_j (target output embedding minus the expected
  one) and d the mean of d_t over D_val: the same if only a constant shift of the final hidden
  state could move (through the LM head W, without the final norm's Jacobian).

Reported against the stored a_j over the response tokens of the first ``--limit`` scored examples:
Pearson, Spearman and sign agreement, and the same after averaging per token id. One forward pass
over D_val and one over those examples; float32.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import diag_common as dc  # noqa: E402
from aj_check import read_scored, sign_agreement, val_examples  # noqa: E402

from bridgecli.artifacts.warmup_run import WarmupRun  # noqa: E402
from bridgecli.modeling.loading import resolve_device  # noqa: E402
from bridgecli.modeling.params import decoder_of  # noqa: E402
from bridgecli.modeling.score_batch import make_batch  # noqa: E402
from bridgecli.modeling.scoring import load_scoring_checkpoint  # noqa: E402
from bridgecli.training.batching import collate_padded  # noqa: E402
from bridgecli.training.rows import full_response_row  # noqa: E402


def log(msg: str) -> None:
    print(f"[marginal_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def final_hidden(model, input_ids, attention_mask) -> torch.Tensor:
    out = decoder_of(model)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return out.last_hidden_state


@torch.no_grad()
def val_residuals(model, rows, pad: int, device: str, batch: int, chunk: int = 512):
    """r = f - p_bar over the vocabulary and d = mean of (w_y - W^T p) over D_val's loss positions."""
    W = model.get_output_embeddings().weight.float()
    V = W.shape[0]
    p_sum = torch.zeros(V, dtype=torch.float64, device=device)
    f = torch.zeros(V, dtype=torch.float64, device=device)
    d_sum = torch.zeros(W.shape[1], dtype=torch.float64, device=device)
    n = 0
    for s in range(0, len(rows), batch):
        mb = collate_padded(rows[s : s + batch], pad).to(device)
        h = final_hidden(model, mb.input_ids, mb.attention_mask)[mb.keep].float()
        for c in range(0, h.shape[0], chunk):
            p = F.softmax(h[c : c + chunk] @ W.T, dim=-1)
            y = mb.target[c : c + chunk]
            p_sum += p.double().sum(0)
            f += torch.bincount(y, minlength=V).double()
            d_sum += (W[y] - p @ W).double().sum(0)
        n += h.shape[0]
    return (f - p_sum) / n, d_sum / n, n


@torch.no_grad()
def per_example_residuals(model, rows, pad: int, device: str, batch: int, chunk: int = 512):
    """For each row: the sum of (w_y - W^T p) over its loss positions, and their number."""
    W = model.get_output_embeddings().weight.float()
    sums, counts = [], []
    for s in range(0, len(rows), batch):
        mb = collate_padded(rows[s : s + batch], pad).to(device)
        h = final_hidden(model, mb.input_ids, mb.attention_mask)
        for b in range(h.shape[0]):
            hb = h[b][mb.keep[b]].float()
            y = mb.labels[b, 1:][mb.keep[b, :-1]]
            total = torch.zeros(W.shape[1], dtype=torch.float64, device=device)
            for c in range(0, hb.shape[0], chunk):
                p = F.softmax(hb[c : c + chunk] @ W.T, dim=-1)
                total += (W[y[c : c + chunk]] - p @ W).double().sum(0)
            sums.append(total.cpu().numpy())
            counts.append(int(hb.shape[0]))
    return np.stack(sums), np.array(counts)


def reliability(D: np.ndarray, a: np.ndarray, sums: np.ndarray, counts: np.ndarray, sizes, seed: int) -> dict:
    """The common direction d from disjoint D_val-sized groups of the pool: how well two groups of the
    same size agree on u = d . d_j (across the scored tokens), and how well each agrees with a_j."""
    order = np.random.default_rng(seed).permutation(len(counts))
    out = {}
    for size in sizes:
        groups = [order[g * size : (g + 1) * size] for g in range(len(order) // size)]
        us = [D @ (sums[g].sum(0) / counts[g].sum()) for g in groups]
        pairs = [(us[2 * i], us[2 * i + 1]) for i in range(len(us) // 2)]
        if not pairs:
            continue
        out[str(size)] = {
            "pairs": len(pairs),
            "pearson": float(np.mean([dc.pearson(x, y) for x, y in pairs])),
            "spearman": float(np.mean([dc.spearman(x, y) for x, y in pairs])),
            "sign_agreement": float(np.mean([sign_agreement(x, y) for x, y in pairs])),
            "pearson_with_a": float(np.mean([dc.pearson(u, a) for u in us])),
            "sign_agreement_with_a": float(np.mean([sign_agreement(u, a) for u in us])),
        }
    u_pool = D @ (sums.sum(0) / counts.sum())
    out["whole pool"] = {
        "examples": int(len(counts)),
        "pearson_with_a": dc.pearson(u_pool, a),
        "sign_agreement_with_a": sign_agreement(u_pool, a),
    }
    return out


@torch.no_grad()
def token_predictors(model, exs, r, d, pad: int, device: str, chunk: int = 512):
    """u_vocab and u_hidden for every response token of ``exs`` (in order), and every token's
    d_j = w_{y_j} - W^T p_j (float32, host)."""
    W = model.get_output_embeddings().weight.float()
    r32, d32 = r.float(), d.float()
    u_vocab, u_hidden, D = [], [], []
    for ex in exs:
        batch = make_batch([ex], pad, device)
        h = final_hidden(model, batch.input_ids, batch.attention_mask)[batch.b_idx, batch.q_pos].float()
        for c in range(0, h.shape[0], chunk):
            p = F.softmax(h[c : c + chunk] @ W.T, dim=-1)
            y = batch.targets[c : c + chunk]
            dj = W[y] - p @ W
            u_vocab.append((r32[y] - p @ r32).double().cpu())
            u_hidden.append((dj @ d32).double().cpu())
            D.append(dj.cpu())
    return torch.cat(u_vocab).numpy(), torch.cat(u_hidden).numpy(), torch.cat(D).numpy().astype(np.float64)


def against(a: np.ndarray, u: np.ndarray, ids: np.ndarray, min_count: int) -> dict:
    uniq, inv, counts = np.unique(ids, return_inverse=True, return_counts=True)
    a_id = np.bincount(inv, weights=a) / counts
    u_id = np.bincount(inv, weights=u) / counts
    k = counts >= min_count
    return {
        "pearson": dc.pearson(a, u),
        "spearman": dc.spearman(a, u),
        "sign_agreement": sign_agreement(a, u),
        "per_id": {
            "ids": int(k.sum()),
            "pearson": dc.pearson(a_id[k], u_id[k]),
            "spearman": dc.spearman(a_id[k], u_id[k]),
            "sign_agreement": sign_agreement(a_id[k], u_id[k]),
        },
        # a_j minus its id's mean: what is left once the id is known
        "within_id_spearman": dc.spearman(a - a_id[inv], u - u_id[inv]),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scored")
    ap.add_argument("--from", dest="run", required=True)
    ap.add_argument("--val", help="D_val file (default: the one the warm-up recorded)")
    ap.add_argument("--val-limit", type=int)
    ap.add_argument("--val-batch", type=int, default=8)
    ap.add_argument("--limit", type=int, help="only the first N scored examples")
    ap.add_argument("--min-id-count", type=int, default=20)
    ap.add_argument("--pool", help="more validation-like data, disjoint from the rest: the reliability of d by size")
    ap.add_argument("--pool-limit", type=int, help="only the first N records of --pool")
    ap.add_argument("--pool-sizes", default="8,16,32,64", help="D_val sizes the pool is cut into")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--prompt-field")
    ap.add_argument("--response-field")
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    run = WarmupRun.open(args.run)
    device = resolve_device(args.device)
    started = dc.provenance(device, None)  # the commit and date at the start, when the code was read
    ck = load_scoring_checkpoint(run, "float32", device)
    model, tokenizer = ck.model, ck.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    scored, info = read_scored(args.scored)
    if info["tokenizer_fingerprint"] != ck.tokenizer_fingerprint:
        raise SystemExit(f"{args.scored}: its tokenizer is not the checkpoint's in {run.root}")
    exs = scored[: args.limit] if args.limit else scored
    vals, where = val_examples(run, tokenizer, model, args)
    rows = sorted((full_response_row(e.id, e.tokens) for e in vals), key=lambda r: len(r.input_ids))
    r, d, n_val = val_residuals(model, rows, pad, device, args.val_batch)
    log(f"D_val {len(vals)} examples, {n_val} loss tokens; |r| {float(r.norm()):.4g}, |d| {float(d.norm()):.4g}")
    u_vocab, u_hidden, D = token_predictors(model, exs, r, d, pad, device)
    a = np.concatenate([ex.scores.a.numpy().astype(np.float64) for ex in exs])
    ids = np.concatenate([np.asarray(ex.tokens.input_ids)[ex.tokens.response_positions()] for ex in exs])
    res = {
        "provenance": {**started, "model": run.meta().base_model, "checkpoint": str(run.checkpoint)},
        "settings": {
            "scored": args.scored,
            "run": args.run,
            "examples": len(exs),
            "tokens": int(len(a)),
            "min_id_count": args.min_id_count,
        },
        "val": {"source": where, "examples": len(vals), "loss_tokens": n_val},
        "u_vocab": against(a, u_vocab, ids, args.min_id_count),
        "u_hidden": against(a, u_hidden, ids, args.min_id_count),
        "share_a_positive": float((a > 0).mean()),
    }
    if args.pool:
        from bridgecli.data.examples import DataOptions, iter_examples, with_model_limit

        opts = DataOptions(
            prompt_field=args.prompt_field,
            response_field=args.response_field,
            chat_template=run.meta().chat_template is not False,
            limit=args.pool_limit,
        )
        pool = list(iter_examples(args.pool, tokenizer, with_model_limit(opts, model)))
        prow = [full_response_row(e.id, e.tokens) for e in pool]
        sums, counts = per_example_residuals(model, prow, pad, device, args.val_batch)
        sizes = [int(x) for x in args.pool_sizes.split(",")]
        res["pool"] = {"source": args.pool, **reliability(D, a, sums, counts, sizes, args.seed)}
        log(f"pool: {len(pool)} examples")
    res["seconds"] = time.perf_counter() - t0
    dc.write_json(args.json, res)
    md = markdown(res)
    if args.md:
        dc.write_atomic(args.md, md)
    print(md)
    return 0


def markdown(r: dict) -> str:
    p, s = r["provenance"], r["settings"]
    rows = []
    for name in ("u_vocab", "u_hidden"):
        v = r[name]
        rows.append(
            [
                name,
                v["pearson"],
                v["spearman"],
                v["sign_agreement"],
                v["per_id"]["spearman"],
                v["per_id"]["sign_agreement"],
                v["within_id_spearman"],
            ]
        )
    pool = ""
    if "pool" in r:
        sizes = [k for k in r["pool"] if k not in ("source", "whole pool")]
        pool = (
            f"The common direction d from disjoint groups of {r['pool']['whole pool']['examples']} more examples "
            "(--pool), by group size: agreement between two groups on u = d . d_j across the tokens, and of each "
            "group's u with a_j (from the warm-up's D_val):\n\n"
            + dc.table(
                [
                    "D_val size",
                    "pairs",
                    "Pearson",
                    "Spearman",
                    "sign agreement",
                    "Pearson with a_j",
                    "sign agr. with a_j",
                ],
                [
                    [
                        k,
                        v["pairs"],
                        v["pearson"],
                        v["spearman"],
                        v["sign_agreement"],
                        v["pearson_with_a"],
                        v["sign_agreement_with_a"],
                    ]
                    for k, v in ((k, r["pool"][k]) for k in sizes)
                ]
                + [
                    [
                        f"all {r['pool']['whole pool']['examples']}",
                        "-",
                        "-",
                        "-",
                        "-",
                        r["pool"]["whole pool"]["pearson_with_a"],
                        r["pool"]["whole pool"]["sign_agreement_with_a"],
                    ]
                ],
            )
            + "\n"
        )
    return "\n".join(
        [
            "## How much of a_j is a bag-of-tokens term (marginal_check.py)",
            "",
            f"Model {p['model']}, device {p['device']}, commit {p['commit']}, {p['date']}. `{p['command']}`",
            "",
            f"{s['tokens']:,} response tokens of {s['examples']} scored examples; D_val {r['val']['examples']} "
            f"examples ({r['val']['loss_tokens']:,} loss tokens). Per id: means over the "
            f"{r['u_vocab']['per_id']['ids']} token ids with at least {s['min_id_count']} occurrences; within ids: "
            "a_j and the predictor less their id's mean. Share of a_j > 0: " + dc.fmt(r["share_a_positive"]) + ".",
            "",
            dc.table(
                [
                    "predictor of a_j",
                    "Pearson",
                    "Spearman",
                    "sign agreement",
                    "per-id Spearman",
                    "per-id sign agreement",
                    "Spearman within ids",
                ],
                rows,
            ),
            "",
            pool,
        ]
    )


if __name__ == "__main__":
    sys.exit(main())

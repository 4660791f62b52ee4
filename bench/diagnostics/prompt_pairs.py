#!/usr/bin/env python3
"""Why the prompt-side surrogate does or does not track the exact scores: pair-level statistics
between the exact interaction beta[j, i] = a_j(P) - a_j(P with prompt token i hidden) and the
surrogate A[j, i] a_j, on the examples `bridge analyze fidelity` uses.

    python bench/diagnostics/prompt_pairs.py data/gsm8k/train.jsonl --from runs/diag/warm \\
        --n 20 --max-length 200 --cache runs/diag/cache

With the same --cache as an earlier `bridge analyze fidelity` run, the exact matrices are read from
it (no perturbation passes). Prints per-statistic mean/min/max over the examples; --out writes JSON.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from bridgecli.analysis.metrics import spearman
from bridgecli.data.examples import DataOptions
from bridgecli.steps.analyze import Source, _exact_scores, _score, load, matrix_cache, pick_examples

STATS = {
    "pair_pearson": "Pearson(beta, A a) over all (j, i) pairs",
    "pair_spearman": "Spearman(beta, A a) over all (j, i) pairs",
    "full_state_spearman": "Spearman over prompt tokens of sum_j beta vs sum_j A a (every response token kept)",
    "abs_beta_vs_attention": "Spearman(|beta|, A) over all pairs: does the size of an effect follow attention?",
    "sign_agreement_top10": "share of the 10% largest |beta| whose sign equals sign(A a) = sign(a_j)",
    "effect_over_utility": "mean over j of sum_i |beta[j, i]| / mean |a_j|",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("--from", dest="run", required=True)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-length", type=int, default=None)
    ap.add_argument("--perturb", default="mask", choices=("mask", "replace"))
    ap.add_argument("--cache", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    src = Source(args.data, args.run, args.n, args.seed, device="cpu", cache=args.cache)  # data, --from, --n, --seed
    src.data_opts = DataOptions(max_length=args.max_length)
    loaded = load(src)
    examples = _score(loaded, pick_examples(src, loaded.ctx.tokenizer, loaded.meta), src.batch_size)
    exact = _exact_scores(loaded, src, args.perturb, None)
    cache = matrix_cache(src, loaded, exact)
    rows = []
    for ex in examples:
        a, A = ex.scores.a.numpy().astype(np.float64), ex.scores.A.numpy().astype(np.float64)
        _, beta = cache.prompt_matrix(exact, ex)  # [n, m]
        sur = A * a[:, None]
        big = np.abs(beta) >= np.quantile(np.abs(beta), 0.9)
        rows.append(
            {
                "id": ex.id,
                "pair_pearson": float(np.corrcoef(beta.ravel(), sur.ravel())[0, 1]),
                "pair_spearman": spearman(beta.ravel(), sur.ravel()),
                "full_state_spearman": spearman(beta.sum(0), sur.sum(0)),
                "abs_beta_vs_attention": spearman(np.abs(beta).ravel(), A.ravel()),
                "sign_agreement_top10": float(np.mean(np.sign(beta[big]) == np.sign(sur[big]))),
                "effect_over_utility": float(np.abs(beta).sum(1).mean() / np.abs(a).mean()),
            }
        )
    summary = {
        k: {
            "mean": float(np.mean([r[k] for r in rows])),
            "min": float(np.min([r[k] for r in rows])),
            "max": float(np.max([r[k] for r in rows])),
            "what": what,
        }
        for k, what in STATS.items()
    }
    for k, s in summary.items():
        print(f"{k:24s} mean {s['mean']:7.3f}  min {s['min']:7.3f}  max {s['max']:7.3f}   {s['what']}")
    print(f"{len(rows)} examples; exact matrices from the cache: {cache.hits}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"params": vars(args), "summary": summary, "examples": rows}, fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()

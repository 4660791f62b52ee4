#!/usr/bin/env python3
"""The host-side work of `bridge score`, without a GPU: reading and tokenising real data (chat
template and character offsets), encoding + compressing the scored records, and the scorer's
per-batch host work (building a batch, cutting out each example's rows, making its records). On a
fast GPU these run on one CPU core per rank; if one is slower than the GPU scores, it caps
`bridge score`.

    python bench/score/cpu_side.py --data data/gsm8k/train.jsonl --n 2000 [--out results/cpu_side.json]

Scores are synthetic (random a, c, loss; A rows that sum to <= 1, stored in float16), with the
shapes the real examples give, so the writer compresses data of the real size and entropy class.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import time

import numpy as np

from bridgecli.data.examples import DataOptions, iter_examples
from bridgecli.format.records import Array, Header, ModelInfo, Scores
from bridgecli.format.writer import StreamWriter
from bridgecli.modeling.loading import load_tokenizer, resolve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--n", type=int, default=2000, help="examples to read")
    ap.add_argument("--model", default=None, help="tokenizer source (default: the embedded SmolLM2)")
    ap.add_argument(
        "--batch-examples",
        type=int,
        default=150,
        help="examples in the one batch whose host-side work is timed (~32K tokens of GSM8K)",
    )
    ap.add_argument("--out", default=None, help="write the numbers as JSON here")
    args = ap.parse_args()

    tokenizer = load_tokenizer(resolve(args.model))
    t0 = time.perf_counter()
    examples = list(iter_examples(args.data, tokenizer, DataOptions(limit=args.n)))
    t_tok = time.perf_counter() - t0
    tokens = sum(len(e.tokens.input_ids) for e in examples)
    response = sum(len(e.tokens.response_positions()) for e in examples)

    rng = np.random.default_rng(0)
    scored = []
    for ex in examples:
        m, n = len(ex.tokens.prompt_positions()), len(ex.tokens.response_positions())
        rows = rng.dirichlet(np.ones(m + 1), size=n)[:, :m] if m else np.zeros((n, 0))
        sc = Scores(
            scorer="bridge",
            a=Array.of(rng.normal(size=n).astype(np.float32)),
            c=Array.of(rng.random(n).astype(np.float32)),
            A=Array.of(rows.astype(np.float16)),
            loss=Array.of(rng.random(n).astype(np.float32)),
        )
        scored.append(ex.__class__(**{**{f: getattr(ex, f) for f in ex.__struct_fields__}, "scores": sc}))
    header = Header(stage="scores", producer="bench", created="", model=ModelInfo("bench", "", ""))
    t0 = time.perf_counter()
    buf = io.BytesIO()
    writer = StreamWriter(buf, header)
    for ex in scored:
        writer.write(ex)
    writer.close()
    t_write = time.perf_counter() - t0

    # the scorer's per-batch host work: building a batch, then cutting out each example's rows and
    # making its records (the row gather runs on the CPU here, on the GPU in a real run)
    import torch

    from bridgecli.modeling.score_batch import make_batch
    from bridgecli.modeling.scoring import split_rows

    group = examples[: args.batch_examples]
    group_tokens = sum(len(e.tokens.input_ids) for e in group)
    t0 = time.perf_counter()
    batch = make_batch(group, 0, "cpu")
    t_batch = time.perf_counter() - t0
    rows = torch.rand(len(group), batch.input_ids.shape[1], batch.input_ids.shape[1])
    t0 = time.perf_counter()
    for A, c in split_rows(rows, batch, 4):
        Scores(
            scorer="bridge",
            a=Array.of(np.zeros(len(c), np.float32)),
            c=Array.of(c),
            A=Array.of(A, "float16"),
            loss=Array.of(np.zeros(len(c), np.float32)),
        )
    t_rows = time.perf_counter() - t0

    result = {
        "data": args.data,
        "examples": len(examples),
        "tokens": tokens,
        "response_tokens": response,
        "tokenise_s": round(t_tok, 3),
        "tokenise_tokens_per_s": round(tokens / t_tok),
        "write_s": round(t_write, 3),
        "write_tokens_per_s": round(tokens / t_write),
        "bytes_per_response_token": round(len(buf.getvalue()) / max(response, 1), 1),
        "batch_examples": len(group),
        "batch_tokens": group_tokens,
        "batch_padded_length": batch.input_ids.shape[1],
        "make_batch_s": round(t_batch, 4),
        "rows_and_records_s": round(t_rows, 4),
        "batch_host_tokens_per_s": round(group_tokens / (t_batch + t_rows)),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "threads": os.environ.get("OMP_NUM_THREADS"),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)
            fh.write("\n")


if __name__ == "__main__":
    main()

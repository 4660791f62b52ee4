"""A plain bf16 forward process over a data file, the baseline of e2e.py: load the model and its
tokenizer as ``bridge score`` does, tokenise every record with the same chat template and max length
(bridgecli's own tokeniser, so the tokens are the same), then run ``model(...).logits`` under no_grad
over the same length-bucketed batches as ``bridge score`` (windows of ``--window`` examples, at most
``--max-tokens`` padded tokens and ``--batch-size`` rows a batch). Prints one JSON line (phase times).

    python bench/score/e2e_forward.py --model RUN/checkpoint --data data.jsonl
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
from itertools import islice  # noqa: E402

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402

from bridgecli.core.buckets import bucket  # noqa: E402
from bridgecli.data.examples import DataOptions, iter_examples, with_model_limit  # noqa: E402
from bridgecli.modeling.loading import load_model, load_tokenizer  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32768)
    args = ap.parse_args(argv)
    t_import = time.perf_counter() - T_START

    t0 = time.perf_counter()
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, dtype=torch.bfloat16, device=args.device).eval()
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    t_load = time.perf_counter() - t0

    t0 = time.perf_counter()
    examples = list(iter_examples(args.data, tokenizer, with_model_limit(DataOptions(), model)))
    t_tok = time.perf_counter() - t0
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    t0 = time.perf_counter()
    tokens = 0
    first = None
    batches = 0
    it = iter(examples)
    with torch.no_grad():
        while window := list(islice(it, args.window)):
            for group in bucket([len(e.tokens.input_ids) for e in window], args.max_tokens, args.batch_size):
                rows = [window[i].tokens.input_ids for i in group]
                longest = max(len(r) for r in rows)
                ids = torch.full((len(rows), longest), pad, dtype=torch.long)
                mask = torch.zeros((len(rows), longest), dtype=torch.long)
                for b, r in enumerate(rows):
                    ids[b, : len(r)] = torch.tensor(r)
                    mask[b, : len(r)] = 1
                model(input_ids=ids.to(args.device), attention_mask=mask.to(args.device), use_cache=False).logits
                tokens += sum(len(r) for r in rows)
                batches += 1
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            if first is None:
                first = (time.perf_counter(), tokens)
    t_loop = time.perf_counter() - t0
    after = (tokens - first[1]) / (t0 + t_loop - first[0]) if first and tokens > first[1] else None
    print(
        json.dumps(
            {
                "import_s": round(t_import, 2),
                "load_s": round(t_load, 2),
                "tokenise_s": round(t_tok, 2),
                "loop_s": round(t_loop, 2),
                "examples": len(examples),
                "tokens": tokens,
                "batches": batches,
                "loop_tokens_per_s": round(tokens / t_loop),
                "first_window_s": round(first[0] - t0, 2) if first else None,
                "after_first_tokens_per_s": round(after) if after else None,
                "total_in_process_s": round(time.perf_counter() - T_START, 2),
            }
        )
    )


if __name__ == "__main__":
    main()

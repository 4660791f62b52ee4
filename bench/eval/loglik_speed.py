"""How fast the log-likelihood tasks score: requests per second of ``loglikelihood`` on the first N HellaSwag
items (4 endings each) with a random model of a given vocabulary, on the device given. A 151,936-token vocabulary
(Qwen2.5's) is where the old host-side log-softmax hurt: it moved ``[batch, tail, vocab]`` floats off the GPU per
batch, and a 0.5B model's full HellaSwag ran at about 20 requests a second on an H200 (2026-11-28 grid).

    python bench/eval/loglik_speed.py DATA/hellaswag/hellaswag_val_full.txt.bz2 [--n 200] [--vocab 151936]
        [--hidden 64] [--layers 2] [--batch-size 32] [--device cpu] [--repeats 3] [--model MODEL [--dtype float32]]

``--model`` times a real model (a folder, a .gguf file, as ``bridge eval`` loads it) instead of the random one.

Prints one JSON line: requests, seconds (min and median of the repeats), requests per second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from bridgecli.evaluation.loglik import loglikelihood  # noqa: E402
from bridgecli.evaluation.mc_data import load_hellaswag  # noqa: E402
from bridgecli.modeling.loading import load_tokenizer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", help="a real model instead of the random one")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    if args.model:
        from bridgecli.modeling.loading import load_model, resolve

        ref = resolve(args.model)
        model = load_model(ref, device=args.device, dtype=getattr(torch, args.dtype)).eval()
        tok = load_tokenizer(ref)
        vocab = model.config.vocab_size
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        tok = load_tokenizer(None)
        vocab = max(args.vocab, len(tok))
        cfg = LlamaConfig(
            vocab_size=vocab,
            hidden_size=args.hidden,
            intermediate_size=4 * args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=4,
            num_key_value_heads=4,
        )
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).to(args.device).eval()
    items = load_hellaswag(args.data)[: args.n]
    requests = [(it.query, c) for it in items for c in it.choices]
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        loglikelihood(model, tok, requests, batch_size=args.batch_size, progress=False)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    print(
        json.dumps(
            {
                "requests": len(requests),
                "vocab": vocab,
                "model": args.model or "random",
                "device": args.device,
                "seconds_min": round(min(times), 3),
                "seconds_median": round(statistics.median(times), 3),
                "requests_per_s": round(len(requests) / min(times), 1),
            }
        )
    )


if __name__ == "__main__":
    main()

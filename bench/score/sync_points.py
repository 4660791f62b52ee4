"""Where `bridge score`'s loop makes the host wait for the GPU: every synchronising CUDA call made
while a batch's device work is being queued (``BridgeScorer._launch``), found with
``torch.cuda.set_sync_debug_mode("warn")``, with the Python stack that made it. A sync there
drains the GPU's queue, so the GPU idles while the host queues what follows (docs/benchmarks.md).

    python bench/score/sync_points.py --data gsm8k/train.jsonl --tokenizer TOKENIZER_DIR \
        [--shape llama-3.2-1b] [--n 512] --out bench/score/results/sync_points_h200.json

Writes one entry per distinct stack (innermost frames of bridgecli and transformers), with how many
times it synchronised in the batches after the first two (which compile and autotune).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "src"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--shape", default="llama-3.2-1b")
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--work", default="/tmp/bridge-e2e")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch

    from e2e import build, head

    from bridgecli.modeling import scoring

    folder = Path(args.work) / args.shape
    run = build(args.shape, args.tokenizer, folder, "cuda")
    data = head(args.data, folder / f"sync_{args.n}.jsonl", args.n)
    stacks: dict[tuple, int] = {}
    state = {"batches": 0, "on": False}

    def record(message, category, filename, lineno, file=None, line=None):
        if not state["on"] or "synchronizing" not in str(message):
            return
        frames = [
            f for f in traceback.extract_stack()[:-1] if "bridgecli" in f.filename or "transformers" in f.filename
        ]
        key = tuple(f"{Path(f.filename).name}:{f.lineno} {f.name}: {(f.line or '').strip()}" for f in frames[-8:])
        stacks[key] = stacks.get(key, 0) + 1

    warnings.showwarning = record
    warnings.simplefilter("always")
    launch = scoring.BridgeScorer._launch

    def watched(self, examples):
        state["batches"] += 1
        state["on"] = state["batches"] > 2
        if state["on"]:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            return launch(self, examples)
        finally:
            torch.cuda.set_sync_debug_mode(0)
            state["on"] = False

    scoring.BridgeScorer._launch = watched
    from bridgecli.cli.app import app

    out_file = folder / "sync.bridge"
    out_file.unlink(missing_ok=True)
    try:
        app(["score", str(data), "--from", str(run), "-o", str(out_file)], standalone_mode=False)
    except SystemExit:
        pass
    watched_batches = max(0, state["batches"] - 2)
    res = {
        "shape": args.shape,
        "examples": args.n,
        "batches_watched": watched_batches,
        "device": torch.cuda.get_device_name(),
        "syncs": [
            {"count": n, "per_batch": round(n / max(1, watched_batches), 2), "stack": list(k)}
            for k, n in sorted(stacks.items(), key=lambda kv: -kv[1])
        ],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

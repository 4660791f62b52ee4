"""The fast scoring path against a float32 reference on real data, on the same GPU.

    python bench/score/accuracy_real.py --model SmolLM2.gguf --data gsm8k_train.jsonl --out acc.json

A short warmup (bridge warmup: a few SFT steps + the direction v) on the first examples makes a
realistic scoring checkpoint and v; then the same held-out examples are scored twice:

- fast: the checkpoint in bfloat16, fused attention JVP (what ``bridge score --dtype bfloat16`` runs
  on a GPU);
- reference: the checkpoint in float32 with explicit math attention.

Reported per example: Spearman of a_j, max |A_fast - A_ref|, max |c_fast - c_ref|.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from bridgecli.data.examples import DataOptions, iter_examples  # noqa: E402
from bridgecli.artifacts.direction_file import load_direction  # noqa: E402
from bridgecli.modeling.loading import load_model, load_tokenizer  # noqa: E402
from bridgecli.modeling.scoring import BridgeScorer, ScoringContext  # noqa: E402
from bridgecli.steps.warmup import WarmupOptions, run_warmup  # noqa: E402
from bridgecli.training.config import SFTConfig  # noqa: E402


def spearman(x, y) -> float:
    return float(np.corrcoef(np.argsort(np.argsort(x)), np.argsort(np.argsort(y)))[0, 1])


def head(src: Path, dst: Path, start: int, stop: int) -> Path:
    dst.write_text("".join(src.read_text().splitlines(keepends=True)[start:stop]))
    return dst


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", default="/tmp/bridge-acc")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--out", default="accuracy.json")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = Path(args.data)
    warm = head(data, work / "warm.jsonl", 0, 24)
    val = head(data, work / "val.jsonl", 24, 32)
    test = head(data, work / "test.jsonl", 32, 32 + args.n)
    t0 = time.time()
    run_warmup(
        WarmupOptions(
            data=str(warm),
            val=str(val),
            out=work / "warmup",
            model=args.model,
            device="cuda",
            sft=SFTConfig(epochs=1, lr=2e-5, batch_size=8, grad_accum=1, bf16=True),
            overwrite=True,  # --work is reused from run to run: each run makes its warm-up afresh
        )
    )
    t_warm = time.time() - t0
    ckpt = str(work / "warmup" / "checkpoint")
    tok = load_tokenizer(ckpt)
    v = load_direction(work / "warmup").v
    exs = list(iter_examples(test, tok, DataOptions()))

    def score(dtype, tf32: bool, fused: bool, round_bf16: bool = False):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        os.environ["BRIDGE_FUSED_ATTENTION"] = "auto" if fused else "0"
        model = load_model(ckpt, dtype=dtype, device="cuda")
        if round_bf16:
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(torch.bfloat16).to(dtype))
        out = BridgeScorer(ScoringContext(model=model, tokenizer=tok, direction=v, device="cuda")).score(exs)
        del model
        torch.cuda.empty_cache()
        return out

    def compare(fast, ref):
        rows = []
        for e, f, r in zip(exs, fast, ref):
            rows.append(
                {
                    "id": e.id,
                    "n": len(f.a.numpy()),
                    "spearman_a": spearman(f.a.numpy(), r.a.numpy()),
                    "A_maxabs": float(np.abs(f.A.numpy().astype(np.float32) - r.A.numpy().astype(np.float32)).max()),
                    "c_maxabs": float(np.abs(f.c.numpy() - r.c.numpy()).max()),
                    "a_rel_err": float(np.linalg.norm(f.a.numpy() - r.a.numpy()) / np.linalg.norm(r.a.numpy())),
                }
            )
        sp = [r["spearman_a"] for r in rows]
        return {
            "spearman_min": min(sp),
            "spearman_mean": float(np.mean(sp)),
            "A_maxabs": max(r["A_maxabs"] for r in rows),
            "c_maxabs": max(r["c_maxabs"] for r in rows),
            "a_rel_err_mean": float(np.mean([r["a_rel_err"] for r in rows])),
            "examples": rows,
        }

    ref = score(torch.float32, tf32=False, fused=False)
    ref_bf16w = score(torch.float32, tf32=False, fused=False, round_bf16=True)
    policies = {
        "bf16 (default on GPU) vs float32": compare(score(torch.bfloat16, False, True), ref),
        "bf16 vs float32 of the bf16-rounded weights": compare(score(torch.bfloat16, False, True), ref_bf16w),
        "float32 + TF32 (--dtype float32 --tf32) vs float32": compare(score(torch.float32, True, True), ref),
    }
    summary = {
        "device": torch.cuda.get_device_name(),
        "examples": len(exs),
        "warmup_s": t_warm,
        "policies": {k: {m: x for m, x in v.items() if m != "examples"} for k, v in policies.items()},
    }
    for name, res in summary["policies"].items():
        print(f"{name:50s} " + " ".join(f"{k}={x:.5f}" for k, x in res.items()), flush=True)
    Path(args.out).write_text(json.dumps({"summary": summary, "policies": policies}, indent=2))


if __name__ == "__main__":
    main()

"""Where does the bf16 scoring error come from? Score the same real examples under several
precision policies and compare each with a float32 reference (no TF32, math attention).

    python bench/score/precision_study.py --ckpt WARMUP_DIR --data gsm8k.jsonl --n 32
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bridgecli.data.examples import DataOptions, iter_examples  # noqa: E402
from bridgecli.artifacts.direction_file import load_direction  # noqa: E402
from bridgecli.modeling.loading import load_model, load_tokenizer  # noqa: E402
from bridgecli.modeling.scoring import BridgeScorer, ScoringContext  # noqa: E402
from provenance import header, result_parser, settings, write_json  # noqa: E402


def spearman(x, y) -> float:
    return float(np.corrcoef(np.argsort(np.argsort(x)), np.argsort(np.argsort(y)))[0, 1])


POLICIES = {
    # name: (model dtype, tf32, fused attention, options, round weights to bf16)
    # the first entry is the reference; the checkpoint's weights are first rounded to bf16 when
    # --bf16-weights is given (what a bf16 checkpoint is), so that only arithmetic differs
    "fp32-reference": (torch.float32, False, "0", {}, False),
    "fp32-weights-rounded-bf16": (torch.float32, False, "0", {}, True),
    "fp32-tf32 math-attn": (torch.float32, True, "0", {}, False),
    "fp32-tf32 fused (tf32 policy)": (torch.float32, True, "auto", {}, False),
    "bf16-all (fast)": (torch.bfloat16, False, "auto", {}, False),
    "bf16-all math-attn": (torch.bfloat16, False, "0", {}, False),
    "autocast-prefix + fp32-tail": (torch.float32, False, "0", {"prefix_autocast": torch.bfloat16}, False),
    "autocast-prefix + tf32-tail": (torch.float32, True, "0", {"prefix_autocast": torch.bfloat16}, False),
    "fp32-prefix + bf16-tail": (torch.float32, False, "auto", {"tail_dtype": torch.bfloat16}, False),
}


def main(argv=None):
    ap = result_parser(__doc__, out="precision.json")
    ap.add_argument("--run", required=True, help="warmup run folder")
    ap.add_argument("--data", required=True)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument(
        "--bf16-weights",
        action="store_true",
        help="round the checkpoint to bf16 first (the reference then computes those weights in fp32)",
    )
    args = ap.parse_args(argv)
    ckpt = str(Path(args.run) / "checkpoint")
    tok = load_tokenizer(ckpt)
    v = load_direction(args.run).v
    exs = list(iter_examples(args.data, tok, DataOptions(limit=args.n)))
    results, ref = {}, None
    result = {**header("cuda"), **settings(args, "run", "data", "bf16_weights"), "n": len(exs), "policies": results}
    for name, (dtype, tf32, fused, options, round_bf16) in POLICIES.items():
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        os.environ["BRIDGE_FUSED_ATTENTION"] = fused
        model = load_model(ckpt, dtype=dtype, device="cuda")
        if round_bf16 or args.bf16_weights:
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(torch.bfloat16).float())
        scores = BridgeScorer(
            ScoringContext(model=model, tokenizer=tok, direction=v, device="cuda", options=options)
        ).score(exs)
        del model
        torch.cuda.empty_cache()
        if ref is None:
            ref = scores
            continue
        sp = [spearman(s.a.numpy(), r.a.numpy()) for s, r in zip(scores, ref)]
        results[name] = {
            "spearman_min": min(sp),
            "spearman_mean": float(np.mean(sp)),
            "a_rel_err": float(
                np.mean(
                    [
                        np.linalg.norm(s.a.numpy() - r.a.numpy()) / np.linalg.norm(r.a.numpy())
                        for s, r in zip(scores, ref)
                    ]
                )
            ),
            "A_maxabs": max(
                float(np.abs(s.A.numpy().astype(np.float32) - r.A.numpy().astype(np.float32)).max())
                for s, r in zip(scores, ref)
            ),
            "c_maxabs": max(float(np.abs(s.c.numpy() - r.c.numpy()).max()) for s, r in zip(scores, ref)),
        }
        print(f"{name:32s} " + " ".join(f"{k}={v:.5f}" for k, v in results[name].items()), flush=True)
        write_json(args.out, result)  # each policy as it is measured


if __name__ == "__main__":
    main()

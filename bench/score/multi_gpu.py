"""Scaling of `bridge score` across GPUs: one process vs `torchrun --nproc-per-node N`.

    python bench/score/multi_gpu.py --tokenizer TOKENIZER_DIR --data gsm8k_train.jsonl --gpus 2

Builds a random-weight Llama-3.2-1B-shaped checkpoint with the given tokenizer and a warmup run
folder (random unit direction v over the final 4 blocks), then scores the data with 1 GPU and with
N GPUs and reports wall times (including model loading) and the scoring loop's tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: model_shapes

from model_shapes import sizes  # noqa: E402


def build(tok_dir: str, work: Path) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from bridgecli.artifacts.direction_file import Direction, DirectionMeta, save_direction
    from bridgecli.modeling.params import tail_parameters

    tok = AutoTokenizer.from_pretrained(tok_dir)
    cfg = LlamaConfig(  # Llama-3.2-1B's sizes, the tokenizer's vocabulary, LlamaConfig's position settings
        **sizes("llama-3.2-1b"),
        vocab_size=len(tok),
        max_position_embeddings=8192,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    run = work / "run"
    (run / "checkpoint").mkdir(parents=True, exist_ok=True)
    model.save_pretrained(run / "checkpoint")
    tok.save_pretrained(run / "checkpoint")
    tail = tail_parameters(model, 4)
    v = {n: torch.randn(p.shape) for n, p in tail.items()}
    norm = float(torch.sqrt(sum((t**2).sum() for t in v.values())))
    save_direction(Direction({n: t / norm for n, t in v.items()}, DirectionMeta(layers=4, lam=0.2)), run)
    (run / "warmup.json").write_text(json.dumps({"base_model": str(run / "checkpoint")}))
    return run


def timed(cmd: list[str], env) -> tuple[float, str]:
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(proc.stderr[-4000:])
    return time.time() - t0, proc.stderr


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    ap.add_argument("--work", default="/tmp/bridge-mgpu")
    ap.add_argument("--out", default="multi_gpu.json")
    args = ap.parse_args(argv)
    work = Path(args.work)
    run = build(args.tokenizer, work)
    env = {**os.environ, "BRIDGE_NO_PROGRESS": "1"}
    base = ["score", args.data, "--from", str(run), "--max-tokens", "32768"]
    one, log1 = timed([sys.executable, "-m", "bridgecli", *base, "-o", str(work / "one.bridge")], env)
    many, logn = timed(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(args.gpus),
            "-m",
            "bridgecli",
            *base,
            "-o",
            str(work / "many.bridge"),
        ],
        env,
    )
    rate = lambda log: [float(x.replace(",", "")) for x in re.findall(r"\(([\d,]+) tokens/s", log)]  # noqa: E731
    steady = lambda log: [float(x.replace(",", "")) for x in re.findall(r"([\d,]+) tokens/s after the first", log)]  # noqa: E731
    first = lambda log: [float(x) for x in re.findall(r"first window, which took ([\d.]+) s", log)]  # noqa: E731
    res = {
        "device": torch.cuda.get_device_name(),
        "gpus": args.gpus,
        "wall_1gpu_s": one,
        "wall_ngpu_s": many,
        "wall_speedup": one / many,
        "tokens_per_s_1gpu": rate(log1),
        "tokens_per_s_per_rank": rate(logn),
        "steady_tokens_per_s_1gpu": steady(log1),
        "steady_tokens_per_s_per_rank": steady(logn),
        "first_window_s_1gpu": first(log1),
        "first_window_s_per_rank": first(logn),
    }
    res["loop_speedup"] = sum(res["tokens_per_s_per_rank"]) / res["tokens_per_s_1gpu"][0]
    if res["steady_tokens_per_s_1gpu"] and len(res["steady_tokens_per_s_per_rank"]) == args.gpus:
        res["steady_loop_speedup"] = sum(res["steady_tokens_per_s_per_rank"]) / res["steady_tokens_per_s_1gpu"][0]
    from bridgecli.format.reader import read_all

    h1, e1 = read_all(work / "one.bridge")
    h2, e2 = read_all(work / "many.bridge")
    res["same_examples_in_order"] = [e.id for e in e1] == [e.id for e in e2]
    res["examples"] = len(e1)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()

"""Scoring speed against a plain forward, side by side on one GPU, same model, tokens and batches.

    python bench/score/bench_score.py --out bench/score/results.json

For every case (a model shape with random bf16 weights, synthetic examples of given prompt and
response lengths) it times, over the same length-bucketed batches:

- ``forward``: ``model(input_ids, attention_mask).logits`` under no_grad (what inference costs);
- ``forward_no_head``: the decoder alone (no LM head), for reference;
- ``score``: ``BridgeScorer.score`` end to end (prefix blocks, tail JVP along v with fused
  attention, routing rows, packing the records);
- ``exact``: the per-token-backward scorer on a small subset, against ``score`` on the same subset.

It also reports tokens/s, peak GPU memory, bytes per scored token of the written stream, and the
fast path's agreement with a float32 math-attention reference on a few examples.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: model_shapes

import model_shapes  # noqa: E402

from bridgecli.format.records import Example, Header, ModelInfo, Tokens  # noqa: E402
from bridgecli.format.writer import StreamWriter  # noqa: E402
from bridgecli.modeling.params import tail_parameters  # noqa: E402
from bridgecli.modeling.scoring import BridgeScorer, ExactScorer, ScoringContext  # noqa: E402

#: the models timed here, random bf16 weights of their architecture (bench/model_shapes.py)
SHAPES = {name: model_shapes.SHAPES[name] for name in ("smollm2-135m", "llama-3.2-1b", "llama-3.2-3b")}
CASES = {
    "smollm2-135m/metamath": ("smollm2-135m", 80, 250),
    "llama-3.2-1b/metamath": ("llama-3.2-1b", 80, 250),
    "llama-3.2-3b/metamath": ("llama-3.2-3b", 80, 250),
    "llama-3.2-3b/long": ("llama-3.2-3b", 512, 1536),
    # GSM8K-sized (215 tokens with the default chat template on average: e2e.py's data), for the
    # loop-rate comparison of docs/benchmarks.md; not in the default --cases
    "llama-3.2-1b/gsm8k": ("llama-3.2-1b", 60, 145),
    "llama-3.2-3b/gsm8k": ("llama-3.2-3b", 60, 145),
}
DEFAULT_CASES = ("smollm2-135m/metamath", "llama-3.2-1b/metamath", "llama-3.2-3b/metamath", "llama-3.2-3b/long")


def make_model(shape: str, dtype=torch.bfloat16, device="cuda"):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(max_position_embeddings=8192, rms_norm_eps=1e-5, **SHAPES[shape])
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    return model.eval()


def make_examples(n: int, prompt: int, response: int, vocab: int, seed: int = 0) -> list[Example]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = int(round(prompt * rng.uniform(0.75, 1.25)))
        r = int(round(response * rng.uniform(0.75, 1.25)))
        kinds = [0] * 6 + [1] * p + [0] * 3 + [2] * r + [3]
        ids = rng.integers(10, vocab, size=len(kinds)).tolist()
        out.append(
            Example(
                id=str(i),
                index=i,
                text="",
                tokens=Tokens(input_ids=ids, kinds=bytes(kinds), offsets=[0, 0] * len(kinds)),
            )
        )
    return out


def buckets(examples: list[Example], max_tokens: int) -> list[list[Example]]:
    """Length-sorted batches whose padded size (rows x longest) stays within ``max_tokens``."""
    order = sorted(examples, key=lambda e: len(e.tokens.input_ids))
    batches, cur = [], []
    for ex in order:
        longest = max([len(e.tokens.input_ids) for e in cur] + [len(ex.tokens.input_ids)])
        if cur and longest * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur = []
        cur.append(ex)
    if cur:
        batches.append(cur)
    return batches


def direction(model, k=4, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    tail = tail_parameters(model, k)
    v = {n: torch.randn(p.shape, generator=g) for n, p in tail.items()}
    norm = math.sqrt(sum(float((t.double() ** 2).sum()) for t in v.values()))
    return {n: (t / norm).to(p.device) for (n, t), p in zip(v.items(), tail.values())}


def padded(batch, device="cuda"):
    L = max(len(e.tokens.input_ids) for e in batch)
    ids = torch.zeros(len(batch), L, dtype=torch.long)
    mask = torch.zeros(len(batch), L, dtype=torch.long)
    for i, e in enumerate(batch):
        ids[i, : len(e.tokens.input_ids)] = torch.tensor(e.tokens.input_ids)
        mask[i, : len(e.tokens.input_ids)] = 1
    return ids.to(device), mask.to(device)


def timed(fn, repeats: int) -> list[float]:
    fn()  # warm-up (kernels, autotune, allocator)
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def spearman(x, y) -> float:
    rx = np.argsort(np.argsort(x))
    ry = np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def profile(scorer, batches, top: int = 25) -> None:
    from torch.profiler import ProfilerActivity, profile as prof

    scorer.score(batches[0])
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for b in batches:
            scorer.score(b)
        torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=top, max_name_column_width=60), flush=True)


def breakdown(scorer, batches) -> dict:
    """Seconds spent in the prefix blocks, the dual tail (incl. head), and packing, over all batches."""
    import torch.autograd.forward_ad as fwAD

    from bridgecli.modeling.score_batch import make_batch

    t = {"prefix_s": 0.0, "tail_s": 0.0, "pack_s": 0.0}
    for b in batches:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        batch = make_batch(b, 0, "cuda")
        hidden, calls, rows = scorer._prefix(batch)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        with torch.no_grad():
            if scorer.fast is not None:
                losses, a, tail_rows = scorer._fast_tail(batch, hidden, calls)
            else:
                with fwAD.dual_level():
                    dual = {
                        i: {k: fwAD.make_dual(p, scorer.tangents[i][k]) for k, p in ps.items()}
                        for i, ps in scorer.primals.items()
                    }
                    out, tail_rows = scorer._tail(batch, dual, hidden, calls)
                    losses, a = fwAD.unpack_dual(out)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        scorer._pack(batch, losses, a, tail_rows if rows is None else rows + tail_rows)
        t3 = time.perf_counter()
        t["prefix_s"] += t1 - t0
        t["tail_s"] += t2 - t1
        t["pack_s"] += t3 - t2
    return t


def run_case(
    name: str,
    n: int,
    max_tokens: int,
    repeats: int,
    exact_n: int,
    want_profile: bool = False,
    timing_only: bool = False,
) -> dict:
    shape, p_len, r_len = CASES[name]
    model = make_model(shape)
    exs = make_examples(n, p_len, r_len, model.config.vocab_size)
    batches = buckets(exs, max_tokens)
    tensors = [padded(b) for b in batches]
    tokens = sum(len(e.tokens.input_ids) for e in exs)
    resp_tokens = sum(len(e.tokens.response_positions()) for e in exs)
    v = direction(model)
    ctx = ScoringContext(model=model, tokenizer=SimpleNamespace(pad_token_id=0), direction=v, device="cuda")
    scorer = BridgeScorer(ctx)

    @torch.no_grad()
    def forward():
        for ids, mask in tensors:
            model(input_ids=ids, attention_mask=mask, use_cache=False).logits

    @torch.no_grad()
    def forward_no_head():
        for ids, mask in tensors:
            model.model(input_ids=ids, attention_mask=mask, use_cache=False)

    results = {}

    def score():
        results["scores"] = [s for b in batches for s in scorer.score(b)]

    torch.cuda.reset_peak_memory_stats()
    t_fwd = timed(forward, repeats)
    mem_fwd = torch.cuda.max_memory_allocated()
    t_fnh = timed(forward_no_head, repeats)
    torch.cuda.reset_peak_memory_stats()
    t_score = timed(score, repeats)
    mem_score = torch.cuda.max_memory_allocated()
    parts = breakdown(scorer, batches)
    if want_profile:
        profile(scorer, batches)
    if timing_only:
        return {
            "case": name,
            "tokens": tokens,
            "forward_s": statistics.median(t_fwd),
            "forward_no_head_s": statistics.median(t_fnh),
            "score_s": statistics.median(t_score),
            "ratio_score_over_forward": statistics.median(t_score) / statistics.median(t_fwd),
            "peak_mem_score_gb": mem_score / 2**30,
            **parts,
        }

    # exact per-token backward on a small subset, against the JVP path on the same subset
    sub = sorted(exs, key=lambda e: len(e.tokens.input_ids))[:exact_n]
    exact = ExactScorer(ctx)
    t_exact = timed(lambda: results.__setitem__("exact", exact.score(sub)), 1)
    t_sub = timed(lambda: results.__setitem__("sub", scorer.score(sub)), 3)
    sp_exact = [spearman(a.a.numpy(), b.a.numpy()) for a, b in zip(results["sub"], results["exact"])]

    # bytes per scored token of the stream
    buf = io.BytesIO()
    w = StreamWriter(buf, Header(stage="scores", producer="bench", created="", model=ModelInfo("bench", "", "")))
    for e, s in zip([e for b in batches for e in b], results["scores"]):
        w.write(Example(id=e.id, index=e.index, text=e.text, tokens=e.tokens, scores=s))
    w.close()

    # the tf32 policy: the same (bf16-valued) weights held in float32, TF32 matmuls
    check = sub[: min(4, len(sub))]
    fast = scorer.score(check)
    model32 = make_model(shape, dtype=torch.bfloat16).float()  # same weights as `model`, upcast
    v32 = {k: t.float() for k, t in v.items()}
    torch.backends.cuda.matmul.allow_tf32 = True
    scorer32 = BridgeScorer(
        ScoringContext(model=model32, tokenizer=SimpleNamespace(pad_token_id=0), direction=v32, device="cuda")
    )
    t_tf32 = timed(lambda: [scorer32.score(b) for b in batches], repeats)
    tf32 = scorer32.score(check)
    scorer32 = None  # frees its GPU memory (the lambda above holds the name, not the object)
    # reference: the same weights in float32, no TF32, math attention
    torch.backends.cuda.matmul.allow_tf32 = False
    os.environ["BRIDGE_FUSED_ATTENTION"] = "0"
    try:
        ref = BridgeScorer(
            ScoringContext(model=model32, tokenizer=SimpleNamespace(pad_token_id=0), direction=v32, device="cuda")
        ).score(check)
    finally:
        os.environ.pop("BRIDGE_FUSED_ATTENTION")
    del model32
    sp_ref = [spearman(f.a.numpy(), r.a.numpy()) for f, r in zip(fast, ref)]
    sp_tf32 = [spearman(f.a.numpy(), r.a.numpy()) for f, r in zip(tf32, ref)]
    a_diff = max(
        float(np.abs(f.A.numpy().astype(np.float32) - r.A.numpy().astype(np.float32)).max()) for f, r in zip(fast, ref)
    )

    med = statistics.median
    out = {
        "case": name,
        "shape": shape,
        "prompt": p_len,
        "response": r_len,
        "examples": n,
        "batches": len(batches),
        "tokens": tokens,
        "response_tokens": resp_tokens,
        "max_tokens_per_batch": max_tokens,
        "forward_s": med(t_fwd),
        "forward_no_head_s": med(t_fnh),
        "score_s": med(t_score),
        "ratio_score_over_forward": med(t_score) / med(t_fwd),
        "ratio_score_over_forward_no_head": med(t_score) / med(t_fnh),
        "score_tokens_per_s": tokens / med(t_score),
        "forward_tokens_per_s": tokens / med(t_fwd),
        "peak_mem_forward_gb": mem_fwd / 2**30,
        "peak_mem_score_gb": mem_score / 2**30,
        "exact_examples": len(sub),
        "exact_s": t_exact[0],
        "jvp_same_subset_s": med(t_sub),
        "speedup_jvp_over_exact": t_exact[0] / med(t_sub),
        "spearman_jvp_vs_exact_min": min(sp_exact),
        "bytes_per_scored_token": len(buf.getvalue()) / resp_tokens,
        "spearman_bf16_fused_vs_fp32_math_min": min(sp_ref),
        "A_maxabs_bf16_vs_fp32": a_diff,
        "tf32_score_s": med(t_tf32),
        "ratio_tf32_score_over_bf16_forward": med(t_tf32) / med(t_fwd),
        "spearman_tf32_vs_fp32_min": min(sp_tf32),
        "repeats": repeats,
        **parts,
    }
    model = scorer = exact = None  # frees the GPU memory (the closures above hold the names)
    torch.cuda.empty_cache()
    return out


def table(rows: list[dict]) -> str:
    head = (
        "| case | tokens | forward s | score s | score/forward | score/decoder | score tok/s | peak GB | "
        "exact/JVP speed-up | Spearman bf16 vs fp32 | tf32 score/forward | Spearman tf32 vs fp32 | B/token |"
    )
    lines = [head, "|" + "|".join(["---"] * 13) + "|"]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['tokens']} | {r['forward_s']:.3f} | {r['score_s']:.3f} | "
            f"**{r['ratio_score_over_forward']:.2f}** | {r['ratio_score_over_forward_no_head']:.2f} | "
            f"{r['score_tokens_per_s']:.0f} | {r['peak_mem_score_gb']:.1f} | "
            f"{r['speedup_jvp_over_exact']:.0f}x | {r['spearman_bf16_fused_vs_fp32_math_min']:.5f} | "
            f"{r['ratio_tf32_score_over_bf16_forward']:.2f} | {r['spearman_tf32_vs_fp32_min']:.5f} | "
            f"{r['bytes_per_scored_token']:.1f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES))
    ap.add_argument("--examples", type=int, default=256, help="examples per case (long case: a quarter)")
    ap.add_argument("--max-tokens", type=int, default=32768, help="padded tokens per batch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--exact", type=int, default=2, help="examples for the per-token-backward comparison")
    ap.add_argument("--out", default="bench/score/results.json")
    ap.add_argument("--profile", action="store_true", help="print the top CUDA kernels of one scoring pass per case")
    ap.add_argument("--timing-only", action="store_true", help="skip the exact-scorer, tf32 and precision runs")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_score needs a CUDA GPU")
    rows = []
    for name in args.cases.split(","):
        n = args.examples // 4 if name.endswith("/long") else args.examples
        r = run_case(name, n, args.max_tokens, args.repeats, args.exact, args.profile, args.timing_only)
        r["device"] = torch.cuda.get_device_name()
        r["torch"] = torch.__version__
        rows.append(r)
        print(json.dumps(r), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))
    if not args.timing_only:
        print(table(rows))


if __name__ == "__main__":
    main()

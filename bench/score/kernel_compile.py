"""What a first run's first window pays to compile: each Triton kernel of the scorer's fast path,
first call (compile, autotune) against second call, on GSM8K-like batch shapes of a Llama shape.

    TRITON_CACHE_DIR=$(mktemp -d) python bench/score/kernel_compile.py --shapes llama-3.2-3b \
        --out bench/score/results/kernel_compile_h100.json [--sweep]

Run it with an empty TRITON_CACHE_DIR (a new machine) or a warm one (later runs). For every shape and
sequence length it builds random bf16 tensors of a batch of about ``--tokens`` padded tokens and
times, in the order the scorer calls them, the RMSNorm / RoPE / SwiGLU tangent kernels, the primal
attention with its LSE, the attention tangent kernel (autotuned unless pinned:
``BRIDGE_ATTN_AUTOTUNE``), the routing rows and the LM-head cross-entropy kernel. ``--sweep`` then
times every candidate block configuration of the attention tangent kernel on each (context bucket,
head dim, kv groups) key with ``triton.testing.do_bench``: the data behind jvp_attention's pinned
configurations.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "src"))


def _sync():
    import torch

    torch.cuda.synchronize()


def timed(fn) -> float:
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return round((time.perf_counter() - t0) * 1e3, 2)


#: a case's short names for the sizes of the shape's config
SIZES = {
    "hid": "hidden_size",
    "inter": "intermediate_size",
    "H": "num_attention_heads",
    "Hk": "num_key_value_heads",
    "D": "head_dim",
    "vocab": "vocab_size",
}


def shape_case(shape: str, L: int, tokens: int) -> dict:
    import torch

    from bench_score import SHAPES

    sizes = {short: SHAPES[shape][name] for short, name in SIZES.items()}
    B = max(1, tokens // L)
    D = sizes["D"]
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(L)

    def r(*s):
        return torch.randn(*s, device=dev, dtype=dt, generator=g)

    pos = torch.arange(L, device=dev, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
    ang = torch.cat([pos[:, None] * inv[None], pos[:, None] * inv[None]], -1)
    cos, sin = (t.to(dt)[None, None].expand(B, 1, L, D) for t in (ang.cos(), ang.sin()))
    return {**sizes, "B": B, "L": L, "r": r, "cos": cos, "sin": sin}


def kernels(c: dict) -> dict:
    """name -> a thunk calling that kernel once on case ``c``."""
    import torch

    from bridgecli.modeling import ce_kernel, dual_kernels, jvp_attention

    r, B, L, H, Hk, D = c["r"], c["B"], c["L"], c["H"], c["Hk"], c["D"]
    x, dx, w, dw = r(B, L, c["hid"]), r(B, L, c["hid"]), r(c["hid"]), r(c["hid"])
    q, dq = r(B, L, H, D).transpose(1, 2), r(B, L, H, D).transpose(1, 2)
    k, dk = r(B, L, Hk, D).transpose(1, 2), r(B, L, Hk, D).transpose(1, 2)
    v, dv = r(B, Hk, L, D), r(B, Hk, L, D)
    gu, dgu = r(B, L, 2 * c["inter"]), r(B, L, 2 * c["inter"])
    rows = min(B * L // 2, 1024)
    z = r(rows, c["vocab"])
    tgt = torch.randint(0, c["vocab"], (rows,), device="cuda")
    qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
    o, lse = jvp_attention.attention_with_lse(qc, kc, vc, D**-0.5)
    return {
        "rmsnorm_dual": lambda: dual_kernels.rmsnorm_dual(x, dx, w, dw, 1e-5),
        "rmsnorm_dual_no_dw": lambda: dual_kernels.rmsnorm_dual(x, dx, w, None, 1e-5),
        "rope_dual": lambda: dual_kernels.rope_dual(q, dq, k, dk, c["cos"], c["sin"]),
        "swiglu_dual": lambda: dual_kernels.swiglu_dual(gu, dgu),
        "attention_with_lse": lambda: jvp_attention.attention_with_lse(qc, kc, vc, D**-0.5),
        "attention_tangent": lambda: jvp_attention.attention_tangent(qc, kc, vc, dq, dk, dv, o, lse, D**-0.5),
        "routing_rows": lambda: jvp_attention.routing_rows(qc, kc, lse, D**-0.5, L // 3),
        "ce_loss_and_q": lambda: ce_kernel.ce_loss_and_q(z, tgt),
    }


def compile_costs(shapes: list[str], lengths: list[int], tokens: int) -> list[dict]:
    rows = []
    for shape in shapes:
        for L in lengths:
            c = shape_case(shape, L, tokens)
            for name, fn in kernels(c).items():
                first = timed(fn)
                second = timed(fn)
                rows.append(
                    {"shape": shape, "L": L, "B": c["B"], "kernel": name, "first_ms": first, "second_ms": second}
                )
                print(
                    f"{shape} L={L:5d} B={c['B']:4d} {name:20s} first {first:9.1f} ms  second {second:8.2f} ms",
                    file=sys.stderr,
                )
            del c
    return rows


def sweep(shapes: list[str], buckets: list[int], tokens: int) -> list[dict]:
    """Every candidate configuration of the attention tangent kernel on each key, ms (do_bench)."""
    import triton
    import triton.testing

    from bridgecli.modeling import jvp_attention

    out = []
    seen = set()
    for shape in shapes:
        for bucket in buckets:
            L = bucket * 3 // 4 + 1  # a length inside the bucket (not a power of two)
            c = shape_case(shape, L, tokens)
            key = (triton.next_power_of_2(L), c["D"], c["H"] // c["Hk"])
            if key in seen:
                continue
            seen.add(key)
            res = {
                "shape": shape,
                "bucket": key[0],
                "head_dim": key[1],
                "groups": key[2],
                "L": L,
                "B": c["B"],
                "configs": {},
            }
            for cfg in jvp_attention.candidate_configs(c["D"]):
                bm, bn, w, st = cfg

                def call(bm=bm, bn=bn, w=w, st=st):
                    jvp_attention.attention_tangent(*_attn_args(c), block_m=bm, block_n=bn, num_warps=w, num_stages=st)

                try:
                    ms = triton.testing.do_bench(call, warmup=5, rep=30)
                except Exception as exc:  # an out-of-resources config
                    ms = None
                    print(f"config {cfg} failed: {exc}", file=sys.stderr)
                res["configs"][f"{bm},{bn},{w},{st}"] = None if ms is None else round(float(ms), 4)
            timed_cfgs = {k: v for k, v in res["configs"].items() if v is not None}
            res["best"] = min(timed_cfgs, key=timed_cfgs.__getitem__) if timed_cfgs else None
            print(json.dumps(res), file=sys.stderr)
            out.append(res)
    return out


_ARGS: dict = {}


def _attn_args(c: dict):
    key = (c["B"], c["L"], c["H"], c["Hk"], c["D"])
    if key not in _ARGS:
        _ARGS.clear()
        from bridgecli.modeling import jvp_attention

        r = c["r"]
        q, dq = r(c["B"], c["H"], c["L"], c["D"]), r(c["B"], c["H"], c["L"], c["D"])
        k, dk = r(c["B"], c["Hk"], c["L"], c["D"]), r(c["B"], c["Hk"], c["L"], c["D"])
        v, dv = r(c["B"], c["Hk"], c["L"], c["D"]), r(c["B"], c["Hk"], c["L"], c["D"])
        o, lse = jvp_attention.attention_with_lse(q, k, v, c["D"] ** -0.5)
        _ARGS[key] = (q, k, v, dq, dk, dv, o, lse, c["D"] ** -0.5)
    return _ARGS[key]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="llama-3.2-1b,llama-3.2-3b")
    ap.add_argument("--lengths", default="150,200,260,330", help="padded batch lengths (GSM8K-like windows)")
    ap.add_argument("--tokens", type=int, default=32768, help="padded tokens a batch")
    ap.add_argument("--sweep", action="store_true", help="time every attention-tangent configuration per key")
    ap.add_argument("--buckets", default="64,128,256,512,1024,2048,4096")
    ap.add_argument("--out", default="bench/score/results/kernel_compile.json")
    args = ap.parse_args(argv)
    import torch
    import triton

    shapes = args.shapes.split(",")
    t0 = time.perf_counter()
    import bridgecli.modeling.jvp_attention  # noqa: F401  (imports counted apart from the kernels)

    report: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "triton_cache": os.environ.get("TRITON_CACHE_DIR"),
        "autotune_env": os.environ.get("BRIDGE_ATTN_AUTOTUNE"),
        "import_s": round(time.perf_counter() - t0, 2),
    }
    t1 = time.perf_counter()
    report["compile"] = compile_costs(shapes, [int(x) for x in args.lengths.split(",")], args.tokens)
    report["compile_total_s"] = round(time.perf_counter() - t1, 2)
    by_kernel: dict = {}
    for row in report["compile"]:
        by_kernel[row["kernel"]] = round(by_kernel.get(row["kernel"], 0.0) + row["first_ms"] - row["second_ms"], 1)
    report["extra_first_call_ms_by_kernel"] = by_kernel
    if args.sweep:
        report["sweep"] = sweep(shapes, [int(x) for x in args.buckets.split(",")], args.tokens)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(
        json.dumps({k: report[k] for k in ("device", "import_s", "compile_total_s", "extra_first_call_ms_by_kernel")})
    )


if __name__ == "__main__":
    main()

"""The fused tail's elementwise pieces (RMSNorm, RoPE, SwiGLU with their tangents): the Triton
kernels of dual_kernels against eager and against torch.compile (dual_llama._Compiled), bf16.

    python bench/score/dual_kernels_bench.py --out bench/score/results/dual_kernels_h100.json
    python bench/score/dual_kernels_bench.py --device cpu --out /tmp/dk.json   # smoke test only

For each shape (Llama 3.2 1B / 3B: hidden 2048 / 3072, intermediate 8192, 32 / 24 heads of 64 /
128, 8 kv heads; ``--batch`` x ``--length`` tokens, 32K by default) and each function, called as
the scorer calls it (RMSNorm over [B, L, hidden] with a weight tangent and without; RoPE on
transposed head views of the fused q|k|v projection with cos/sin [1, 1, L, D]; SwiGLU on
[B, L, 2 I]):

1. ``warm``: milliseconds per call (CUDA events, median of ``--reps``, after warm-up calls) of the
   Triton kernel, eager and torch.compile, and the bandwidth each reaches (bytes every input read
   once and every output written once, divided by the time);
2. ``match``: each output against eager: max |diff|, share of elements that differ, largest
   difference in ulps of the dtype (bf16 ulps here);
3. ``first_call``: fresh processes (this script with ``--child``) that import what the path needs
   and call the four functions once each, timed one by one with a synchronize: the Triton kernels
   with an empty Triton cache folder (a new machine) and then warm (later runs), torch.compile with
   empty inductor and Triton cache folders and then warm. Each child reports ``import torch``, CUDA
   start, the module import (dual_kernels, which imports Triton; dual_llama), each first call and a
   second call, and whether torch._dynamo / torch._inductor got imported.

``--device cpu`` runs the Triton kernels in Triton's interpreter on tiny shapes and skips
torch.compile: a check that the script works, not a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "src"))

SHAPES = {
    "llama-3.2-1b": dict(hidden=2048, inter=8192, heads=32, kv_heads=8, head_dim=64),
    "llama-3.2-3b": dict(hidden=3072, inter=8192, heads=24, kv_heads=8, head_dim=128),
    "tiny": dict(hidden=48, inter=40, heads=3, kv_heads=1, head_dim=16),
}
FUNCS = ("rmsnorm_dw", "rmsnorm", "rope", "swiglu")
EPS = 1e-5


def _cpu_env() -> None:
    """Before Triton is imported: its interpreter, and the kernels allowed on CPU tensors."""
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["BRIDGE_DUAL_KERNELS"] = "force"


def make_inputs(shape: dict, batch: int, length: int, device: str, dtype_name: str = "bfloat16") -> dict:
    """Every function's arguments, laid out as dual_llama.DualBlock passes them."""
    import torch

    dtype = getattr(torch, dtype_name)
    g = torch.Generator(device=device).manual_seed(0)

    def randn(*s, scale=1.0):
        return (torch.randn(*s, generator=g, device=device) * scale).to(dtype)

    B, L = batch, length
    hid, inter, H, HK, D = (shape[k] for k in ("hidden", "inter", "heads", "kv_heads", "head_dim"))
    h, dh = randn(B, L, hid, scale=3.0), randn(B, L, hid)
    w, dw = 1 + 0.1 * randn(hid), randn(hid, scale=0.1)
    width = (H + 2 * HK) * D
    qkv, dqkv = randn(B, L, width), randn(B, L, width)

    def heads(t, start, n):
        return t[..., start : start + n * D].view(B, L, n, D).transpose(1, 2)

    ang = torch.arange(L, device=device, dtype=torch.float32)[:, None] * torch.rand(D, generator=g, device=device)
    cos, sin = torch.cos(ang)[None].to(dtype), torch.sin(ang)[None].to(dtype)  # [1, L, D], as HF's rotary
    gu, dgu = randn(B, L, 2 * inter, scale=3.0), randn(B, L, 2 * inter)
    return {
        "rmsnorm_dw": (h, dh, w, dw, EPS),
        "rmsnorm": (h, dh, w, None, EPS),
        "rope": (
            heads(qkv, 0, H),
            heads(dqkv, 0, H),
            heads(qkv, H * D, HK),
            heads(dqkv, H * D, HK),
            cos.unsqueeze(1),
            sin.unsqueeze(1),
        ),
        "swiglu": (gu, dgu),
    }


def moved_bytes(name: str, args) -> int:
    """Bytes of one pass: every input element read once, every output element written once."""
    esize = args[0].element_size()
    if name.startswith("rmsnorm"):
        return 4 * args[0].numel() * esize
    if name == "rope":
        q, _, k = args[:3]
        return 4 * (q.numel() + k.numel()) * esize
    return 3 * args[0].numel() * esize  # swiglu: gu, dgu in; m, dm (half width) out


def paths(device: str) -> dict:
    """name -> {"eager" | "compile" | "triton": fn}."""
    from bridgecli.modeling import dual_kernels as dk
    from bridgecli.modeling import dual_llama as dl

    out = {}
    for name, eager, kernel in [
        ("rmsnorm_dw", dl._rmsnorm_dual, dk.rmsnorm_dual),
        ("rmsnorm", dl._rmsnorm_dual, dk.rmsnorm_dual),
        ("rope", dl._rope_dual, dk.rope_dual),
        ("swiglu", dl._swiglu_dual, dk.swiglu_dual),
    ]:
        fns = {"eager": eager, "triton": kernel}
        if device == "cuda":
            fns["compile"] = dl._Compiled(eager, size_oblivious=name != "rope")
        out[name] = fns
    return out


def timed(fn, args, reps: int, device: str) -> float:
    """Median milliseconds per call."""
    import statistics

    import torch

    for _ in range(3):
        fn(*args)
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(*args)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def match(got, want) -> dict:
    """got against eager's outputs: max |diff|, share of differing elements, largest ulp gap."""
    import torch

    worst = {"max_abs": 0.0, "share_differing": 0.0, "max_ulps": 0.0}
    for g, w in zip(got, want, strict=True):
        a, b = g.double(), w.double()
        _, e = torch.frexp(torch.maximum(a.abs(), b.abs()))
        ulps = (a - b).abs() / torch.ldexp(torch.full_like(a, torch.finfo(w.dtype).eps), e - 1)
        worst["max_abs"] = max(worst["max_abs"], float((a - b).abs().max()))
        worst["share_differing"] = max(worst["share_differing"], float((g != w).float().mean()))
        worst["max_ulps"] = max(worst["max_ulps"], float(ulps.nan_to_num(0.0).max()))
    return worst


def warm_and_match(shape_name: str, args, device: str) -> dict:
    import torch

    inputs = make_inputs(SHAPES[shape_name], args.batch, args.length, device, args.dtype)
    res: dict = {"tokens": args.batch * args.length, "warm_ms": {}, "gb_per_s": {}, "match": {}}
    for name, fns in paths(device).items():
        call = inputs[name]
        want = fns["eager"](*call)
        res["warm_ms"][name], res["gb_per_s"][name], res["match"][name] = {}, {}, {}
        for path, fn in fns.items():
            with torch.no_grad():
                ms = timed(fn, call, args.reps, device)
                res["warm_ms"][name][path] = round(ms, 4)
                res["gb_per_s"][name][path] = round(moved_bytes(name, call) / ms / 1e6, 1)
                if path != "eager":
                    res["match"][name][path] = match(fn(*call), want)
            if path == "compile" and getattr(fn, "failed", False):
                res["match"][name][path]["compile_failed"] = True
        del want
    del inputs
    if device == "cuda":
        torch.cuda.empty_cache()
    return res


# --- first call, in a fresh process -----------------------------------------------------------


def child(args) -> None:
    """One fresh process: imports and first calls of one path, timed; one JSON line on stdout."""
    t0 = time.perf_counter()
    import torch

    out: dict = {"path": args.child, "import_torch_s": time.perf_counter() - t0}
    device = args.device
    t = time.perf_counter()
    inputs = make_inputs(SHAPES[args.shape], args.batch, args.length, device, args.dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    out["cuda_start_and_inputs_s"] = time.perf_counter() - t
    t = time.perf_counter()
    if args.child == "triton":
        from bridgecli.modeling import dual_kernels as dk

        fns = {
            "rmsnorm_dw": dk.rmsnorm_dual,
            "rmsnorm": dk.rmsnorm_dual,
            "rope": dk.rope_dual,
            "swiglu": dk.swiglu_dual,
        }
        applies = {
            "rmsnorm_dw": dk.rmsnorm_applies,
            "rmsnorm": dk.rmsnorm_applies,
            "rope": dk.rope_applies,
            "swiglu": dk.swiglu_applies,
        }
        out["import_module_s"] = time.perf_counter() - t
        out["applies"] = {n: bool(applies[n](*inputs[n])) for n in FUNCS}
    else:
        from bridgecli.modeling import dual_llama as dl

        fns = {
            "rmsnorm_dw": dl._Compiled(dl._rmsnorm_dual),
            "rope": dl._Compiled(dl._rope_dual, size_oblivious=False),
            "swiglu": dl._Compiled(dl._swiglu_dual),
        }
        fns["rmsnorm"] = fns["rmsnorm_dw"]  # one compiled function, as in dual_llama (dw None: another graph)
        out["import_module_s"] = time.perf_counter() - t
    out["first_call_s"], out["second_call_s"] = {}, {}
    with torch.no_grad():
        for name in FUNCS:
            t = time.perf_counter()
            fns[name](*inputs[name])
            sync()
            out["first_call_s"][name] = time.perf_counter() - t
        for name in FUNCS:
            t = time.perf_counter()
            fns[name](*inputs[name])
            sync()
            out["second_call_s"][name] = time.perf_counter() - t
    out["first_calls_total_s"] = sum(out["first_call_s"].values())
    out["import_module_and_first_calls_s"] = out["import_module_s"] + out["first_calls_total_s"]
    out["since_process_start_s"] = time.perf_counter() - t0
    out["imported_dynamo"] = "torch._dynamo" in sys.modules
    out["imported_inductor"] = "torch._inductor" in sys.modules
    if args.child == "compile":
        out["compile_failed"] = any(getattr(f, "failed", False) for f in fns.values())
    print(json.dumps(out))


def first_calls(path: str, shape: str, args, warm_runs: int) -> dict:
    """A cold process (empty cache folders) then ``warm_runs`` warm ones, for one path."""
    caches = Path(tempfile.mkdtemp(prefix=f"dk-{path}-"))
    env = dict(os.environ)
    env["TRITON_CACHE_DIR"] = str(caches / "triton")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(caches / "inductor")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        path,
        "--shape",
        shape,
        "--device",
        args.device,
        "--batch",
        str(args.batch),
        "--length",
        str(args.length),
        "--dtype",
        args.dtype,
    ]
    runs = []
    for i in range(1 + warm_runs):
        t = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            runs.append({"error": proc.stderr[-2000:]})
            break
        rec = json.loads(proc.stdout.strip().splitlines()[-1])
        rec["process_wall_s"] = wall
        rec["caches"] = "cold" if i == 0 else "warm"
        runs.append(rec)
    return {"cold": runs[0], "warm": runs[1:]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", help="JSON results (default: stdout)")
    ap.add_argument("--shapes", default=None, help="comma-separated (default: both Llama shapes; tiny on CPU)")
    ap.add_argument("--first-call-shapes", default=None, help="shapes of the fresh-process runs (default: the first)")
    ap.add_argument("--batch", type=int, default=None, help="examples per batch (default 64; 2 on CPU)")
    ap.add_argument("--length", type=int, default=None, help="tokens per example (default 512; 8 on CPU)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--reps", type=int, default=None, help="timed calls per measurement (default 100; 3 on CPU)")
    ap.add_argument("--warm-runs", type=int, default=2, help="warm fresh processes after the cold one")
    ap.add_argument("--no-first-call", action="store_true", help="skip the fresh-process measurements")
    ap.add_argument("--child", choices=["triton", "compile"], help=argparse.SUPPRESS)
    ap.add_argument("--shape", default="tiny", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cpu = args.device == "cpu"
    if cpu:
        _cpu_env()
    args.batch = args.batch or (2 if cpu else 64)
    args.length = args.length or (8 if cpu else 512)
    args.reps = args.reps or (3 if cpu else 100)
    if args.child:
        return child(args)

    import torch
    import triton

    shapes = (args.shapes or ("tiny" if cpu else "llama-3.2-1b,llama-3.2-3b")).split(",")
    first = (args.first_call_shapes or shapes[0]).split(",")
    res: dict = {
        "device": torch.cuda.get_device_name() if not cpu else "cpu (Triton interpreter: no timing is meaningful)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dtype": args.dtype,
        "batch": args.batch,
        "length": args.length,
        "reps": args.reps,
        "shapes": {},
        "first_call": {},
    }
    for s in shapes:
        print(f"[dual_kernels_bench] warm timings and match, {s}", file=sys.stderr)
        res["shapes"][s] = {**SHAPES[s], **warm_and_match(s, args, args.device)}
    if not args.no_first_call:
        for s in first:
            res["first_call"][s] = {}
            for path in ("triton",) if cpu else ("triton", "compile"):
                print(f"[dual_kernels_bench] first calls in fresh processes, {s}, {path}", file=sys.stderr)
                res["first_call"][s][path] = first_calls(path, s, args, args.warm_runs)
    text = json.dumps(res, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(text + "\n")
        tmp.replace(args.out)
    else:
        print(text)


if __name__ == "__main__":
    main()

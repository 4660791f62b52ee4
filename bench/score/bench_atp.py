"""Cost of the ``atp`` scorer (key-gate attribution, one reverse pass through the JVP) against the
default ``bridge`` scorer, side by side on one GPU, same model, examples and direction.

    python bench/score/bench_atp.py --out bench/score/results/atp_cost.json
    python bench/score/bench_atp.py --saved-bytes --cases llama-3.2-1b/metamath --layers 6   # CPU
    python bench/score/bench_atp.py --device cpu --dtype float32 --cases smollm2-135m/metamath \
        --layers 6 --examples 4 --repeats 5 --atp-compare --out /tmp/atp_cpu.json  # CPU timing, relative

Random bf16 weights of real shapes (weights do not change the cost). Each scorer scores every
example in length-bucketed batches under its own padded-token budget (``bridge`` at its default
32768; ``atp`` at ``--atp-max-tokens``, by default the scorer's own default for the free memory,
``AttributionScorer.max_tokens_cuda``; the scorer splits a batch that does not fit into passes);
the ratio is total atp time / total bridge time (median of repeats). ``--recompute`` sets when the
gated attention's L x L tensors are recomputed in the reverse pass (``auto``: only where passes
would be small otherwise).

On Llama-family models the atp scorer here runs its hand-written gated pass (gated_llama.py; in
``bridge score`` it takes ``--scorer-option fast=1``);
``--atp-generic`` runs its generic path through HF's modules instead (the ``fast_tail`` option off
for the atp scorer only; the bridge scorer keeps its fast tail), for a before / after on one machine.
``--atp-compare`` times (and profiles) both, interleaved: one run gives before and after.
``--device cpu --dtype float32 --layers N`` times a cut-down model on the CPU (relative numbers only).

``--saved-bytes`` runs on the CPU instead: the bytes the gated pass keeps for its reverse pass
(``torch.autograd.graph.saved_tensors_hooks``, each storage once, parameters left out) per padded
token, by component (gated blocks before the tail, tail blocks with their tangents, the L x L
tensors of each, the LM head, the rest), for a model of the case's shape cut to ``--layers`` blocks,
with and without recomputation, and the memory model's prediction for the same pass.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from bench_score import CASES, SHAPES, buckets, direction, make_examples, make_model  # noqa: E402

from bridgecli.modeling import dual_llama  # noqa: E402
from bridgecli.modeling.attribution import (  # noqa: E402
    AttributionScorer,
    _free_bytes,
    chunk_ids,
    pass_bytes,
    token_bytes,
)
from bridgecli.modeling.saved_bytes import saved_bytes  # noqa: E402
from bridgecli.modeling.score_batch import make_batch  # noqa: E402
from bridgecli.modeling.scoring import BridgeScorer, ScoringContext  # noqa: E402


def profile_tables(fn, path: Path, rows: int = 45) -> dict:
    """Run ``fn`` once under torch.profiler; write its op table (by CUDA time) to ``path``; return the
    GPU kernel time by kernel family (gemm, softmax, Triton, elementwise, reduce, copy, other) in ms."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    avg = prof.key_averages()
    path.write_text(avg.table(sort_by="cuda_time_total", row_limit=rows) + "\n")
    families = (
        ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "cublas")),
        ("softmax", ("softmax",)),
        ("triton", ("triton",)),
        ("flash/sdpa", ("flash", "fmha", "attention")),
        ("reduce", ("reduce",)),
        ("copy", ("copy", "cat", "index")),
        ("elementwise", ("elementwise", "vectorized")),
    )
    out: dict[str, float] = defaultdict(float)
    for e in avg:
        if e.device_type != DeviceType.CUDA:
            continue
        key = e.key.lower()
        fam = next((f for f, names in families if any(n in key for n in names)), "other")
        out[fam] += e.self_device_time_total / 1000.0
    out["total"] = sum(out.values())
    return {k: round(v, 2) for k, v in out.items()}


def interleaved(fns: dict, repeats: int, cuda: bool) -> tuple[dict[str, list[float]], dict[str, int], dict[str, float]]:
    """Each of ``fns`` once to warm up (compilation, autotuning, the allocator), then ``repeats``
    rounds that run each once in turn, so that a busy machine slows them alike. Returns the seconds
    of every timed run, on CUDA each one's peak bytes allocated, and the seconds of each warm-up run."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    peaks: dict[str, int] = {k: 0 for k in fns}
    warmups: dict[str, float] = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        warmups[name] = time.perf_counter() - t0
    for _ in range(repeats):
        for name, fn in fns.items():
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
                peaks[name] = max(peaks[name], torch.cuda.max_memory_allocated())
            times[name].append(time.perf_counter() - t0)
    return times, peaks, warmups


def compile_report() -> dict:
    """What torch.compile did in this process: seconds per phase (dynamo's ``compile_times``) and
    the cache counters (AOTAutograd's and inductor's hits, misses, bypasses)."""
    from torch._dynamo.utils import compile_times, counters

    names, values = compile_times(repr="csv", aggregate=True)
    return {
        "seconds": {n: round(float(v), 3) for n, v in zip(names, values)},
        "counters": {k: dict(counters[k]) for k in ("aot_autograd", "inductor")},
    }


def bench_model(shape: str, dtype: torch.dtype, device: str, layers: int | None):
    """A model of the case's shape with random weights (cut to ``layers`` blocks if given)."""
    if layers is None:
        return make_model(shape, dtype=dtype, device=device)
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(max_position_embeddings=8192, rms_norm_eps=1e-5, **{**SHAPES[shape], "num_hidden_layers": layers})
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    return model.eval()


def run_case(
    name: str,
    n: int,
    bridge_tokens: int,
    atp_tokens: int | None,
    repeats: int,
    chunks: int,
    recompute: str = "auto",
    profile_dir: Path | None = None,
    generic: bool = False,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    layers: int | None = None,
    compare: bool = False,
) -> dict:
    """One case: the bridge scorer and the atp scorer (its fast path, or with ``generic`` its generic
    path; with ``compare`` both), timed in interleaved rounds over their own batches."""
    shape, p_len, r_len = CASES[name]
    model = bench_model(shape, dtype, device, layers)
    exs = make_examples(n, p_len, r_len, model.config.vocab_size)
    v = direction(model)
    tok = SimpleNamespace(pad_token_id=0)
    bridge = BridgeScorer(ScoringContext(model=model, tokenizer=tok, direction=v, device=device))

    def atp_scorer(fast: bool) -> AttributionScorer:
        options = {
            "scorer_options": {"chunks": chunks},
            "atp_recompute": recompute,
            "fast_tail": fast,
            "atp_fast": fast,
        }
        return AttributionScorer(
            ScoringContext(model=model, tokenizer=tok, direction=v, device=device, options=options)
        )

    atp = atp_scorer(not generic)
    cuda = device == "cuda"
    atp_tokens = atp_tokens or atp.max_tokens_cuda
    b_batches, a_batches = buckets(exs, bridge_tokens), buckets(exs, atp_tokens)
    longest = max(len(e.tokens.input_ids) for e in exs)
    free = _free_bytes(device)
    passes = sum(len(atp._passes(b, free)) for b in a_batches)
    tokens = sum(len(e.tokens.input_ids) for e in exs)
    base = torch.cuda.memory_allocated() if cuda else 0
    runs = {"bridge": lambda: [bridge.score(b) for b in b_batches], "atp": lambda: [atp.score(b) for b in a_batches]}
    if compare and not generic:
        atp_generic = atp_scorer(False)
        runs["atp_generic"] = lambda: [atp_generic.score(b) for b in a_batches]
    times, peaks, warmups = interleaved(runs, repeats, cuda)
    med = statistics.median
    t_bridge, t_atp = times["bridge"], times["atp"]
    out = {
        "case": name,
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "layers": layers,
        "atp_path": "generic" if atp.gated_fast is None else "fast",
        "examples": n,
        "tokens": tokens,
        "chunks": chunks,
        "recompute": recompute,
        "bridge_max_tokens": bridge_tokens,
        "atp_max_tokens": atp_tokens,
        "atp_passes": passes,
        "bridge_s": med(t_bridge),
        "atp_s": med(t_atp),
        "ratio_atp_over_bridge": med(t_atp) / med(t_bridge),
        "bridge_tokens_per_s": tokens / med(t_bridge),
        "atp_tokens_per_s": tokens / med(t_atp),
        "bridge_runs_s": t_bridge,
        "atp_runs_s": t_atp,
        "repeats": repeats,
        "warmup_s": warmups,
    }
    if "atp_generic" in times:
        t_gen = times["atp_generic"]
        out.update(
            {
                "atp_generic_s": med(t_gen),
                "ratio_atp_generic_over_bridge": med(t_gen) / med(t_bridge),
                "atp_generic_runs_s": t_gen,
                "speedup_fast_over_generic": med(t_gen) / med(t_atp),
            }
        )
    if free is not None:
        plan_tokens, plan_recompute = atp._plan(free, longest)
        predicted = pass_bytes(atp.shape, min(atp_tokens, plan_tokens), longest, atp.row_chunk, plan_recompute)
        out.update(
            {
                "atp_plan_at_longest": [plan_tokens, plan_recompute],
                "peak_mem_bridge_gb": peaks["bridge"] / 2**30,
                "peak_mem_atp_gb": peaks["atp"] / 2**30,
                "atp_peak_over_weights_gb": (peaks["atp"] - base) / 2**30,
                "atp_predicted_pass_gb": predicted / 2**30,
            }
        )
        if "atp_generic" in peaks:
            out["peak_mem_atp_generic_gb"] = peaks["atp_generic"] / 2**30
    if profile_dir is not None and cuda:
        profile_dir.mkdir(parents=True, exist_ok=True)
        stem = name.replace("/", "_")
        for key, fn in runs.items():
            label = "atp_generic" if key == "atp" and generic else key
            out[f"profile_ms_{label}"] = profile_tables(fn, profile_dir / f"{stem}_{label}.txt")
    print(json.dumps(out), flush=True)
    if cuda:
        torch.cuda.empty_cache()
    return out


def saved_case(name: str, layers: int, tail: int, n: int, generic: bool = False) -> list[dict]:
    from transformers import LlamaConfig, LlamaForCausalLM

    shape, p_len, r_len = CASES[name]
    cfg = LlamaConfig(max_position_embeddings=8192, rms_norm_eps=1e-5, **{**SHAPES[shape], "num_hidden_layers": layers})
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    exs = make_examples(n, p_len, r_len, cfg.vocab_size)
    v = direction(model, k=tail)
    rows = []
    for recompute in ("never", "always"):
        scorer = AttributionScorer(
            ScoringContext(
                model=model,
                tokenizer=SimpleNamespace(pad_token_id=0),
                direction=v,
                options={"atp_recompute": recompute, "fast_tail": not generic},
            )
        )
        batch = make_batch(exs, 0)
        B, L = batch.input_ids.shape
        groups = [chunk_ids(len(r), 1) for r in batch.resp]
        t0 = time.perf_counter()
        by = saved_bytes(scorer, batch, groups)
        seconds = time.perf_counter() - t0
        per_token = {k: v / (B * L) for k, v in sorted(by.items())}
        full = SHAPES[shape]["num_hidden_layers"]
        per_block = {
            "prefix": sum(v for k, v in per_token.items() if k.startswith("prefix")) / max(1, layers - tail),
            "tail": sum(v for k, v in per_token.items() if k.startswith("tail")) / tail,
        }
        rest = sum(v for k, v in per_token.items() if not k.startswith(("prefix", "tail")))
        row = {
            "case": name,
            "atp_path": "generic" if scorer.gated_fast is None else "fast",
            "layers": layers,
            "tail": tail,
            "batch": [B, L],
            "recompute": recompute,
            "bytes_per_token": sum(per_token.values()),
            "by_component": per_token,
            "per_block": per_block,
            "predicted_bytes_per_token": token_bytes(scorer.shape, L, recompute == "always"),
            f"full_{full}_layers_bytes_per_token": per_block["prefix"] * (full - tail)
            + per_block["tail"] * tail
            + rest,
            "seconds_cpu": seconds,
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="llama-3.2-1b/metamath,llama-3.2-3b/metamath")
    ap.add_argument("--examples", type=int, default=256)
    ap.add_argument("--bridge-max-tokens", type=int, default=32768)
    ap.add_argument("--atp-max-tokens", type=int, default=None, help="default: the atp scorer's own default")
    ap.add_argument("--recompute", choices=["auto", "never", "always"], default="auto")
    ap.add_argument("--chunks", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--saved-bytes", action="store_true", help="measure saved bytes per token on the CPU")
    ap.add_argument(
        "--layers",
        type=int,
        default=None,
        help="blocks of a cut-down model (default: the full model; --saved-bytes: 6)",
    )
    ap.add_argument(
        "--atp-generic",
        action="store_true",
        help="the atp scorer's generic path through HF's modules (fast_tail off for atp)",
    )
    ap.add_argument(
        "--atp-compare",
        action="store_true",
        help="time (and profile) the atp scorer's generic path too, interleaved with the fast one",
    )
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for relative timings of a small shape")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument(
        "--cpu-compile",
        action="store_true",
        help="--device cpu: compile the fused functions with inductor on the CPU too (as on CUDA)",
    )
    ap.add_argument(
        "--profile", default=None, metavar="DIR", help="after timing, profile one run of each scorer; op tables to DIR"
    )
    ap.add_argument("--out", default="bench/score/results/atp_cost.json")
    args = ap.parse_args(argv)
    if args.cpu_compile:
        dual_llama._Compiled.device_types = ("cuda", "cpu")
    if args.saved_bytes:
        rows = [
            r
            for c in args.cases.split(",")
            for r in saved_case(c, args.layers or 6, 4, min(args.examples, 2), args.atp_generic)
        ]
        report = {"device": "cpu", "torch": torch.__version__, "saved_bytes": rows}
    else:
        dtype = getattr(torch, args.dtype)
        rows = [
            run_case(
                c,
                args.examples,
                args.bridge_max_tokens,
                args.atp_max_tokens,
                args.repeats,
                args.chunks,
                args.recompute,
                Path(args.profile) if args.profile else None,
                args.atp_generic,
                args.device,
                dtype,
                args.layers,
                args.atp_compare,
            )
            for c in args.cases.split(",")
        ]
        name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        report = {"device": name, "torch": torch.__version__, "cases": rows, "compile": compile_report()}
        for r in rows:
            mem = f" {r['peak_mem_bridge_gb']:.1f} | {r['peak_mem_atp_gb']:.1f} |" if "peak_mem_atp_gb" in r else ""
            print(
                f"| {r['case']} ({r['atp_path']}) | {r['tokens']} | {r['bridge_s']:.2f} | {r['atp_s']:.2f} | "
                f"**{r['ratio_atp_over_bridge']:.2f}** |{mem}"
            )
            if "atp_generic_s" in r:
                print(
                    f"| {r['case']} (generic) | {r['tokens']} | {r['bridge_s']:.2f} | {r['atp_generic_s']:.2f} | "
                    f"**{r['ratio_atp_generic_over_bridge']:.2f}** |"
                )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

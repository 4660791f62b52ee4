"""torch.profiler over a few windows of `bridge score`'s loop (after the first), in one process
running the real ``run_score``: the top ops by CUDA and by CPU time, the GPU's idle share, and what
the first window's one-time work was (dynamo compile times, graphs, Triton autotuning).

    python bench/score/e2e_profile.py --from RUN --data data.jsonl --windows 3 --out DIR

Writes DIR/profile.json and DIR/tables.txt (a few hundred KB at most); prints one JSON line. The
full trace is parsed in a temporary folder and deleted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))


def busy_union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def gpu_activity(trace_file: str) -> dict:
    """GPU busy time (union of kernels, copies and memsets) and its gaps, from a chrome trace."""
    events = json.loads(Path(trace_file).read_text()).get("traceEvents", [])
    gpu = [
        (e["ts"], e["ts"] + e.get("dur", 0))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    if not gpu:
        return {"gpu_events": 0}
    gpu.sort()
    span = max(e for _, e in gpu) - gpu[0][0]
    busy = busy_union(gpu)
    gaps, end = [], gpu[0][1]
    for s, e in gpu[1:]:
        if s > end:
            gaps.append(s - end)
        end = max(end, e)
    gaps_ms = [g / 1e3 for g in gaps]
    return {
        "gpu_events": len(gpu),
        "gpu_span_ms": round(span / 1e3, 1),
        "gpu_busy_ms": round(busy / 1e3, 1),
        "gpu_idle_fraction_in_span": round(1 - busy / span, 4) if span else None,
        "gaps_over_1ms": sum(g > 1 for g in gaps_ms),
        "gaps_over_1ms_total_ms": round(sum(g for g in gaps_ms if g > 1), 1),
        "gaps_over_10ms": sum(g > 10 for g in gaps_ms),
        "largest_gaps_ms": [round(g, 2) for g in sorted(gaps_ms, reverse=True)[:10]],
    }


def gap_owners(trace_file: str, min_gap_ms: float = 2.0, top: int = 15) -> dict:
    """What the host was doing while the GPU sat idle: for every GPU gap over ``min_gap_ms``, the time
    each host-side event overlaps it, summed by name, for the loop's own labels (``host:*``, from
    :func:`label_host_work`) and for CUDA runtime calls (e.g. a synchronising copy). Nested labels
    each count their overlap."""
    events = json.loads(Path(trace_file).read_text()).get("traceEvents", [])
    gpu = sorted(
        (e["ts"], e["ts"] + e.get("dur", 0))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    gaps, end = [], gpu[0][1] if gpu else 0.0
    for s, e in gpu[1:]:
        if s - end > min_gap_ms * 1e3:
            gaps.append((end, s))
        end = max(end, e)
    out: dict = {"gaps": len(gaps), "gap_ms": round(sum(b - a for a, b in gaps) / 1e3, 1)}
    for cat, key in (("user_annotation", "labels_ms"), ("cuda_runtime", "cuda_runtime_ms")):
        owned: dict[str, float] = {}
        for e in events:
            if e.get("ph") != "X" or e.get("cat") != cat:
                continue
            s, t = e["ts"], e["ts"] + e.get("dur", 0)
            for a, b in gaps:
                if s < b and t > a:
                    owned[e["name"]] = owned.get(e["name"], 0.0) + (min(t, b) - max(s, a))
        out[key] = {k: round(v / 1e3, 1) for k, v in sorted(owned.items(), key=lambda kv: -kv[1])[:top]}
    return out


def label_host_work(loop) -> None:
    """Wrap the loop's host-side parts in profiler labels (``host:*``), here, without touching the package."""
    from torch.profiler import record_function

    from bridgecli.modeling import scoring

    def wrap(owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def inner(*a, **kw):
            with record_function(label):
                return fn(*a, **kw)

        setattr(owner, name, inner)

    wrap(loop.Ahead, "fill", "host:read+tokenise")
    wrap(loop.WriterThread, "put", "host:writer.put (waits when 2 windows queue)")
    wrap(loop, "bucket", "host:bucket")
    wrap(scoring.PendingScores, "result", "host:result (wait + records)")
    wrap(scoring.PendingScores, "__init__", "host:queue copies to host")
    wrap(scoring, "make_batch", "host:make_batch")
    wrap(scoring.BridgeScorer, "launch", "host:launch (whole)")
    wrap(scoring.BridgeScorer, "_prefix", "host:launch prefix blocks")
    wrap(scoring.BridgeScorer, "_fast_tail", "host:launch tail")
    wrap(scoring, "_rows_on_device", "host:rows_on_device")
    wrap(scoring, "_cut", "host:cut rows per example")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="run", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--windows", type=int, default=3, help="windows under the profiler, after the first")
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32768)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    os.environ.setdefault("BRIDGE_NO_PROGRESS", "1")
    os.environ.setdefault("TRITON_PRINT_AUTOTUNING", "1")
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bridgecli.steps import score as step
    from bridgecli.modeling import score_loop

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    state: dict = {"takes": 0, "prof": None}

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    info: dict = {}
    original_take = score_loop.Ahead.take

    def take(self, n):
        state["takes"] += 1
        k = state["takes"]
        if k == 2:  # the first window is done (queued): what did its one-time work cost?
            sync()
            info["first_window_main_thread_s"] = round(time.perf_counter() - state["t0"], 2)
            with contextlib.suppress(Exception):
                from torch._dynamo.utils import compile_times, counters

                info["dynamo_compile_times"] = compile_times(repr="str")
                info["dynamo_stats"] = {k: dict(v) for k, v in counters.items() if k in ("stats", "recompiles")}
            state["prof"] = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            state["prof"].__enter__()
            state["t_prof"] = time.perf_counter()
        elif k == 2 + args.windows and state["prof"] is not None:
            sync()
            info["profiled_wall_s"] = round(time.perf_counter() - state["t_prof"], 3)
            state["prof"].__exit__(None, None, None)
        return original_take(self, n)

    score_loop.Ahead.take = take
    label_host_work(score_loop)
    opts = step.ScoreOptions(
        data=args.data,
        out=os.path.join(tempfile.gettempdir(), "e2e_profile.bridge"),
        run=args.run,
        window=args.window,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
    )
    state["t0"] = time.perf_counter()  # the loop starts soon after loading; the first take marks it
    original_run = step.run_windows

    def run_windows(*a, **kw):
        state["t0"] = time.perf_counter()
        return original_run(*a, **kw)

    step.run_windows = run_windows
    step.run_score(opts)
    with contextlib.suppress(OSError):
        os.unlink(opts.out)
    prof = state["prof"]
    if prof is None or "profiled_wall_s" not in info:
        print(json.dumps({"error": "the data has too few windows to profile", **info}))
        return
    ka = prof.key_averages()
    tables = []
    for key in ("self_device_time_total", "self_cuda_time_total"):
        with contextlib.suppress(Exception):
            tables.append(("CUDA (self)", ka.table(sort_by=key, row_limit=args.top, max_name_column_width=70)))
            break
    tables.append(("CPU (self)", ka.table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=70)))
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(trace)
        info.update(gpu_activity(trace))
        info["gap_owners"] = gap_owners(trace)
    if info.get("gpu_busy_ms"):
        info["gpu_idle_fraction_of_wall"] = round(1 - info["gpu_busy_ms"] / 1e3 / info["profiled_wall_s"], 4)
    info["windows_profiled"] = args.windows
    buf = io.StringIO()
    for title, text in tables:
        buf.write(f"==== top ops by {title} time, {args.windows} windows after the first\n{text}\n")
    buf.write("==== dynamo compile times (first window)\n" + str(info.get("dynamo_compile_times", "-")) + "\n")
    (out / "tables.txt").write_text(buf.getvalue()[:2_000_000])
    (out / "profile.json").write_text(json.dumps(info, indent=2, default=str))
    print(json.dumps({k: v for k, v in info.items() if k != "dynamo_compile_times"}, default=str))


if __name__ == "__main__":
    main()

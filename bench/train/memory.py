"""Peak resident memory and step time of `bridge warmup` and `bridge train` on the CPU, against a plain
Hugging Face step (transformers model + torch AdamW) on the same rows (issue 41: a 135M warmup peaked at
7 GB).

    python bench/train/memory.py                                   # the bundled sample, default model, batch 8
    python bench/train/memory.py --data gsm8k/train.jsonl --rows 200
    python bench/train/memory.py --also-no-checkpointing           # train --no-gradient-checkpointing too
    python bench/train/memory.py --threads 1 --also-no-checkpointing --also-glibc-threshold   # docs/training.md

Each run is a process of its own, measured from outside: its peak resident set (``ru_maxrss`` of
``os.wait4``, what ``/usr/bin/time -v`` reports), its wall and CPU seconds; the steps' times come from
the runs' own metrics.jsonl (the plain step times itself the same way: forward, backward, optimizer
step). The first step (allocator and thread-pool warm-up) is left out of the median.

- warmup: ``bridge warmup DATA --val VAL --batch-size B --grad-accum 1 --max-steps S --device cpu`` (the
  direction v after the steps is part of the run: its peak counts too);
- train: ``bridge train ROWS ...`` the same, on the full-response rows of DATA (prompt tokens -100);
- plain: the same model (the default model's weights as bridgecli loads them, an HF LlamaForCausalLM),
  ``torch.optim.AdamW`` with its defaults, rows right-padded into batches of B with an attention mask,
  ``model(input_ids, attention_mask, labels).loss``, in the same order of rows.

The machine's load (``os.getloadavg``) is recorded before and after each run: CPU timings are only
comparable on a quiet machine; peak memory hardly depends on it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

from provenance import header, report, result_parser, settings  # noqa: E402

SAMPLE = ROOT / "examples" / "data"
#: `bridge ARGS...` with bridgecli.runtime.allocator's threshold left out (glibc's own, which rises)
GLIBC_DEFAULT = (
    "import sys; import bridgecli.runtime.allocator as a; a.fix_mmap_threshold = lambda *x: False; "
    "from bridgecli.cli.app import main; sys.argv[0] = 'bridge'; main()"
)


def measured(argv: list[str], env: dict) -> dict:
    """Run ``argv``; its peak RSS (GB), wall and CPU seconds, exit code, the load around it and its stderr's tail."""
    before = os.getloadavg()
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        err.seek(0)
        tail = err.read().decode(errors="replace").splitlines()[-5:]
    return {
        "argv": [Path(argv[0]).name, *argv[1:]],
        "exit": os.waitstatus_to_exitcode(status),
        "peak_rss_gb": round(usage.ru_maxrss / 1e6, 3),  # KiB on Linux
        "wall_s": round(time.perf_counter() - start, 1),
        "user_s": round(usage.ru_utime, 1),
        "sys_s": round(usage.ru_stime, 1),
        "load_before": [round(x, 2) for x in before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "stderr_tail": tail,
    }


def step_times(metrics: Path) -> list[float]:
    return [json.loads(line)["step_time"] for line in metrics.read_text().splitlines() if line.strip()]


def summary(times: list[float]) -> dict:
    timed = times[1:] or times
    return {
        "steps": len(times),
        "step_s": [round(t, 2) for t in times],
        "median_step_s": round(statistics.median(timed), 2),
    }


def write_rows(data: Path, limit: int, out: Path) -> int:
    """The full-response rows of the first ``limit`` examples of ``data`` (as warmup trains on them), as
    input_ids/labels JSONL; returns how many."""
    from bridgecli.data.examples import DataOptions, iter_examples
    from bridgecli.modeling.loading import load_tokenizer
    from bridgecli.training.rows import full_response_row

    tok = load_tokenizer(None)
    rows = [full_response_row(e.id, e.tokens) for e in iter_examples(data, tok, DataOptions(limit=limit))]
    out.write_text("".join(json.dumps({"id": r.id, "input_ids": r.input_ids, "labels": r.labels}) + "\n" for r in rows))
    return len(rows)


def plain_step(rows_path: str, batch: int, steps: int, out: str) -> None:
    """(In a process of its own.) The plain Hugging Face step on the rows, its step times to ``out``."""
    import torch

    from bridgecli.modeling.loading import load_model, load_tokenizer

    tok = load_tokenizer(None)
    model = load_model(None, device="cpu")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    rows = [json.loads(line) for line in Path(rows_path).read_text().splitlines()]
    times = []
    for s in range(steps):
        chunk = rows[(s * batch) % len(rows) :][:batch]
        width = max(len(r["input_ids"]) for r in chunk)
        ids = torch.full((len(chunk), width), tok.pad_token_id)
        labels = torch.full((len(chunk), width), -100)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, r in enumerate(chunk):
            n = len(r["input_ids"])
            ids[i, :n] = torch.tensor(r["input_ids"])
            labels[i, :n] = torch.tensor(r["labels"])
            mask[i, :n] = 1
        t = time.perf_counter()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(loss)
        times.append(time.perf_counter() - t)
    Path(out).write_text("".join(json.dumps({"step_time": t}) + "\n" for t in times))


def main() -> None:
    ap = result_parser(__doc__, str(ROOT / "bench" / "train" / "results" / "memory-cpu-sample.json"))
    ap.add_argument("--data", default=str(SAMPLE / "warm.jsonl"), help="warm data and the rows' source")
    ap.add_argument("--val", default=str(SAMPLE / "val.jsonl"), help="warmup's validation data")
    ap.add_argument("--rows", type=int, default=24, help="examples of --data used (rows of train and plain)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps of each run")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads of every run (OMP_NUM_THREADS): 1 gives step times that a busy machine disturbs least",
    )
    ap.add_argument("--also-no-checkpointing", action="store_true", help="train --no-gradient-checkpointing too")
    ap.add_argument(
        "--also-glibc-threshold",
        action="store_true",
        help="train with glibc's own (rising) mmap threshold too: bridgecli.runtime.allocator's setting left out",
    )
    ap.add_argument("--plain-step", nargs=4, metavar=("ROWS", "BATCH", "STEPS", "OUT"), help=argparse_hidden())
    args = ap.parse_args()
    if args.plain_step:
        rows, batch, steps, out = args.plain_step
        plain_step(rows, int(batch), int(steps), out)
        return
    env = {**os.environ, "BRIDGE_NO_PROGRESS": "1", "PYTHONPATH": str(ROOT / "src")}
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    common = [
        "--batch-size",
        str(args.batch_size),
        "--grad-accum",
        "1",
        "--max-steps",
        str(args.steps),
        "--device",
        "cpu",
    ]
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-memory.") as tmp:
        work = Path(tmp)
        n = write_rows(Path(args.data), args.rows, work / "rows.jsonl")
        head_n = work / "warm.jsonl"
        head_n.write_text("".join(Path(args.data).read_text().splitlines(keepends=True)[: args.rows]))
        bridge = [sys.executable, "-m", "bridgecli"]
        plans = {
            "warmup": (
                bridge + ["warmup", str(head_n), "--val", args.val, "-o", str(work / "w"), *common],
                work / "w" / "metrics.jsonl",
            ),
            "train": (
                bridge + ["train", str(work / "rows.jsonl"), "-o", str(work / "t"), *common],
                work / "t" / "metrics.jsonl",
            ),
            "plain HF step": (
                [
                    sys.executable,
                    __file__,
                    "--plain-step",
                    str(work / "rows.jsonl"),
                    str(args.batch_size),
                    str(args.steps),
                    str(work / "plain.jsonl"),
                ],
                work / "plain.jsonl",
            ),
        }
        if args.also_no_checkpointing:
            plans["train --no-gradient-checkpointing"] = (
                bridge
                + ["train", str(work / "rows.jsonl"), "-o", str(work / "t2"), *common, "--no-gradient-checkpointing"],
                work / "t2" / "metrics.jsonl",
            )
        if args.also_glibc_threshold:
            plans["train, glibc's own mmap threshold"] = (
                [
                    sys.executable,
                    "-c",
                    GLIBC_DEFAULT,
                    "train",
                    str(work / "rows.jsonl"),
                    "-o",
                    str(work / "t3"),
                    *common,
                ],
                work / "t3" / "metrics.jsonl",
            )
        for name, (argv, metrics) in plans.items():
            print(f"{name} ...", file=sys.stderr, flush=True)
            run = measured(argv, env)
            if run["exit"] != 0:
                sys.exit(f"{name} failed ({run['exit']}): " + "\n".join(run["stderr_tail"]))
            runs[name] = {**run, **summary(step_times(metrics))}
    result = {
        **header("cpu"),
        "settings": settings(args, "data", "val", "rows", "batch_size", "steps", "threads"),
        "rows_used": n,
        "runs": runs,
    }
    lines = [
        f"{result['device_name']}, torch {result['torch']}, transformers {result['transformers']}, commit "
        f"{result['commit']}; {n} rows of {Path(args.data).name}, batch {args.batch_size}, {args.steps} steps each"
        + (f", {args.threads} thread(s)" if args.threads else ""),
        "",
        "| run | peak RSS | median step (s) | CPU s (user+sys) | wall s | load before -> after (1 min) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, run in runs.items():
        lines.append(
            f"| {name} | {run['peak_rss_gb']:.2f} GB | {run['median_step_s']:.1f} | {run['user_s'] + run['sys_s']:.0f} | "
            f"{run['wall_s']:.0f} | {run['load_before'][0]:.1f} -> {run['load_after'][0]:.1f} |"
        )
    md = str(Path(args.out).with_suffix(".md")) if args.out else None
    report("\n".join(lines) + "\n", result, args.out, md)


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()

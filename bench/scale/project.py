#!/usr/bin/env python3
"""Project the time, GPU-hours and disk of BRIDGE at MetaMathQA's 395K examples and at 100M examples
from rates measured elsewhere in this repo. Nothing is measured here and no rate is written here:
every input is read from a results file (listed in INPUTS) or from bench/scale/quoted.json, which
holds the one measured number that was recorded only in prose, with its source.

    python bench/scale/project.py            # the tables of docs/scale.md (Markdown)
    python bench/scale/project.py --json     # the same numbers as JSON

Assumptions (printed with the tables):
- tokens per example: MetaMathQA's are taken to be GSM8K-sized, i.e. the tokens per example of real
  GSM8K train records with the default tokenizer and chat template (bench/scale/results/
  stream_bytes_cpu.json). MetaMathQA rewrites GSM8K and MATH questions; its MATH-derived answers are
  longer, so this is likely an underestimate. Every time and GPU-hour below scales linearly with it.
- scoring rates: the scorer alone on GSM8K-sized batches (kernel) and `bridge score` as a user runs
  it (process, the loop's rate after its first window), both on one H200 (bench/score/).
- GPU time = examples x tokens per example / rate. For the process rates, the wall time on G GPUs
  adds the one-time work of each rank (loading, tokenizer, the first window's compilation) as
  measured beside the rate: the run's wall time less its tokens at the loop's rate.
- the CPU steps: one pinned core of a 16-core H200 host (bench/cpu_steps/compare.py), and with
  --workers 16 the rate measured with 16 workers on a 16-core H100 host (bench/cpu_steps/scaling.py,
  wall clock, synthetic GSM8K-sized stream).
- rank 0's merge: with 16 workers compressing its frames, as measured on a 16-core host
  (bench/scale/merge_scaling.py, records as written); its floor, reading the shards in index order
  alone in one process, was measured there too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INPUTS = {
    "kernel_default": "bench/score/results/kernel_metamath_h200.json",
    "kernel_1b": "bench/score/results/e2e_gsm8k_h200/1b_kernel.json",
    "kernel_3b": "bench/score/results/kernel_gsm8k_h200.json",
    "process_1b": "bench/score/results/e2e_gsm8k_h200/1b_score.json",
    "process_3b": "bench/score/results/e2e_gsm8k_h200/3b.json",
    "host": "bench/score/results/cpu_side_2core.json",
    "stream": "bench/scale/results/stream_bytes_cpu.json",
    "steps_one_core": "bench/cpu_steps/results/one_core_h200host.json",
    "steps_16core": "bench/cpu_steps/results/scaling_16core_h100host.json",
    "quoted": "bench/scale/quoted.json",
    "merge_16core": "bench/scale/results/merge_scaling_16core.json",
}
SCALES = {"MetaMathQA (395K)": 395_000, "100M": 100_000_000}
GPUS = (1, 8, 64)
WORKERS = 16  # cores for the CPU steps' --workers (the device pool's H100 hosts have 16)
STEPS = ("select", "close", "compact")


def load(root: Path) -> dict:
    return {k: json.loads((root / p).read_text()) for k, p in INPUTS.items()}


def rates(d: dict) -> dict:
    """Scoring rates (tokens/s on one GPU), each with its card, where it comes from, and the one-time
    seconds of a rank beside it (0 for the kernel rates, which are the ideal)."""
    dm = d["quoted"]["default_model_process_h100"]

    def kernel(key, case):
        """bench/score/bench_score.py's run: the scorer alone, tokens over its seconds."""
        r = next(x for x in d[key] if x["case"] == case)
        return ("kernel", "H200", r["tokens"] / r["score_s"], INPUTS[key], 0.0)

    def e2e(key, run, label):
        """bench/score/e2e.py's run: the loop's rate after the first window; one-time work = the
        process's wall time less its tokens at that rate."""
        r = d[key][0][run]
        rate = r["after_first_tokens_per_s"]
        return (label, "H200", rate, INPUTS[key], r["process_s"] - r["tokens"] / rate)

    return {
        "default (SmolLM2-135M)": [
            kernel("kernel_default", "smollm2-135m/metamath"),
            # one-time work is inside this rate (the whole run's tokens over its wall time)
            ("process (whole run)", "H100", dm["tokens"] / dm["wall_s"], "quoted.json: docs/benchmarks.md", 0.0),
        ],
        "Llama-3.2-1B shape": [
            kernel("kernel_1b", "llama-3.2-1b/gsm8k"),
            e2e("process_1b", "score_first", "process, first run"),
            e2e("process_1b", "score_second", "process, later run"),
        ],
        "Llama-3.2-3B shape": [
            kernel("kernel_3b", "llama-3.2-3b/gsm8k"),
            e2e("process_3b", "score_first", "process, first run"),
            e2e("process_3b", "score_second", "process, later run"),
        ],
    }


def cpu_steps(d: dict, workers: int) -> dict:
    one = d["steps_one_core"]["steps"]  # compare.py: "new" is the checkout measured
    many = d["steps_16core"]
    assert workers in many["workers"], f"{INPUTS['steps_16core']} has no run with --workers {workers}"
    return {
        s: {
            "one_core": one[s]["new"]["ex_per_s_wall"],
            f"workers{workers}": many["steps"][s][str(workers)]["examples_per_s"],
        }
        for s in STEPS
    }


def hours(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 72 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def project(d: dict) -> dict:
    st = d["stream"]
    tpe = st["tokens_per_example"]
    bpe = st["bytes_per_example"]
    m16 = d["merge_16core"]
    merge = m16["modes"]["as_written"][str(WORKERS)]["examples_per_s"]  # rank 0 with 16 workers
    serial = m16["read_only"]["examples_per_s"]  # reading the shards in order, one process
    host = d["host"]
    # a rank's own host work, serial with its GPU work today: reading + tokenising, encoding + compressing
    host_rate = 1 / (1 / host["tokenise_tokens_per_s"] + 1 / host["write_tokens_per_s"])
    steps = cpu_steps(d, WORKERS)
    r = rates(d)
    out = {
        "assumptions": {
            "tokens_per_example": tpe,
            "bytes_per_example": bpe,
            "merge_examples_per_s": merge,
            "merge_read_examples_per_s": serial,
            "host_tokens_per_s_per_core": host_rate,
            "workers": WORKERS,
        },
        "rates": {
            m: [dict(zip(("rate", "card", "tokens_per_s", "source", "one_time_s"), x)) for x in v] for m, v in r.items()
        },
        "cpu_steps": steps,
        "scales": {},
    }
    for name, n in SCALES.items():
        tokens = n * tpe
        scoring = {}
        for model, rs in r.items():
            scoring[model] = [
                {
                    "rate": lab,
                    "card": card,
                    "gpu_hours": tokens / tps / 3600,
                    **{f"wall_s_{g}gpu": tokens / tps / g + once for g in GPUS},
                }
                for lab, card, tps, _, once in rs
            ]
        out["scales"][name] = {
            "examples": n,
            "tokens": tokens,
            "stream_gb": n * bpe / 1e9,
            "scoring": scoring,
            "host_floor_gpu_hours": tokens / host_rate / 3600,
            "merge_s": n / merge,
            "merge_read_s": n / serial,
            "steps_one_core_s": {s: n / steps[s]["one_core"] for s in STEPS},
            "steps_workers_s": {s: n / steps[s][f"workers{WORKERS}"] for s in STEPS},
        }
        out["scales"][name]["pipeline"] = pipeline(out["scales"][name], r, bpe / tpe)
    return out


#: the pipeline table's scoring rate: the 1B shape's later run on an H200 (a process, measured)
PIPELINE_RATE = ("Llama-3.2-1B shape", "process, later run")


def pipeline(sc: dict, r: dict, bytes_per_token: float) -> list[dict]:
    """The whole pipeline on G GPUs, one stage after the other: scoring, rank 0's merge (G > 1),
    then select, close and compact with --workers; the longest stage; and the rate at which the
    ranks together write their shards while they score."""
    row = next(x for x in sc["scoring"][PIPELINE_RATE[0]] if x["rate"] == PIPELINE_RATE[1])
    tps = next(x[2] for x in r[PIPELINE_RATE[0]] if x[0] == PIPELINE_RATE[1])
    out = []
    for g in GPUS:
        stages = {
            "scoring": row[f"wall_s_{g}gpu"],
            "merge": sc["merge_s"] if g > 1 else 0.0,
            "cpu steps": sum(sc["steps_workers_s"].values()),
        }
        # every rank holds its GPU until rank 0's merge is done
        out.append(
            {
                "gpus": g,
                **stages,
                "total": sum(stages.values()),
                "longest": max(stages, key=stages.get),
                "gpu_hours_held": g * (stages["scoring"] + stages["merge"]) / 3600,
                "write_mb_per_s": g * tps * bytes_per_token / 1e6,
            }
        )
    return out


def markdown(p: dict) -> str:
    a = p["assumptions"]
    lines = [
        "### Inputs",
        "",
        "| input | value | from |",
        "|---|---|---|",
        f"| tokens per example (GSM8K-sized; MetaMathQA assumed alike) | {a['tokens_per_example']:.0f} | {INPUTS['stream']} |",
        f"| stream bytes per example (real scorer, default model) | {a['bytes_per_example']:,.0f} | {INPUTS['stream']} |",
        f"| rank 0's merge, {a['workers']} workers ({a['workers']}-core host) | {a['merge_examples_per_s']:,} "
        f"examples/s | {INPUTS['merge_16core']} |",
        f"| rank 0's merge: reading the shards in order alone, one process | {a['merge_read_examples_per_s']:,} "
        f"examples/s | {INPUTS['merge_16core']} |",
        f"| a rank's host work (tokenise + write), one core | {a['host_tokens_per_s_per_core']:,.0f} tokens/s | {INPUTS['host']} |",
    ]
    for model, rs in p["rates"].items():
        for x in rs:
            lines.append(
                f"| {model}: scoring, {x['rate']} | {x['tokens_per_s']:,.0f} tokens/s per {x['card']} | {x['source']} |"
            )
    w = a["workers"]
    for s, v in p["cpu_steps"].items():
        lines.append(
            f"| `{s}`: one core / {w} workers ({w}-core hosts) | "
            f"{v['one_core']:,} / {v[f'workers{w}']:,} examples/s | "
            f"{INPUTS['steps_one_core']}, {INPUTS['steps_16core']} |"
        )
    for name, sc in p["scales"].items():
        lines += [
            "",
            f"### {name}: {sc['examples']:,} examples, {sc['tokens'] / 1e9:.3g}B tokens, "
            f"a {sc['stream_gb']:,.1f} GB scored stream",
            "",
            "| scoring | rate | GPU-hours | 1 GPU | 8 GPUs | 64 GPUs |",
            "|---|---|---|---|---|---|",
        ]
        for model, rows in sc["scoring"].items():
            for x in rows:
                lines.append(
                    f"| {model} | {x['rate']} ({x['card']}) | {x['gpu_hours']:,.1f} | "
                    + " | ".join(hours(x[f"wall_s_{g}gpu"]) for g in GPUS)
                    + " |"
                )
        lines += [
            "",
            "| serial CPU work | one core | " + f"--workers {a['workers']} |",
            "|---|---|---|",
            f"| rank 0's merge (several GPUs only; its own workers) | | {hours(sc['merge_s'])} |",
            f"| its floor: reading the shards in order alone | {hours(sc['merge_read_s'])} | |",
        ]
        for s in STEPS:
            lines.append(f"| `{s}` | {hours(sc['steps_one_core_s'][s])} | {hours(sc['steps_workers_s'][s])} |")
        total1 = sum(sc["steps_one_core_s"].values())
        totalw = sum(sc["steps_workers_s"].values())
        lines.append(f"| select + close + compact | {hours(total1)} | {hours(totalw)} |")
        lines.append(
            f"| host floor of scoring (tokenise + write, summed over ranks) | "
            f"{sc['host_floor_gpu_hours']:,.1f} core-hours | |"
        )
        lines += [
            "",
            f"Pipeline with {PIPELINE_RATE[0]}, {PIPELINE_RATE[1]}; the CPU steps with --workers {a['workers']}:",
            "",
            "| GPUs | scoring | rank 0's merge | select + close + compact | total | longest | GPU-hours held | "
            "shards written at |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for x in sc["pipeline"]:
            lines.append(
                f"| {x['gpus']} | {hours(x['scoring'])} | {hours(x['merge']) if x['gpus'] > 1 else '-'} | "
                f"{hours(x['cpu steps'])} | {hours(x['total'])} | {x['longest']} | {x['gpu_hours_held']:,.1f} | "
                f"{x['write_mb_per_s']:,.0f} MB/s |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this script's)")
    args = ap.parse_args()
    p = project(load(args.root))
    print(json.dumps(p, indent=2) if args.json else markdown(p))


if __name__ == "__main__":
    main()

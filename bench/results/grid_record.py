"""Merge one finished grid run into OUT/results.json (called by grid.sh; atomic, under a lock).

    grid_record.py OUT METHOD RHO SEED RUN_DIR SEL_DIR "k=v k=v ..." [BASE_SEL_DIR]
    grid_record.py --slim OUT      beside each HellaSwag and MMLU result under OUT/runs, the entry it records
                                   (eval-TASK.items.json; device_grid.sh's state archive, which leaves the results
                                   themselves out, carries these)

The entry, keyed ``METHOD/RHO/SEED``, holds the held-out losses of both files (mean, 95% interval,
tokens, examples, and per-example ``[loss sum, tokens]`` so that grid_table.py can bootstrap paired
differences), GSM8K accuracy when it was evaluated, the executed and supervised tokens of the
compacted rows, the achieved retention, the training summary, and the wall time of each step
(select, close, inspect, compact, train, eval; from grid.sh's done marks; a selection shared by
the seeds of a row counts in each seed's entry; a step resumed after an interruption counts only
its last attempt), the general-capability results (GENERAL: ARC-Challenge, HellaSwag, MMLU, HumanEval,
per item) and the row's cost (grid_cost.py: training tokens and FLOPs, the pipeline's GPU-seconds). BASE_SEL_DIR:
the selection a ``-trim`` row's rows were cut from (its select and close seconds count in the row's pipeline).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path


def dumps(results: dict) -> str:
    """results.json as written: one line per run (compact JSON), the other keys on lines of their own. A
    run's per-example records make most of the file; with one number per line (``indent``) the two
    kept grids weighed 8.3 MB, which a lent GPU machine carries beside the model pieces in every call."""
    parts = []
    for key, value in results.items():
        if key == "runs":
            body = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in value.items())
            parts.append(f' "runs": {{\n{body}\n }}' if value else ' "runs": {}')
        else:
            parts.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def _load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def _secs(out: Path, name: str) -> int:
    mark = out / "done" / name.replace("/", "_")
    return int(mark.read_text().strip()) if mark.is_file() else 0


def _losses(run: Path, kind: str, name: str) -> Path:
    """A row's ``kind``-NAME.json (kind: heldout, answer); where grid.sh's losses() has not yet moved it out of
    the eval's folder (``losses-NAME/eval-KIND-loss.json``, the moment between the eval's end and the rename,
    in which a lost machine's last state archive can be taken), that file: the same complete result."""
    moved = run / f"{kind}-{name}.json"
    left = run / f"losses-{name}" / f"eval-{kind}-loss.json"
    return left if not moved.is_file() and left.is_file() else moved


def heldout(path: Path) -> dict | None:
    res = _load(path)
    if res is None:
        return None
    s = res["summary"]
    return {
        "loss": s["loss"],
        "ci_low": s["ci_low"],
        "ci_high": s["ci_high"],
        "tokens": s["tokens"],
        "n": s["n"],
        "skipped_too_long": len(s.get("skipped_too_long") or []),
        "items": [[round(it["loss_sum"], 5), it["tokens"]] for it in res["items"]],
    }


def accuracy(path: Path) -> dict | None:
    res = _load(path)
    if res is None:
        return None
    s = res["summary"]
    items = sorted(res["items"], key=lambda it: it["index"])
    return {
        "accuracy": s["accuracy"],
        "n": s["n"],
        "correct": s.get("correct"),
        "items": [int(bool(it["correct"])) for it in items],
    }


def answer_loss(path: Path) -> dict | None:
    """The answer-span loss (``eval --task answer-loss``): its summary and per-item values (None where an
    item's answer span was not found)."""
    res = _load(path)
    if res is None:
        return None
    s = res["summary"]
    items = sorted(res["items"], key=lambda it: it["index"])
    return {k: s.get(k) for k in ("loss", "ci_low", "ci_high", "n", "no_answer")} | {
        "items": [None if it.get("loss") is None else round(it["loss"], 6) for it in items]
    }


SHARED = ("data", "warmup", "score", "score-atp", "score-debiased", "ref-base", "ref-warmup")

# The general-capability tasks of the paper's retention claim (grid.sh GENERAL) and the metric each enters the
# general average with, fixed before any retention result was seen (2026-11-28): acc_norm for ARC-Challenge and
# HellaSwag (the Open LLM Leaderboard's choice), acc for MMLU (one-token answers: acc_norm is the same), pass@1
# for HumanEval.
GENERAL_METRIC = {"arc_challenge": "acc_norm", "hellaswag": "acc_norm", "mmlu": "acc", "humaneval": "accuracy"}


#: the general tasks whose eval results device_grid.sh's state archive leaves out (MBs a row; ARC-Challenge's and
#: HumanEval's, about 1 MB and 0.5 MB, travel): the archive carries their entries instead (``slim``)
SLIM = ("hellaswag", "mmlu")


def _slim_path(path: Path, task: str) -> Path:
    return path.with_name(f"eval-{task}.items.json")


def general_task(path: Path, task: str) -> dict | None:
    """A general-capability task's result: its summary metrics and, per item in the file's order, 1/0 for the
    average's metric (and for acc where that differs), so grid_table.py can pair items across rows. Where the
    result itself is absent, its entry as ``slim`` wrote it (a lost machine's state archive carries that one)."""
    res = _load(path)
    if res is None:
        return _load(_slim_path(path, task))
    s = res["summary"]
    items = sorted(res["items"], key=lambda it: (it.get("subject") or "", it["index"]))
    metric = GENERAL_METRIC[task]
    key = "correct_norm" if metric == "acc_norm" else "correct"
    out = {"metric": metric, "score": s[metric], "n": s["n"], "accuracy": s["accuracy"]}
    out["items"] = [int(bool(it[key])) for it in items]
    if key != "correct":
        out["acc"] = s.get("acc")
        out["items_acc"] = [int(bool(it["correct"])) for it in items]
    if task == "mmlu":
        out["acc_macro"] = s.get("acc_macro")
    if task == "humaneval":
        out["sandbox"] = (s.get("settings") or {}).get("sandbox", {}).get("isolation")
    return out


def slim(out: Path) -> list[Path]:
    """Write beside each HellaSwag and MMLU result under ``out``/runs the entry ``general_task`` makes of it
    (eval-TASK.items.json, tens of KB against the result's MBs), where it is missing or older than the result;
    a result still being written is left for the next call. The files written."""
    written = []
    for task in SLIM:
        for path in sorted((out / "runs").glob(f"**/general/eval-{task}.json")):
            dest = _slim_path(path, task)
            if dest.is_file() and dest.stat().st_mtime >= path.stat().st_mtime:
                continue
            try:
                entry = general_task(path, task)
            except (ValueError, KeyError):  # not a whole result (yet)
                continue
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(entry, separators=(",", ":")))
            os.replace(tmp, dest)
            written.append(dest)
    return written


def cost(out: Path, method: str, run: str, sel: str, base_sel: str) -> dict:
    """What the row costs (bench/results/grid_cost.py): training tokens executed and computed (with padding)
    from the training log, training FLOPs by the stated formula, and the GPU-seconds of the row's pipeline (the
    shared steps it needs, on the machine that recorded it, plus its own select, close, compact and train)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import grid_cost

    log = grid_cost.training_log(out / run / "model" / "metrics.jsonl")
    c: dict = {"train_steps": log["steps"], "train_executed": log["executed"], "train_computed": log["computed"]}
    if log["step_seconds"]:  # the steps' own time: what a row's length changes (load and checkpoints do not)
        c["train_step_seconds"] = log["step_seconds"]
        c["train_between_steps_seconds"] = log["between_steps_seconds"]  # the grid's checkpoints (SAVE_EVERY)
    config = _load(out / run / "model" / "config.json")
    rows = out / sel / "train.jsonl"
    recorded = (_load(out / run / "model" / "bridge_train.json") or {}).get("train_flops")
    if recorded:  # bridge train's own figure: the same formula summed over the rows each step ran
        c["train_flops"] = float(recorded)
        c["train_flops_from"] = "bridge train's bridge_train.json (train_flops)"
    elif config and rows.is_file() and log["executed"]:
        lengths = grid_cost.row_lengths(rows)
        c["train_flops"] = grid_cost.consumed_flops(lengths, config, log["executed"])
    if config and "train_flops" in c:
        c["matmul_params"] = grid_cost.matmul_params(config)[0]
    gpu = {name: _secs(out, name) for name in grid_cost.needs(method)}
    for name in ("select", "close", "compact"):
        gpu[name] = _secs(out, f"{sel}/{name}") + (_secs(out, f"{base_sel}/{name}") if base_sel else 0)
    gpu["train"] = _secs(out, f"{run}/train")
    c["pipeline_seconds"] = gpu
    c["pipeline_total"] = sum(gpu.values())
    procs = int(os.environ.get("GRID_GPU_PROCS") or 1)
    if procs > 1:  # its own steps ran beside other rows on one GPU: wall seconds, not GPU-seconds of its own
        c["gpu_processes"] = procs
    return c


def entry(out: Path, method: str, rho: str, seed: str, run: str, sel: str, settings: str, base_sel: str = "") -> dict:
    e: dict = {
        "method": method,
        "rho": float(rho),
        "seed": None if seed == "-" else int(seed),
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings": dict(kv.split("=", 1) for kv in settings.split()),
    }
    e["heldout"] = {name: heldout(_losses(out / run, "heldout", name)) for name in ("gsm8k", "math500")}
    for key, name in (("gsm8k_accuracy", "acc-gsm8k"), ("math500_accuracy", "acc-math500")):
        acc = accuracy(out / run / f"{name}.json")
        if acc is not None:
            e[key] = acc
    answer = {name: answer_loss(_losses(out / run, "answer", name)) for name in ("gsm8k", "math500")}
    if any(answer.values()):
        e["answer_loss"] = answer
    general = {task: general_task(out / run / "general" / f"eval-{task}.json", task) for task in GENERAL_METRIC}
    if any(general.values()):
        e["general"] = {k: v for k, v in general.items() if v is not None}
    evals = (
        "gsm8k",
        "math500",
        "acc",
        "acc-math",
        "general",
        "arc_challenge",
        "hellaswag",
        "mmlu",
        "humaneval",
    )  # eval-gsm8k / -math500: held-out (and answer-span) losses; eval-general: the log-likelihood tasks in one
    # process (grid.sh until 2026-11-30), then one mark a task
    seconds = {f"eval-{t}": _secs(out, f"{run}/eval-{t}") for t in evals}
    # the evaluation's wall time: grid.sh's eval-wall mark when its steps ran in two lanes (they overlap)
    seconds["eval"] = _secs(out, f"{run}/eval-wall") or sum(seconds.values())
    if sel:
        meta = _load(out / sel / "train.jsonl.bridge.json") or {}
        e["tokens"] = {
            "executed": meta.get("tokens_executed"),
            "original": meta.get("tokens_original"),
            "supervised": meta.get("supervised"),
            "rows": meta.get("rows"),
            "dropped_rows": len(meta.get("dropped") or []),
        }
        info = _load(out / sel / "inspect.json") or {}
        s = info.get("selection") or {}
        e["selection"] = {k: s.get(k) for k in ("achieved_rho_p", "achieved_rho_r", "prompt_kept", "response_kept")}
        if "closure" in info:
            e["selection"]["closure_supervised"] = info["closure"].get("supervised")
        trained = _load(out / run / "model" / "bridge_train.json") or {}
        e["train"] = {
            k: trained.get(k)
            for k in (
                "steps",
                "final_loss",
                "executed_tokens",
                "supervised_tokens",
                "train_seconds",
                "resumed_from_step",
            )
            if k in trained
        }
        for name in ("select", "close", "inspect", "compact"):
            seconds[name] = _secs(out, f"{sel}/{name}")
        seconds["train"] = _secs(out, f"{run}/train")
        e["cost"] = cost(out, method, run, sel, base_sel)
    seconds["total"] = sum(v for k, v in seconds.items() if not k.startswith("eval-"))  # eval: their wall time
    e["seconds"] = seconds
    return e


def main(argv: list[str]) -> None:
    if argv[:1] == ["--slim"]:
        for path in slim(Path(argv[1])):
            print(f"wrote {path}", file=sys.stderr)
        return
    out, method, rho, seed, run, sel, settings = Path(argv[0]), *argv[1:7]
    new = entry(out, method, rho, seed, run, sel, settings, argv[7] if len(argv) > 7 else "")
    key = f"{method}/{float(rho):g}/{seed}"
    path = out / "results.json"
    with open(out / ".results.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # grid.sh runs with disjoint METHODS may share OUT
        results = _load(path) or {"format": "bridge-grid/1", "runs": {}}
        results["runs"][key] = new
        shared = {name: _secs(out, name) for name in SHARED if (out / "done" / name).is_file()}
        if shared:  # the shared steps of the machine that ran this entry (GPU seconds: each ran alone)
            results.setdefault("shared", {}).update(shared)
        tmp = path.with_name(f".results.json.{os.getpid()}.tmp")
        tmp.write_text(dumps(results))
        os.replace(tmp, path)
    h = new["heldout"]
    acc = [f"{k} {new[k]['accuracy']:.4f}" for k in ("gsm8k_accuracy", "math500_accuracy") if k in new]
    print(
        f"recorded {key}: "
        + ", ".join([f"{k} {v['loss']:.4f} [{v['ci_low']:.4f}, {v['ci_high']:.4f}]" for k, v in h.items() if v] + acc),
        file=sys.stderr,
    )


if __name__ == "__main__":
    main(sys.argv[1:])

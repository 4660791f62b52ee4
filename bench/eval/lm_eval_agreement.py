"""Per-item agreement of `bridge eval` and `bridge eval --engine lm-eval` on the same model and files.

Loads the model once, runs each task with both engines on the same items, and compares item by item:
the context and choices each engine built, the log-likelihoods, the picks (`pred`, `pred_norm`) and
the verdicts (`correct`, `correct_norm`). Every item whose pick differs is explained: a different
prompt or choice text, a log-likelihood difference past the tolerance, or (for `pred_norm`) the
normalisation (bridge divides by the continuation's characters with its leading space, lm-eval by
the choice's without it).

    OMP_NUM_THREADS=1 python bench/eval/lm_eval_agreement.py data --limit 20 --mmlu-limit 1 \
        --json bench/eval/results/lm_eval_agreement.json

Default model: the embedded SmolLM2-135M-Instruct (`--model` takes any model `bridge eval` takes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bridgecli.evaluation import evaluate as bridge_evaluate
from bridgecli.evaluation import lm_eval_engine, multiple_choice as mc

TASKS = {  # task: (file under the data folder, which --limit applies)
    "arc_easy": ("arc/ARC-Easy-Test.jsonl", "limit"),
    "arc_challenge": ("arc/ARC-Challenge-Test.jsonl", "limit"),
    "hellaswag": ("hellaswag/hellaswag_val_full.txt.bz2", "limit"),
    "mmlu": ("mmlu", "mmlu_limit"),
}
TOLERANCE = 1e-3  # |loglik difference| per choice below which the two engines count as the same score


def bridge_contexts(task: str, result: dict, data: str, few_shot: int) -> list[str]:
    """The full context bridge scored each item's choices after (description, examples, query)."""
    items = result["items"]
    if task == "mmlu":
        tests, devs = mc.mmlu_files(data)
        prefix = {}
        for subject in tests:
            shots = mc.load_mmlu_csv(devs[subject])[:few_shot] if few_shot else []
            prefix[subject] = mc.mmlu_description(subject) + "".join(
                s.query + s.choices[s.gold] + mc.FEW_SHOT_SEPARATOR for s in shots
            )
        return [prefix[r["subject"]] + r["query"] for r in items]
    loader = mc.load_hellaswag if task == "hellaswag" else mc.load_arc
    shots = loader(data)[len(items) : len(items) + few_shot] if few_shot else []
    prefix = "".join(s.query + s.choices[s.gold] + mc.FEW_SHOT_SEPARATOR for s in shots)
    return [prefix + r["query"] for r in items]


def compare(task: str, ours: dict, theirs: dict, contexts: list[str]) -> dict:
    a, b = ours["items"], theirs["items"]
    assert [(r.get("subject"), r["index"]) for r in a] == [(r.get("subject"), r["index"]) for r in b], task
    same = {"pred": 0, "pred_norm": 0, "correct": 0, "correct_norm": 0}
    max_diff, differences = 0.0, []
    for x, y, ctx in zip(a, b, contexts):
        why = []
        if ctx != y["context"]:
            why.append("context text differs")
        if x["choices"] != y["choices"]:
            why.append("choice text differs")
        diff = max(abs(p - q) for p, q in zip(x["loglik"], y["loglik"]))
        max_diff = max(max_diff, diff)
        for key in same:
            same[key] += x[key] == y[key]
        if x["pred"] != y["pred"] and not why:
            why.append(f"log-likelihoods differ by up to {diff:.2e}")
        if x["pred_norm"] != y["pred_norm"] and x["pred"] == y["pred"] or x["pred_norm"] != y["pred_norm"] and not why:
            # bridge's log-likelihoods with lm-eval's normalisation (choice characters, no leading space)
            lens = [max(1, len(c[1:] if c.startswith(" ") else c)) for c in x["choices"]]
            lm_norm = max(range(len(lens)), key=lambda k: x["loglik"][k] / lens[k])
            why.append(
                "normalisation: bridge counts the leading space, lm-eval does not"
                if lm_norm == y["pred_norm"]
                else f"pred_norm differs (log-likelihoods up to {diff:.2e})"
            )
        if x["pred"] != y["pred"] or x["pred_norm"] != y["pred_norm"] or why:
            differences.append(
                {
                    "id": x["id"],
                    "subject": x.get("subject"),
                    "pred": [x["pred"], y["pred"]],
                    "pred_norm": [x["pred_norm"], y["pred_norm"]],
                    "gold": x["gold"],
                    "max_loglik_diff": diff,
                    "why": why,
                }
            )
    n = len(a)
    return {
        "task": task,
        "n": n,
        "bridge": {
            "acc": ours["summary"]["acc"],
            "acc_norm": ours["summary"]["acc_norm"],
            "seconds": ours["summary"]["seconds"],
        },
        "lm_eval": {
            "acc": theirs["summary"]["acc"],
            "acc_norm": theirs["summary"]["acc_norm"],
            "seconds": theirs["summary"]["seconds"],
        },
        "agreement": {k: v / n for k, v in same.items()},
        "max_loglik_diff": max_diff,
        "contexts_equal": sum(c == y["context"] for c, y in zip(contexts, b)),
        "choices_equal": sum(x["choices"] == y["choices"] for x, y in zip(a, b)),
        "differences": differences,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", help="the data folder (holding arc/, hellaswag/, mmlu/)")
    ap.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--tasks", default="arc_easy,hellaswag,mmlu")
    ap.add_argument("--limit", type=int, default=20, help="items per task (ARC, HellaSwag)")
    ap.add_argument("--mmlu-limit", type=int, default=1, help="items per MMLU subject")
    ap.add_argument("--few-shot", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None, help="write the comparison here")
    args = ap.parse_args()

    from bridgecli.modeling.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model).eval()
    report = {
        "model": args.model or "smollm2 (embedded default)",
        "few_shot": args.few_shot,
        "lm_eval_version": lm_eval_engine.lm_eval_version(),
        "tolerance": TOLERANCE,
        "tasks": [],
    }
    for task in args.tasks.split(","):
        rel, which = TASKS[task]
        data = str(Path(args.data) / rel)
        limit = getattr(args, which)
        kw = dict(limit=limit, few_shot=args.few_shot, batch_size=args.batch_size, progress=False)
        t0 = time.perf_counter()
        ours = bridge_evaluate(model, tokenizer, task, data, **kw)
        theirs = lm_eval_engine.evaluate(model, tokenizer, task, data, **kw)
        row = compare(task, ours, theirs, bridge_contexts(task, ours, data, args.few_shot))
        report["tasks"].append(row)
        print(
            f"{task}: n={row['n']} bridge acc {row['bridge']['acc']:.3f} acc_norm {row['bridge']['acc_norm']:.3f} | "
            f"lm-eval acc {row['lm_eval']['acc']:.3f} acc_norm {row['lm_eval']['acc_norm']:.3f} | "
            f"agree pred {row['agreement']['pred']:.1%} pred_norm {row['agreement']['pred_norm']:.1%} | "
            f"max |dLL| {row['max_loglik_diff']:.2e} | {time.perf_counter() - t0:.0f} s",
            file=sys.stderr,
        )
        for d in row["differences"]:
            print(f"  {d}", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

r"""Compare two MATH graders on the MATH-500 references: the hand-written one that ``bridge eval
--task math`` used (``bridgecli.evaluation.math_grader``) and math-verify (Hugging Face's, behind
open-r1 and lighteval).

Two sets of pairs:

- positives: each record's own ``answer`` is the gold and its ``solution`` (the worked solution,
  ending in a ``\boxed{}``) is the prediction: a correct grader accepts every one;
- negatives: record i's ``answer`` against record i+1's ``solution`` (the next record, cyclically):
  a correct grader rejects every one whose two answers differ (a few coincide, e.g. both ``2``).

- rewrites: a short hand-written list of answers a person would accept written another way (a set
  in braces, solutions in another order, ``1{,}000``, ``0.5`` for ``\\frac12``, units) and two that
  must be rejected; each line is printed with both verdicts.

Prints, per grader and set, how many pairs it accepts and its time per pair, how often the two
graders agree, and the pairs where they disagree; with ``--json`` writes all of it.

    python bench/eval/math_graders.py data/math/math500_test.jsonl [--json OUT.json]

With ``--generations`` it grades a model's generations instead: each item of one or more
``bridge eval --task math`` result files (``eval-math.json``: per item ``reference`` and
``prediction``; items seen twice, by ``unique_id``, count once), the model's whole text against the
gold answer with both graders. It reports what each accepts, what each takes as the answer (the
old grader: the last ``\boxed{}``, else "final answer is X"; math-verify: the first anchored
answer), how often the verdicts and the presence of an answer agree, the items where they differ
(gold, both extracted answers, the text's tail, both verdicts) and the time per item; with
``--save-generations`` it also writes the graded texts, compactly, so the comparison reruns
without the model.

    python bench/eval/math_graders.py --generations eval-math.json [...] [--json OUT.json]

The old grader is imported from a git revision when it is no longer in the tree
(``--old-rev``, default: the commit before the one that deleted it).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import time
from pathlib import Path

from load_code import import_at, import_file

REPO = Path(__file__).resolve().parents[2]
OLD = "src/bridgecli/evaluation/math_grader.py"


def old_grader(rev: str | None):
    """The hand-written grader module: from the tree, else from ``rev`` (or the last commit having it)."""
    path = REPO / OLD
    if not path.exists():
        if rev is None:
            gone = subprocess.run(
                ["git", "-C", str(REPO), "log", "-n", "1", "--diff-filter=D", "--format=%H", "--", OLD],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            rev = f"{gone}~1" if gone else "HEAD"
        return import_at(rev, OLD, "old_math_grader")
    return import_file(path, "old_math_grader")


# (gold, model output, the right verdict)
REWRITES = [
    ("[2,5)", r"so $x \in \boxed{[2, 5)}$", True),
    ("5", r"\boxed{5\text{ cm}}", True),
    ("1, 2", r"\boxed{\{1,2\}}", True),
    ("1,2", r"\boxed{2,1}", True),
    (r"\frac12", r"\boxed{0.5}", True),
    (r"\frac{1}{2}", r"\boxed{\dfrac{2}{4}}", True),
    ("3", r"\boxed{x=3}", True),
    ("1000", r"\boxed{1{,}000}", True),
    ("50", r"\boxed{50\%}", True),
    (r"\frac{3\pi}{2}", r"\boxed{3\pi/2}", True),
    ("x^2+2x+1", r"\boxed{(x+1)^2}", True),
    (r"2\sqrt{2}", r"\boxed{\sqrt{8}}", True),
    ("y = 2x + 3", r"\boxed{y=3+2x}", True),
    (r"\$18.90", r"\boxed{18.9}", True),
    (r"\text{(B)}", r"\boxed{B}", True),
    ("10", "The final answer is $10$. I hope it is correct.", True),
    ("4", r"\boxed{5}", False),
    (r"\pi", r"\boxed{3.14}", False),
]


class Timeouts(logging.Handler):
    """Collects math-verify's "Timeout during ..." warnings (its 5 s timers fired)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "Timeout" in record.getMessage():
            self.messages.append(record.getMessage()[:120])


def load_generations(paths: list[str]) -> tuple[list[dict], list[dict]]:
    """The graded items of ``bridge eval --task math`` result files (or of a file this script saved
    with ``--save-generations``), each once by ``unique_id``, and each file's settings."""
    items, sources, seen = [], [], set()
    for path in paths:
        result = json.loads(Path(path).read_text(encoding="utf-8"))
        summary = result.get("summary", {})
        sources.append(
            {
                "file": Path(path).name,
                "n": len(result["items"]),
                "model": summary.get("settings", {}).get("model"),
                "settings": {
                    k: summary.get("settings", {}).get(k)
                    for k in ("dtype", "device", "batch_size", "max_new_tokens", "chat_template_used", "limit")
                },
                "accuracy": summary.get("accuracy"),
                **({"source": result["source"]} if "source" in result else {}),
            }
        )
        for item in result["items"]:
            key = item.get("unique_id") or f"{path}#{item['index']}"
            if key in seen:
                continue
            seen.add(key)
            items.append(
                {
                    "unique_id": item.get("unique_id"),
                    "reference": item["reference"],
                    "prediction": item["prediction"],
                    "correct": item.get("correct"),
                }
            )
    return items, sources


def tail(text: str, chars: int = 240) -> str:
    return text if len(text) <= chars else "..." + text[-chars:]


def short(text: str | None, chars: int = 60) -> str:
    """``text`` for a printed line: repr, cut to ``chars``."""
    return repr(text if text is None or len(text) <= chars else text[:chars] + "...")


def grade_all(pairs: list[tuple[str, str]], graders: dict, timeouts: Timeouts) -> dict:
    """Each grader's verdicts on (gold, text) pairs, its timing per pair, and where math-verify's timer fired."""
    res = {}
    for name, grade in graders.items():
        grade(*pairs[0])  # imports and set-up out of the timing
        times, got, fired = [], [], {}
        for i, (gold, text) in enumerate(pairs):
            timeouts.messages = []
            start = time.perf_counter()
            got.append(bool(grade(gold, text)))
            times.append(time.perf_counter() - start)
            if timeouts.messages:  # math-verify's 5 s timer fired: on a busy CPU that can change the verdict
                fired[i] = list(timeouts.messages)
        n = len(pairs)
        ordered = sorted(times)
        res[name] = {
            "accepted": sum(got),
            "seconds": round(sum(times), 3),
            "ms_per_item": round(1000 * sum(times) / n, 3),
            "ms_median": round(1000 * ordered[n // 2], 3),
            "ms_max": round(1000 * ordered[-1], 1),
            "verdicts": got,
            "timeouts": fired,
        }
    return res


def compare_generations(args, old, new) -> None:
    items, sources = load_generations(args.generations)
    n = len(items)
    if args.save_generations:
        rows = [
            json.dumps({k: it[k] for k in ("unique_id", "reference", "prediction", "correct")}, ensure_ascii=False)
            for it in items
        ]  # one item a line
        Path(args.save_generations).write_text(
            f'{{"source": {json.dumps(sources, ensure_ascii=False)},\n"items": [\n' + ",\n".join(rows) + "\n]}\n"
        )
    graders = {
        "old": lambda gold, text: old.is_equiv(old.extract_answer(text), gold),
        "math-verify": lambda gold, text: new.is_correct(text, gold),
    }
    timeouts = Timeouts()
    logging.getLogger("math_verify").addHandler(timeouts)
    # what each takes as the answer (outside the timing)
    old_ans = [old.extract_answer(it["prediction"]) for it in items]
    new_ans = [new.extracted_text(new.parse_prediction(it["prediction"])) for it in items]
    out = {
        "n": n,
        "sources": sources,
        "extracted": {
            "old": sum(x is not None for x in old_ans),
            "math-verify": sum(x is not None for x in new_ans),
            "both": sum(x is not None and y is not None for x, y in zip(old_ans, new_ans)),
        },
    }
    presence = [
        {
            "unique_id": it["unique_id"],
            "gold": it["reference"],
            "old_extracted": old_ans[i],
            "math_verify_extracted": new_ans[i],
            "tail": tail(it["prediction"]),
        }
        for i, it in enumerate(items)
        if (old_ans[i] is None) != (new_ans[i] is None)
    ]
    out["extracted"]["agreement"] = n - len(presence)
    out["extracted"]["one_grader_only"] = presence
    print(f"generations: {n} items from {', '.join(s['file'] for s in sources)}")
    print(
        f"  an answer found: old {out['extracted']['old']}, math-verify {out['extracted']['math-verify']}, "
        f"both {out['extracted']['both']}; by one grader only: {len(presence)}"
    )
    for d in presence:
        print(f"    {d['unique_id']}: old {short(d['old_extracted'])}, math-verify {short(d['math_verify_extracted'])}")
    # gold: the reference answer; stated: the answer the old grader read in the text (where it read one),
    # which both should accept -- positives written by the model rather than by the MATH authors
    sets = {
        "gold": [(i, it["reference"]) for i, it in enumerate(items)],
        "stated": [(i, old_ans[i]) for i in range(n) if old_ans[i] is not None],
    }
    for set_name, golds in sets.items():
        if not golds:
            continue
        res = grade_all([(gold, items[i]["prediction"]) for i, gold in golds], graders, timeouts)
        a, b = res["old"]["verdicts"], res["math-verify"]["verdicts"]
        m = len(golds)
        disagree = [
            {
                "unique_id": items[i]["unique_id"],
                "gold": gold,
                "old_extracted": old_ans[i],
                "math_verify_extracted": new_ans[i],
                "old": a[k],
                "math_verify": b[k],
                "tail": tail(items[i]["prediction"]),
            }
            for k, (i, gold) in enumerate(golds)
            if a[k] != b[k]
        ]
        timed_out = [
            {
                "unique_id": items[golds[k][0]]["unique_id"],
                "gold": golds[k][1],
                "grader": name,
                "messages": msgs,
                "verdict": res[name]["verdicts"][k],
                "again": bool(graders[name](golds[k][1], items[golds[k][0]]["prediction"])),
            }
            for name in res
            for k, msgs in res[name]["timeouts"].items()
        ]
        section = {
            "n": m,
            "agreement": m - len(disagree),
            "disagreements": disagree,
            "timed_out": timed_out,
            **{name: {k: v for k, v in r.items() if k not in ("verdicts", "timeouts")} for name, r in res.items()},
        }
        if set_name == "gold":
            recorded = [it["correct"] for it in items]
            section["math-verify"]["differs_from_recorded"] = sum(r is not None and r != v for r, v in zip(recorded, b))
        out[set_name] = section
        print(
            f"{set_name}: {m} pairs"
            + (
                " (gold = the reference answer)"
                if set_name == "gold"
                else " (gold = the answer the old grader reads in the text)"
            )
        )
        for name in graders:
            r = section[name]
            print(
                f"  {name:12s} accepts {r['accepted']}/{m}, {r['ms_per_item']:.2f} ms per item "
                f"(median {r['ms_median']:.2f}, max {r['ms_max']:.0f})"
            )
        print(f"  agreement    {section['agreement']}/{m} ({100 * section['agreement'] / m:.1f}%)")
        if section["math-verify"].get("differs_from_recorded"):
            print(
                f"  math-verify differs from the verdict in the result file on "
                f"{section['math-verify']['differs_from_recorded']} items"
            )
        for t in timed_out:
            print(
                f"  {t['grader']} timed out on {t['unique_id']} ({len(t['messages'])}x): {t['verdict']}, "
                f"graded again: {t['again']}"
            )
        for d in disagree:
            print(
                f"    {d['unique_id']}: gold {short(d['gold'])}; old reads {short(d['old_extracted'])} -> {d['old']}; "
                f"math-verify reads {short(d['math_verify_extracted'])} -> {d['math_verify']}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", nargs="?", help="MATH-500 JSONL (problem, solution, answer)")
    ap.add_argument(
        "--generations",
        nargs="+",
        metavar="RESULT.json",
        help="grade these `bridge eval --task math` results' generations instead of the references",
    )
    ap.add_argument(
        "--save-generations",
        metavar="OUT.json",
        help="with --generations: also write the graded items (gold, text) here, to rerun without the model",
    )
    ap.add_argument("--json", help="write the numbers and the disagreements here")
    ap.add_argument("--old-rev", help="git revision to take the old grader from when it is gone")
    args = ap.parse_args()
    if (args.data is None) == (args.generations is None):
        ap.error("pass the MATH-500 JSONL, or --generations RESULT.json")

    from bridgecli.evaluation import math_verify_grader as new

    old = old_grader(args.old_rev)
    if args.generations:
        compare_generations(args, old, new)
        return
    records = [json.loads(line) for line in Path(args.data).read_text(encoding="utf-8").splitlines() if line.strip()]
    n = len(records)
    sets = {
        "positives": [(r["answer"], r["solution"], r) for r in records],
        "negatives": [(r["answer"], records[(i + 1) % n]["solution"], r) for i, r in enumerate(records)],
    }
    graders = {
        "old": lambda gold, text: old.is_equiv(old.extract_answer(text), gold),
        "math-verify": lambda gold, text: new.is_correct(text, gold),
    }
    out = {"n": n, "data": Path(args.data).name}
    for set_name, pairs in sets.items():
        results = {}
        for name, grade in graders.items():
            grade(*pairs[0][:2])  # imports and first-call set-up out of the timing
            start = time.perf_counter()
            verdicts = [bool(grade(gold, text)) for gold, text, _ in pairs]
            seconds = time.perf_counter() - start
            results[name] = {
                "accepted": sum(verdicts),
                "seconds": round(seconds, 3),
                "ms_per_pair": round(1000 * seconds / n, 3),
                "verdicts": verdicts,
            }
        a, b = results["old"]["verdicts"], results["math-verify"]["verdicts"]
        disagree = [
            {
                "index": i,
                "unique_id": r.get("unique_id"),
                "gold": gold,
                "boxed": old.extract_answer(text),
                "old": a[i],
                "math_verify": b[i],
            }
            for i, (gold, text, r) in enumerate(pairs)
            if a[i] != b[i]
        ]
        print(f"{set_name}: {n} MATH-500 pairs")
        for name, res in results.items():
            print(
                f"  {name:12s} accepts {res['accepted']}/{n}, {res['ms_per_pair']:.2f} ms per pair "
                f"({res['seconds']:.2f} s)"
            )
        print(f"  agreement    {n - len(disagree)}/{n} ({100 * (n - len(disagree)) / n:.1f}%)")
        for d in disagree:
            print(
                f"    [{d['index']}] {d['unique_id']}: gold {d['gold']!r}, boxed {d['boxed']!r}: "
                f"old {d['old']}, math-verify {d['math_verify']}"
            )
        out[set_name] = {
            "agreement": n - len(disagree),
            "disagreements": disagree,
            **{name: {k: v for k, v in res.items() if k != "verdicts"} for name, res in results.items()},
        }
    print(f"rewrites: {len(REWRITES)} hand-written pairs (gold | output | right verdict | old | math-verify)")
    rows, right = [], {"old": 0, "math-verify": 0}
    for gold, text, verdict in REWRITES:
        got = {name: bool(grade(gold, text)) for name, grade in graders.items()}
        for name in got:
            right[name] += got[name] == verdict
        rows.append(
            {"gold": gold, "output": text, "right": verdict, "old": got["old"], "math_verify": got["math-verify"]}
        )
        print(f"  {gold!r:22} {text!r:52} {verdict!s:5} {got['old']!s:5} {got['math-verify']}")
    print(f"  right verdicts: old {right['old']}/{len(REWRITES)}, math-verify {right['math-verify']}/{len(REWRITES)}")
    out["rewrites"] = {"pairs": rows, "right": right, "n": len(REWRITES)}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()

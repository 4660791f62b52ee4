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

    python bench/eval/math_graders.py ../shared/data/math/math500_test.jsonl [--json OUT.json]

The old grader is imported from a git revision when it is no longer in the tree
(``--old-rev``, default: the commit before the one that deleted it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OLD = "src/bridgecli/evaluation/math_grader.py"


def old_grader(rev: str | None):
    """The hand-written grader module: from the tree, else from ``rev`` (or the last commit having it)."""
    path = REPO / OLD
    if not path.exists():
        if rev is None:
            gone = subprocess.run(["git", "-C", str(REPO), "log", "-n", "1", "--diff-filter=D", "--format=%H", "--",
                                   OLD], capture_output=True, text=True, check=True).stdout.strip()
            rev = f"{gone}~1" if gone else "HEAD"
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{OLD}"], capture_output=True, text=True,
                              check=True).stdout
        path = Path(tempfile.mkdtemp()) / "math_grader.py"
        path.write_text(text)
    spec = importlib.util.spec_from_file_location("old_math_grader", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_math_grader"] = module
    spec.loader.exec_module(module)
    return module


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", help="MATH-500 JSONL (problem, solution, answer)")
    ap.add_argument("--json", help="write the numbers and the disagreements here")
    ap.add_argument("--old-rev", help="git revision to take the old grader from when it is gone")
    args = ap.parse_args()

    from bridgecli.evaluation import math_verify_grader as new

    old = old_grader(args.old_rev)
    records = [json.loads(line) for line in Path(args.data).read_text(encoding="utf-8").splitlines() if line.strip()]
    n = len(records)
    sets = {"positives": [(r["answer"], r["solution"], r) for r in records],
            "negatives": [(r["answer"], records[(i + 1) % n]["solution"], r) for i, r in enumerate(records)]}
    graders = {"old": lambda gold, text: old.is_equiv(old.extract_answer(text), gold),
               "math-verify": lambda gold, text: new.is_correct(text, gold)}
    out = {"n": n, "data": Path(args.data).name}
    for set_name, pairs in sets.items():
        results = {}
        for name, grade in graders.items():
            grade(*pairs[0][:2])  # imports and first-call set-up out of the timing
            start = time.perf_counter()
            verdicts = [bool(grade(gold, text)) for gold, text, _ in pairs]
            seconds = time.perf_counter() - start
            results[name] = {"accepted": sum(verdicts), "seconds": round(seconds, 3),
                             "ms_per_pair": round(1000 * seconds / n, 3), "verdicts": verdicts}
        a, b = results["old"]["verdicts"], results["math-verify"]["verdicts"]
        disagree = [{"index": i, "unique_id": r.get("unique_id"), "gold": gold, "boxed": old.extract_answer(text),
                     "old": a[i], "math_verify": b[i]}
                    for i, (gold, text, r) in enumerate(pairs) if a[i] != b[i]]
        print(f"{set_name}: {n} MATH-500 pairs")
        for name, res in results.items():
            print(f"  {name:12s} accepts {res['accepted']}/{n}, {res['ms_per_pair']:.2f} ms per pair "
                  f"({res['seconds']:.2f} s)")
        print(f"  agreement    {n - len(disagree)}/{n} ({100 * (n - len(disagree)) / n:.1f}%)")
        for d in disagree:
            print(f"    [{d['index']}] {d['unique_id']}: gold {d['gold']!r}, boxed {d['boxed']!r}: "
                  f"old {d['old']}, math-verify {d['math_verify']}")
        out[set_name] = {"agreement": n - len(disagree), "disagreements": disagree,
                         **{name: {k: v for k, v in res.items() if k != "verdicts"} for name, res in results.items()}}
    print(f"rewrites: {len(REWRITES)} hand-written pairs (gold | output | right verdict | old | math-verify)")
    rows, right = [], {"old": 0, "math-verify": 0}
    for gold, text, verdict in REWRITES:
        got = {name: bool(grade(gold, text)) for name, grade in graders.items()}
        for name in got:
            right[name] += got[name] == verdict
        rows.append({"gold": gold, "output": text, "right": verdict, "old": got["old"],
                     "math_verify": got["math-verify"]})
        print(f"  {gold!r:22} {text!r:52} {verdict!s:5} {got['old']!s:5} {got['math-verify']}")
    print(f"  right verdicts: old {right['old']}/{len(REWRITES)}, math-verify {right['math-verify']}/{len(REWRITES)}")
    out["rewrites"] = {"pairs": rows, "right": right, "n": len(REWRITES)}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")

if __name__ == "__main__":
    main()

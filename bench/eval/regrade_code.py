"""Grade a saved HumanEval result again with today's program builder: each record's completion becomes a
program as `bridge eval --task humaneval` builds it now and runs in the sandbox, with no model. For a grader
change (how the code is taken from a reply), the old and new pass@1 of the same completions side by side.

    python bench/eval/regrade_code.py DATA/humaneval/HumanEval.jsonl.gz RESULT.json [RESULT.json ...]
        [--timeout 10] [-o OUT.json]

Prints one line per result: pass@1 as recorded and as graded now, how many items changed each way, and the
statuses now; -o writes them (with each item's old and new outcome) as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from bridgecli.evaluation.code_tasks import humaneval_program, load_humaneval  # noqa: E402
from bridgecli.evaluation.sandbox import Limits, code_execution_mode, run_programs  # noqa: E402


def regrade(problems: list, result: dict, timeout: float) -> dict:
    by_id = {p.task_id: p for p in problems}
    chat = bool(result["summary"]["settings"].get("chat_template_used"))
    items = result["items"]
    programs = [humaneval_program(by_id[it["task_id"]], it["completion"], chat=chat) for it in items]
    outcomes = run_programs(programs, Limits(timeout=timeout), unsafe=code_execution_mode(True, False) == "unsafe")
    old = [bool(it["correct"]) for it in items]
    new = [o.passed for o in outcomes]
    return {
        "n": len(items),
        "chat": chat,
        "pass@1_recorded": sum(old) / len(items),
        "pass@1_now": sum(new) / len(items),
        "fixed": sum(n and not o for o, n in zip(old, new)),
        "broken": sum(o and not n for o, n in zip(old, new)),
        "statuses_now": dict(Counter(o.status for o in outcomes)),
        "items": [
            {"task_id": it["task_id"], "recorded": o, "now": n, "status_now": oc.status}
            for it, o, n, oc in zip(items, old, new, outcomes)
        ],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("results", type=Path, nargs="+")
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    problems = load_humaneval(args.data)
    out = {}
    for path in args.results:
        r = regrade(problems, json.loads(path.read_text()), args.timeout)
        out[str(path)] = r
        print(
            f"{path}: pass@1 {r['pass@1_recorded']:.3f} recorded, {r['pass@1_now']:.3f} now "
            f"({r['fixed']} fixed, {r['broken']} broken; now {r['statuses_now']})"
        )
    if args.output:
        args.output.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

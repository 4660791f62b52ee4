"""Every reference solution of HumanEval and MBPP through the code sandbox, as `bridge eval` builds
and runs them: how many pass (all must), and the seconds per program.

The canonical HumanEval solution is the model's completion in plain mode (prompt + body) and, in
chat mode, a reply holding the whole function; MBPP's reference code is the completion. Each
program runs in the sandbox as a real completion would (the program in one process, the test in
the checker's), with the default limits.

    python bench/eval/canonical.py DATA_DIR [--limit N] [--unsafe] [--json OUT]

DATA_DIR holds humaneval/HumanEval.jsonl.gz and mbpp/mbpp.jsonl. Needs a working bwrap, unless
``--unsafe`` (the unsafe runner).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from provenance import commit  # noqa: E402

from bridgecli.evaluation import code_tasks  # noqa: E402
from bridgecli.evaluation.sandbox import Limits, run_programs  # noqa: E402


def _programs(data: Path, limit: int | None) -> dict[str, list]:
    problems = code_tasks.load_humaneval(data / "humaneval" / "HumanEval.jsonl.gz")[:limit]
    tasks = code_tasks.load_mbpp(data / "mbpp" / "mbpp.jsonl")[:limit]
    return {
        "humaneval plain": [(p.task_id, code_tasks.humaneval_program(p, _canonical(p), chat=False)) for p in problems],
        "humaneval chat": [
            (p.task_id, code_tasks.humaneval_program(p, f"```python\n{p.prompt}{_canonical(p)}```", chat=True))
            for p in problems
        ],
        "mbpp": [(str(t.task_id), code_tasks.mbpp_program(t, t.code, chat=False)) for t in tasks],
    }


_CANONICAL: dict[str, str] = {}


def _canonical(problem) -> str:
    return _CANONICAL[problem.task_id]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", type=Path)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--unsafe", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import gzip

    with gzip.open(args.data / "humaneval" / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            _CANONICAL[row["task_id"]] = row["canonical_solution"]
    out: dict = {"commit": commit(), "command": "python bench/eval/canonical.py " + " ".join(sys.argv[1:]), "sets": {}}
    for name, items in _programs(args.data, args.limit).items():
        start = time.monotonic()
        outcomes = run_programs([program for _, program in items], Limits(), unsafe=args.unsafe)
        seconds = time.monotonic() - start
        failed = [(task, o.status, o.error) for (task, _), o in zip(items, outcomes) if not o.passed]
        out["sets"][name] = {
            "programs": len(items),
            "passed": len(items) - len(failed),
            "seconds": round(seconds, 1),
            "seconds_per_program": round(seconds / max(1, len(items)), 3),
            "failed": failed,
        }
        print(f"{name}: {len(items) - len(failed)} of {len(items)} passed in {seconds:.1f} s", flush=True)
        for task, status, error in failed:
            print(f"  {task}: {status}: {error}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    result = main()
    sys.exit(0 if all(not s["failed"] for s in result["sets"].values()) else 1)

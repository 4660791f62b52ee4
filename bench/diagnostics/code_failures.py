#!/usr/bin/env python3
"""How the trained rows' HumanEval programs fail (issue 39: what fine-tuning on GSM8K costs a code model).

    python bench/diagnostics/code_failures.py full=he-full.json.zst random-resp=he-random-resp.json.zst ... \\
        [--json OUT.json] [--md OUT.md]

Each ``NAME=FILE`` is the result file of ``bridge eval --task humaneval -o FILE`` (its ``items`` hold every
completion, its status and its error), plain or zstd-compressed (``.zst``). Each failed program goes to the
first of these that it fits:

- ``#### reply``: the completion has a GSM8K final-answer line (``#### 42``): the model answered the code
  prompt the way it was fine-tuned to answer a word problem;
- ``prose``: no line of it reads as Python (no ``def``, ``return``, ``import``, ``for``/``if``/``while``, an
  assignment or a call at the start of a line): an explanation, or the prompt's docstring echoed;
- ``broken code``: code that does not compile (``SyntaxError``, ``IndentationError``);
- ``wrong``: code that runs and fails a test (``AssertionError``);
- ``error``: any other exception, a timeout or a sandbox limit.

A heuristic reading of the completions (the line test above), not a grader: the pass/fail verdicts are the
sandbox's. ``#### line`` counts every completion with a final-answer line, passed ones too (a ``####`` line
is a comment in Python). Pure reading of files: no model, seconds.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import diag_common  # noqa: E402
import provenance  # noqa: E402

KINDS = ("#### reply", "prose", "broken code", "wrong", "error")
_FINAL = re.compile(r"^\s*####\s*-?\$?\s*-?[\d,.]+", re.MULTILINE)
_CODE = re.compile(
    r"^\s*(?:def |return\b|import |from \S+ import |for |while |if |elif |else:|try:|except\b|with |class |yield\b"
    r"|[A-Za-z_][\w.]*(?:\[[^\]\n]*\])?(?:\s*,\s*[A-Za-z_][\w.]*)*\s*[-+*/%]?=[^=]|[A-Za-z_][\w.]*\()",
    re.MULTILINE,
)


def kind(item: dict) -> str | None:
    """The failure kind of one HumanEval item (None: it passed)."""
    if item.get("correct"):
        return None
    text = item.get("completion") or ""
    error = item.get("error") or ""
    if _FINAL.search(text):
        return "#### reply"
    if not _CODE.search(text):
        return "prose"
    if error.startswith(("SyntaxError", "IndentationError", "TabError")):
        return "broken code"
    if error.startswith("AssertionError") and item.get("status") == "failed":
        return "wrong"
    return "error"


def row(items: list[dict]) -> dict:
    """One row's counts over its items."""
    kinds = Counter(kind(it) for it in items)
    return {
        "n": len(items),
        "passed": kinds.pop(None, 0),
        **{k: kinds.get(k, 0) for k in KINDS},
        "final_line": sum(bool(_FINAL.search(it.get("completion") or "")) for it in items),
    }


def read_items(path: Path) -> list[dict]:
    items = diag_common.eval_items(path)
    if not items or "completion" not in items[0]:
        raise SystemExit(f"code_failures.py: error: {path}: no completions in 'items' (a humaneval eval result?)")
    return items


def markdown(result: dict) -> str:
    lines = [
        *provenance.heading("How the HumanEval programs fail (code_failures.py)", result["header"]),
        "| row | n | passed | " + " | ".join(f"failed: {k}" for k in KINDS) + " | `####` line, any |",
        "|---|---|---|" + "---|" * len(KINDS) + "---|",
    ]
    for name, r in result["rows"].items():
        lines.append(
            f"| {name} | {r['n']} | {r['passed']} | " + " | ".join(str(r[k]) for k in KINDS) + f" | {r['final_line']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = provenance.named_files_parser(__doc__, "rows")
    args = ap.parse_args(argv)
    rows = {name: row(read_items(path)) for name, path in provenance.named_files(ap, args.rows).items()}
    result: dict = {"header": provenance.header("cpu"), "rows": rows}
    provenance.report(markdown(result), result, args.out, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

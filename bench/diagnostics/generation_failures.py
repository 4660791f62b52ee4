#!/usr/bin/env python3
"""How the trained rows' GSM8K answers fail (issue 28, item 2): runaway generations and numbers that are
not in the question.

    python bench/diagnostics/generation_failures.py full=acc-full.json random=acc-random.json.zst ... \\
        [--reference gsm8k/test.jsonl] [--json OUT.json] [--md OUT.md]

Each ``NAME=FILE`` is the result file of ``bridge eval --task gsm8k -o FILE`` (its ``items`` hold every
prediction), plain or zstd-compressed (``.zst``). Per row:

- ``hit limit``: answers that ran into ``--max-new-tokens`` (a model that did not learn to stop), and the
  accuracy of the others;
- ``####``: the share of answers with a GSM8K final-answer line;
- ``first calc foreign``: of the operands of each answer's first ``<<a op b=c>>`` calculation, the share
  that is not a number of the question (written another way or not there at all: a model that lost track
  of the question, or a constant such as 2 for "half");
- ``calcs foreign``: the same over every calculation, where an earlier calculation's result counts as
  known.

``--reference`` computes the two operand shares on the reference solutions of a GSM8K file (its
``question``/``answer`` records): what the data itself has of constants and numbers written another way.
Pure reading of files: no model, seconds.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import diag_common  # noqa: E402
import provenance  # noqa: E402

_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_CALC = re.compile(r"<<([^=>]*)=([^>]*)>>")


def numbers(text: str) -> list[str]:
    """The numbers of ``text``, thousands separators dropped and leading zeros stripped."""
    return [n.lstrip("0") or "0" for n in _NUMBER.findall(text.replace(",", ""))]


def foreign_operands(question: str, solution: str) -> tuple[int, int, int, int]:
    """(first calculation's operands not in the question, its operands, every calculation's operands in
    neither the question nor an earlier result, every calculation's operands)."""
    known = set(numbers(question))
    first_foreign = first_all = every_foreign = every_all = 0
    for i, m in enumerate(_CALC.finditer(solution)):
        operands = numbers(m.group(1))
        if i == 0:
            first_all = len(operands)
            first_foreign = sum(v not in known for v in operands)
        every_all += len(operands)
        every_foreign += sum(v not in known for v in operands)
        known.update(numbers(m.group(2)))
    return first_foreign, first_all, every_foreign, every_all


def _share(a: int, b: int) -> float | None:
    return a / b if b else None


def operand_shares(pairs) -> dict:
    """The two foreign-operand shares over (question, solution) pairs."""
    sums = [0, 0, 0, 0]
    for question, solution in pairs:
        sums = [s + v for s, v in zip(sums, foreign_operands(question, solution))]
    return {
        "first_calc_foreign": _share(sums[0], sums[1]),
        "first_calc_operands": sums[1],
        "calcs_foreign": _share(sums[2], sums[3]),
        "calc_operands": sums[3],
    }


def row(items: list[dict]) -> dict:
    """One row's measures over its eval items."""
    stopped = [it for it in items if not it["hit_limit"]]
    return {
        "n": len(items),
        "accuracy": sum(bool(it["correct"]) for it in items) / len(items),
        "hit_limit": sum(bool(it["hit_limit"]) for it in items),
        "accuracy_stopped": _share(sum(bool(it["correct"]) for it in stopped), len(stopped)),
        "final_line": sum("####" in it["prediction"] for it in items) / len(items),
        "mean_new_tokens": sum(it["new_tokens"] for it in items) / len(items),
        **operand_shares((it["question"], it["prediction"]) for it in items),
    }


def read_items(path: Path) -> list[dict]:
    items = diag_common.eval_items(path)
    if not items or "prediction" not in items[0]:
        raise SystemExit(f"generation_failures.py: error: {path}: no predictions in 'items' (a gsm8k eval result?)")
    return items


def _fmt(v, pct: bool = True) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:,.0f}"


def markdown(result: dict) -> str:
    lines = [
        *provenance.heading("How the GSM8K answers fail (generation_failures.py)", result["header"]),
        "| row | n | accuracy | hit limit | accuracy of the others | `####` line | mean new tokens "
        "| first calc: operands not in the question | all calcs: operands in neither question nor earlier result |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["rows"].items():
        lines.append(
            f"| {name} | {r['n']} | {_fmt(r['accuracy'])} | {r['hit_limit']} | {_fmt(r['accuracy_stopped'])} "
            f"| {_fmt(r['final_line'])} | {_fmt(r['mean_new_tokens'], pct=False)} "
            f"| {_fmt(r['first_calc_foreign'])} of {r['first_calc_operands']:,} "
            f"| {_fmt(r['calcs_foreign'])} of {r['calc_operands']:,} |"
        )
    ref = result.get("reference")
    if ref:
        lines.append(
            f"| reference solutions | {ref['n']} | | | | | | {_fmt(ref['first_calc_foreign'])} of "
            f"{ref['first_calc_operands']:,} | {_fmt(ref['calcs_foreign'])} of {ref['calc_operands']:,} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = provenance.named_files_parser(__doc__, "rows")
    ap.add_argument("--reference", type=Path, help="a GSM8K file (question/answer records): its solutions' shares")
    args = ap.parse_args(argv)
    rows = {name: row(read_items(path)) for name, path in provenance.named_files(ap, args.rows).items()}
    result: dict = {"header": provenance.header("cpu"), "rows": rows}
    if args.reference:
        recs = [json.loads(line) for line in args.reference.read_text(encoding="utf-8").splitlines() if line.strip()]
        result["reference"] = {"n": len(recs), **operand_shares((r["question"], r["answer"]) for r in recs)}
    provenance.report(markdown(result), result, args.out, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Which of a question's numbers does a selection's prompt side leave the model to see? (issue 28, item 2)

    python bench/diagnostics/prompt_numbers.py random:0.5=random-0.5.bridge bridge:0.5=closed-0.5.bridge \\
        [--json OUT.json] [--md OUT.md]

Each ``NAME=FILE`` is a selected (or closed) stream. Training on a selection shows the model the kept
prompt tokens and asks it for the response; where the response computes with a number of the question
whose tokens were dropped, it is taught to write a number it cannot see. Per stream:

- ``numbers kept whole``: of the numbers written in the prompts (digit runs, with a decimal point or
  thousands separators), the share whose every token is kept, and the share with none kept;
- ``digits kept``: the share of the prompts' digit characters that lie in kept tokens;
- ``calc operands visible``: of the operands of the responses' ``<<a op b=c>>`` calculations that are
  numbers of the question, the share kept whole in the prompt the model trains on.

A stream with every prompt token kept (full SFT, ``--rho-p 1``) gives 1.0 for all three. Pure reading
of streams: no model, seconds.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
import provenance  # noqa: E402

from bridgecli.errors import FormatError  # noqa: E402
from bridgecli.format.reader import open_reader  # noqa: E402

_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_CALC = re.compile(r"<<([^=>]*)=")


def _value(text: str) -> str:
    return text.replace(",", "").lstrip("0") or "0"


def prompt_numbers(text: str, spans: np.ndarray, prompt_pos: np.ndarray, kept: set[int]) -> list[tuple[str, int, int]]:
    """(value, tokens, kept tokens) for every number written in the prompt (the characters of the prompt
    tokens at ``prompt_pos``; ``spans`` [tokens, 2] character offsets)."""
    if not len(prompt_pos):
        return []
    lo, hi = int(spans[prompt_pos, 0].min()), int(spans[prompt_pos, 1].max())
    out = []
    for m in _NUMBER.finditer(text, lo, hi):
        s, e = m.span()
        inside = [int(p) for p in prompt_pos if spans[p, 0] < e and spans[p, 1] > s]
        if inside:
            out.append((_value(m.group(0).rstrip(",")), len(inside), sum(p in kept for p in inside)))
    return out


def measure(path: Path) -> dict:
    whole = none = count = 0
    digits = digits_kept = 0
    operands = operands_visible = 0
    with open_reader(str(path)) as reader:
        for ex in reader:
            if ex.selection is None:
                raise SystemExit(f"prompt_numbers.py: error: {path}: record {ex.id!r} has no selection")
            spans = ex.tokens.spans()
            prompt = ex.tokens.prompt_positions()
            kept = set(int(p) for p in ex.selection.prompt_keep)
            nums = prompt_numbers(ex.text, spans, prompt, kept)
            for _, n, k in nums:
                count += 1
                whole += k == n
                none += k == 0
            for p in prompt:
                s, e = spans[p]
                d = sum(c.isdigit() for c in ex.text[s:e])
                digits += d
                digits_kept += d if int(p) in kept else 0
            visible = {v for v, n, k in nums if k == n}
            in_question = {v for v, _, _ in nums}
            resp = ex.tokens.response_positions()
            if len(resp):
                rs, re_ = int(spans[resp, 0].min()), int(spans[resp, 1].max())
                for m in _CALC.finditer(ex.text, rs, re_):
                    for v in (_value(x) for x in re.findall(r"\d+(?:\.\d+)?", m.group(1))):
                        if v in in_question:
                            operands += 1
                            operands_visible += v in visible
    return {
        "numbers": count,
        "numbers_kept_whole": whole / count if count else None,
        "numbers_none_kept": none / count if count else None,
        "prompt_digits": digits,
        "digits_kept": digits_kept / digits if digits else None,
        "calc_operands_from_question": operands,
        "calc_operands_visible": operands_visible / operands if operands else None,
    }


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = provenance.named_files_parser(__doc__, "streams")
    args = ap.parse_args(argv)
    rows = {}
    for name, path in provenance.named_files(ap, args.streams).items():
        try:
            rows[name] = measure(path)
        except FormatError as e:
            ap.exit(1, f"prompt_numbers.py: error: {e}\n")
    result = {"header": provenance.header("cpu"), "rows": rows}
    lines = [
        *provenance.heading(
            "Which of the question's numbers the prompt side keeps (prompt_numbers.py)", result["header"]
        ),
        "| stream | numbers in the prompts | kept whole | none of their tokens kept | prompt digits kept "
        "| calc operands from the question | of them visible |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['numbers']:,} | {_pct(r['numbers_kept_whole'])} | {_pct(r['numbers_none_kept'])} "
            f"| {_pct(r['digits_kept'])} | {r['calc_operands_from_question']:,} | {_pct(r['calc_operands_visible'])} |"
        )
    provenance.report("\n".join(lines) + "\n", result, args.out, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

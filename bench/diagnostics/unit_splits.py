"""Count closure unit boundaries that fall inside a word, a number or a ``<<...>>`` calculation.

    python bench/diagnostics/unit_splits.py closed.bridge [more.bridge ...]

For every closure stream: the units, the boundaries between consecutive units where one word /
number / calculation (``bridgecli.core.closure.atoms``, on the response text) has characters in the
last token of one unit and the first token of the next, and how many of those separate a chosen unit
from a dropped one (what a reader sees as "hamb[[urger]]"), with up to three examples.
"""

from __future__ import annotations

import sys

import numpy as np

from bridgecli.core.closure import atoms
from bridgecli.format.reader import open_reader


def count(path: str) -> dict:
    out = {"file": path, "examples": 0, "units": 0, "cut": 0, "cut_chosen_dropped": 0, "examples_cut": []}
    with open_reader(path) as reader:
        for ex in reader:
            if ex.closure is None:
                raise SystemExit(f"{path}: example {ex.index} has no closure: run `bridge close` first")
            out["examples"] += 1
            spans = ex.tokens.spans()
            units = np.asarray(ex.closure.units, dtype=np.int64).reshape(-1, 2)
            out["units"] += len(units)
            resp = ex.tokens.response_positions()
            if len(resp) == 0:
                continue
            lo = int(spans[resp[0], 0])
            text = ex.text[lo : int(spans[resp[-1], 1])]
            pieces = atoms(text)
            chosen = set(ex.closure.chosen)
            for k in range(len(units) - 1):
                a, b = spans[units[k, 1] - 1] - lo, spans[units[k + 1, 0]] - lo
                if any(min(a[1], e) > max(a[0], s) and min(b[1], e) > max(b[0], s) for s, e in pieces):
                    out["cut"] += 1
                    if (k in chosen) != (k + 1 in chosen):
                        out["cut_chosen_dropped"] += 1
                        if len(out["examples_cut"]) < 3:
                            out["examples_cut"].append(text[a[0] : b[1]])
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for path in argv:
        r = count(path)
        print(
            f"{r['file']}: {r['examples']} examples, {r['units']} units, {r['cut']} unit boundaries inside a "
            f"word/number/<<...>>, {r['cut_chosen_dropped']} between a chosen and a dropped unit "
            f"(e.g. {r['examples_cut']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

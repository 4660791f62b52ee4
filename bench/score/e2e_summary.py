"""One line per process of e2e.py reports: ``python bench/score/e2e_summary.py OUTDIR NAME...`` reads
OUTDIR/NAME.json for each NAME (the side-by-side scripts of this folder write them) and prints, for
every shape and run, the process seconds, the ratio to the forward process, the first window, the
tokens/s after it and of the whole loop, when the model was loaded, and the gap between the first
window being tokenised and the first batch being queued, and when the tokenising process was ready
and took over."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def lines(out: Path, names: list[str]) -> list[str]:
    res = []
    for name in names:
        f = out / f"{name}.json"
        if not f.exists():
            res.append(f"{name}: no result")
            continue
        for row in json.loads(f.read_text()):
            for k in ("forward", "score_first", "score_second"):
                if k not in row:
                    continue
                d = row[k]
                t = d.get("timings", {})
                gap = (
                    t["first batch queued"] - t["first window read and tokenised"]
                    if "first batch queued" in t
                    else None
                )
                handed = next(
                    (k.rsplit(" ", 1)[1] for k in t if k.startswith("tokenising handed over at record")), None
                )
                res.append(
                    f"{row['shape']} {name:11s} {k:12s} process {d.get('process_s')} s ratio {d.get('ratio_to_forward')} "
                    f"first window {d.get('first_window_s')} after {d.get('after_first_tokens_per_s')} "
                    f"loop {d.get('loop_tokens_per_s')} loaded {t.get('model loaded')} "
                    f"queue gap {None if gap is None else round(gap, 2)} "
                    f"child tokenizer loaded {t.get('tokenising process: tokenizer loaded')} handover at record {handed}"
                )
    return res


if __name__ == "__main__":
    print("\n".join(lines(Path(sys.argv[1]), sys.argv[2:])))

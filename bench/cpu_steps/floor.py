"""What one example costs each step before and after its own work: CPU time (``time.process_time``) per
example of reading a stream (zstd decompression, record CRC, framing), msgpack decoding, validation,
encoding and compressing the output (zstd level 6, frames of 64, as the writer does), and of each step's
per-example function; in this process, on the first ``-n`` records of the three streams.

    python bench/cpu_steps/floor.py --out /tmp/cpu_steps -n 2000 [--src /tmp/before/src] [--json results/floor.json]

``--out`` holds scores.bridge and the select and close outputs (bench_steps.py ``run`` writes
selected.bridge and closed.bridge there).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# --src PATH: another checkout's code (e.g. main's, to compare); this checkout's by default
SRC = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv else str(ROOT / "src")
sys.path.insert(0, SRC)


def per_example(fn, items, repeat: int = 3) -> float:
    """Microseconds of CPU per item, the best of ``repeat`` passes."""
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        for x in items:
            fn(x)
        best = min(best, time.process_time() - t)
    return round(best / len(items) * 1e6, 1)


def main(argv=None) -> dict:
    from bridgecli.format.reader import StreamReader, decode_example
    from bridgecli.format.validate import check_example
    from bridgecli.format.writer import compress_frame, encode_record
    from bridgecli.registry import get
    from bridgecli.steps.close import close_example
    from bridgecli.steps.compact import _jsonl, columns_of
    from bridgecli.steps.select import select_example
    from bridgecli.training.rows import compact_row

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--json")
    ap.add_argument("--src", help="the src/ folder whose code to time (default: this checkout's)")
    a = ap.parse_args(argv)
    os.environ["BRIDGE_NO_PROGRESS"] = "1"
    selector, segmenter = get("selector", "bridge").obj, get("segmenter", "math").obj
    # compact passes row=True (its rows hold ints only) where _jsonl takes it (not in older checkouts)
    as_row = {"row": True} if "row" in inspect.signature(_jsonl).parameters else {}
    work = {
        "select": (
            "scores.bridge",
            "scores",
            lambda ex: select_example(ex, selector, "bridge", 0.75, 0.75, {"rounds": 4}),
        ),
        "close": ("selected.bridge", "selection", lambda ex: close_example(ex, segmenter, "math", 0.0)),
        "compact": (
            "closed.bridge",
            "closure",
            lambda ex: _jsonl(
                columns_of(compact_row(ex.id, ex.tokens, ex.selection.prompt_keep, ex.closure.supervise), "trl", "x"),
                **as_row,
            ),
        ),
    }
    res: dict = {"examples": a.n, "src": SRC, "load_before": os.getloadavg(), "us_per_example": {}}
    for step, (name, stage, fn) in work.items():
        path = a.out / name

        def read(_, path=path):
            with open(path, "rb") as fh:
                for _ in zip(range(a.n), StreamReader(fh, validate=False).payloads()):
                    pass

        with open(path, "rb") as fh:
            payloads = [p for _, p in zip(range(a.n), StreamReader(fh, validate=False).payloads())]
        n = len(payloads)
        t = min(_timed(read) for _ in range(3))
        row = {
            "read (decompress, CRC, framing)": round(t / n * 1e6, 1),
            "msgpack decode": per_example(lambda p: decode_example(p, name, 0), payloads),
        }
        examples = [decode_example(p, name, 0) for p in payloads]
        row["validation"] = per_example(lambda ex: check_example(ex, stage), examples)
        row[f"{step}'s own work"] = per_example(fn, examples)
        if step != "compact":
            outs = [fn(ex) for ex in examples]
            row["msgpack encode"] = per_example(encode_record, outs)
            encoded = [encode_record(ex) for ex in outs]
            frames = [encoded[i : i + 64] for i in range(0, n, 64)]
            row["zstd level 6 compression"] = round(
                min(_timed(lambda _: [compress_frame(f) for f in frames]) for _ in range(3)) / n * 1e6, 1
            )
            row["output bytes per example"] = round(sum(len(compress_frame(f)) for f in frames) / n)
        row["total"] = round(sum(v for k, v in row.items() if k != "output bytes per example"), 1)
        res["us_per_example"][step] = row
        print(step, json.dumps(row), flush=True)
    res["load_after"] = os.getloadavg()
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2) + "\n")
    return res


def _timed(fn) -> float:
    t = time.process_time()
    fn(None)
    return time.process_time() - t


if __name__ == "__main__":
    main()

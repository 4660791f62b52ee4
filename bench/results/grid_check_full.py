"""Check that a compacted file is full SFT: each row equals standard SFT on its example (every
prompt token kept, every response token and the EOS supervised). Called by grid.sh for ``full``.

    grid_check_full.py SELECTED.bridge TRAIN.jsonl
"""

from __future__ import annotations

import json
import sys

from bridgecli.format.reader import open_reader
from bridgecli.training.rows import full_response_row


def main(stream: str, rows_path: str) -> int:
    with open(rows_path, encoding="utf-8") as f:
        rows = {r["id"]: r for r in map(json.loads, f)}
    n = 0
    with open_reader(stream) as reader:
        for ex in reader:
            want = full_response_row(ex.id, ex.tokens)
            got = rows.get(ex.id)
            if got is None or got["input_ids"] != want.input_ids or got["labels"] != want.labels:
                print(
                    f"grid_check_full.py: error: {rows_path}: row {ex.id!r} is not full SFT "
                    "(prompt tokens dropped or response tokens unsupervised)",
                    file=sys.stderr,
                )
                return 1
            n += 1
    if n != len(rows):
        print(f"grid_check_full.py: error: {rows_path}: {len(rows)} rows for {n} examples", file=sys.stderr)
        return 1
    print(f"full SFT checked: {n} rows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))

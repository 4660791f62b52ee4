"""Phase times of a command on stderr, when ``BRIDGE_TIMINGS`` is set: where a slow start goes.

``BRIDGE_TIMINGS=1 bridge score data.jsonl -o s.bridge`` prints lines such as
``bridge: timing: model loaded at 9.41 s`` (seconds since bridgecli was imported), which
bench/score/e2e.py reads back. Off (the default), a mark costs one environment lookup.
"""

from __future__ import annotations

import os
import sys
import time

#: when bridgecli was first imported, on the wall clock (the interpreter's own start comes a few tens
#: of ms before); a child process of the command (the tokenising process) is given it in
#: ``BRIDGE_TIMINGS_ORIGIN`` so that its marks read on the parent's time axis
ORIGIN = float(os.environ.get("BRIDGE_TIMINGS_ORIGIN") or time.time())


def mark(label: str) -> None:
    if os.environ.get("BRIDGE_TIMINGS"):
        print(f"bridge: timing: {label} at {time.time() - ORIGIN:.2f} s", file=sys.stderr, flush=True)

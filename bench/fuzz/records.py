"""Fuzz the stream readers with crafted records: 10,000 cases by default, and the counts recorded.

The cases live in tests/fuzz_cases.py, which the test suite drives from hypothesis: a consistent stream
made by the real steps, broken in one field of one record in a way that keeps every type right (NaN,
infinities and values beyond the format's bounds in every float field included), or followed by bytes
after its end record; ``select`` (BRIDGE, and a compared method when the stream has references),
``close`` and ``compact`` run on it in this process and must each end in exit 3 with nothing written.
Every tenth case is instead a consistent stream whose scores and references sit at the format's bound
(+-2^48): ``select`` with every selector, ``close`` and ``compact`` must succeed, and what they write must
read back (finite, within range).

    python bench/fuzz/records.py                 # 10,000 cases, seeds 0-9999
    python bench/fuzz/records.py --cases 500 --seed 7 -o bench/fuzz/results/records.json

The summary (counts per mutation and per outcome, tracebacks, exit 0 on a broken stream, the first
failures) is printed and, with ``-o``, written as JSON with the commit, the date and the command.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # the cases are the test suite's (tests/fuzz_cases.py)
import fuzz_cases  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from provenance import finish, stamp  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0, help="first seed; case k uses seed + k")
    parser.add_argument("-o", "--output", type=Path, help="write the summary as JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("BRIDGE_NO_PROGRESS", "1")
    run = stamp("bench/fuzz/records.py", argv)  # the code as the run starts
    with tempfile.TemporaryDirectory(prefix="bridge-fuzz-") as tmp:
        summary = fuzz_cases.run(args.cases, args.seed, Path(tmp))
    summary = {**run, **summary}
    line = (
        f"{args.cases} cases ({summary['command_runs']} command runs over {summary['mutations']} mutations and "
        f"the extreme valid streams) in {summary['seconds']} s: {summary['outcomes']}, "
        f"{summary['tracebacks']} tracebacks, {summary['exit_0_on_a_broken_stream']} exit 0 on a broken stream, "
        f"{summary['failures']} cases not as they must end"
    )
    return finish(line, summary["first_failures"], summary, args.output)


if __name__ == "__main__":
    sys.exit(1 if main()["failures"] else 0)

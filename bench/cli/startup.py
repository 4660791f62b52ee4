#!/usr/bin/env python3
"""What `bridge --version` and `bridge --help` cost to start: wall time (median of --repeats fresh
processes, `python -m bridgecli ...` with this checkout's src/, or --src, first on the path) and the package modules
each imports (`python -X importtime`), against a bare `python -c pass` on the same machine. Targets
(issue 42): at most 0.3 s and at most 25 of the package's modules. A timing is only valid on a quiet
machine: the one-minute load average is recorded beside it.

    PYTHONPATH=$PWD/src python bench/cli/startup.py --out bench/cli/results/startup_2core.json
    python bench/cli/startup.py --src /tmp/before/src          # another checkout's code, for a comparison
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from provenance import commit, result_parser, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CASES = {"--version": ["-m", "bridgecli", "--version"], "--help": ["-m", "bridgecli", "--help"]}


SRC = [str(ROOT / "src")]


def env() -> dict[str, str]:
    """The code measured (``SRC``) alone first on the path, a fixed terminal width, no colour."""
    return dict(os.environ, COLUMNS="100", NO_COLOR="1", PYTHONPATH=SRC[0])


def wall(argv: list[str], repeats: int) -> list[float]:
    """Seconds of ``repeats`` fresh processes of ``python ARGV`` (after one unmeasured run)."""
    times = []
    for k in range(repeats + 1):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, *argv], env=env(), stdout=subprocess.DEVNULL, check=True)
        if k:
            times.append(time.perf_counter() - t0)
    return times


def package_modules(argv: list[str]) -> list[str]:
    """The package's modules that ``python ARGV`` imports (``-X importtime``), ``__main__`` counted."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv], env=env(), capture_output=True, text=True)
    names = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    found = sorted(n for n in names if n == "bridgecli" or n.startswith("bridgecli."))
    return found + (["bridgecli.__main__"] if argv[:2] == ["-m", "bridgecli"] else [])


def main() -> None:
    ap = result_parser(__doc__ or "", None)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--src", default=SRC[0], help="the package's source folder to measure (default: this checkout's)")
    args = ap.parse_args()
    SRC[0] = str(Path(args.src).resolve())
    result: dict = {
        "commit": commit() or "unknown",
        "src": "this checkout" if SRC[0] == str(ROOT / "src") else args.src,
        "command": " ".join(["python", *sys.argv]),
        "cpus": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "baseline_python_c_pass_s": statistics.median(wall(["-c", "pass"], args.repeats)),
        "cases": {},
    }
    for name, argv in CASES.items():
        times = wall(argv, args.repeats)
        modules = package_modules(argv)
        result["cases"][name] = {
            "median_s": round(statistics.median(times), 4),
            "min_s": round(min(times), 4),
            "max_s": round(max(times), 4),
            "package_modules": len(modules),
            "modules": modules,
        }
        print(
            f"bridge {name}: median {statistics.median(times):.3f} s (min {min(times):.3f}, max {max(times):.3f}), "
            f"{len(modules)} package modules"
        )
    result["load_average_1min_after"] = os.getloadavg()[0]
    print(
        f"python -c pass: {result['baseline_python_c_pass_s']:.3f} s; load average {result['load_average_1min']:.2f}"
        f" -> {result['load_average_1min_after']:.2f} on {result['cpus']} cores"
    )
    write_json(args.out, result)


if __name__ == "__main__":
    main()

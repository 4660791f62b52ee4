"""A step run as a user runs it (a ``python -m bridgecli`` process), measured: its wall time, CPU time
(user + system, its worker processes included: they are reaped by it) and peak RSS. Shared by
bench_steps.py, compare.py and scaling.py; standard library only."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def step_env(src: Path) -> dict:
    """The environment a step runs in: ``src`` first on the path, then whatever the caller's PYTHONPATH
    holds (e.g. carried wheels on a lent machine); progress as a user gets it (stderr is a pipe: no bar)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")])))
    env.pop("BRIDGE_NO_PROGRESS", None)
    return env


def run_measured(cmd: list[str], env: dict) -> dict:
    """Run ``cmd`` (its output discarded) and return ``wall_s``, ``cpu_s`` and ``peak_rss_mb``; exit with
    the command and its stderr if it fails."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    code = os.waitstatus_to_exitcode(status)
    if code:
        raise SystemExit(f"{' '.join(cmd)} failed ({code}):\n{err}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024}


def rounded(cost: dict) -> dict:
    """:func:`run_measured`'s figures to the ms and the tenth of a MiB, as the results files keep them."""
    return {
        "wall_s": round(cost["wall_s"], 3),
        "cpu_s": round(cost["cpu_s"], 3),
        "peak_rss_mb": round(cost["peak_rss_mb"], 1),
    }

"""The sandbox supervisor's last step (bridgecli.evaluation.sandbox_supervisor.kill_descendants): a descendant
that its scan did not see, as when bwrap forks its sandbox's first process at the moment it is stopped (the
stop takes effect after the fork; the child, its parent killed, is reparented to the supervisor), is still
killed and reaped, so the supervisor ends instead of waiting on it for ever (a killed evaluator's test in
tests/test_sandbox.py caught it leaving both behind, 2026-11-29)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# In a process of its own, a child subreaper as the supervisor is: a child sleeping for a minute, a first
# scan that misses it (the race), then kill_descendants; prints how the child ended.
_SCRIPT = r"""
import ctypes, os, signal, sys, time
from bridgecli.evaluation import sandbox_supervisor as sup
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
real, calls = sup.descendants, []
def racy(pid):
    calls.append(pid)
    return [] if len(calls) == 1 else real(pid)
sup.descendants = racy
t0 = time.monotonic()
sup.kill_descendants()
try:
    os.kill(child, 0)
    alive = True
except ProcessLookupError:
    alive = False
print("scans", len(calls), "alive", alive, "seconds", round(time.monotonic() - t0, 2))
"""


@pytest.mark.integration  # runs a process that forks
def test_a_descendant_the_scan_missed_is_killed_and_reaped():
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[words.index("alive") + 1] == "False"  # killed and reaped: no such process
    assert int(words[words.index("scans") + 1]) >= 2  # a second round found it
    assert float(words[words.index("seconds") + 1]) < 5

"""Probes of the code sandbox that tests/test_sandbox.py asserts on and bench/eval/sandbox_limits.py
counts (it imports this file by path): the processes a program left running, found by a marker in
their command line, and a program that fills the box's tmpfs folders. Standard library and the
``bridgecli`` on the path only."""

from __future__ import annotations

import os
import textwrap
import time
import uuid
from collections.abc import Sequence

from bridgecli.evaluation.sandbox import Limits, run_program


def marked(marker: str) -> list[int]:
    """Host processes whose command line holds ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


def short_timeout_runs(timeouts: Sequence[float], *, unsafe: bool, settle: float) -> tuple[int, int]:
    """One program per value in ``timeouts``, each execing a marked ``sleep`` and run with that
    ``--code-timeout``; ``settle`` seconds later, how many marked processes were left running
    (they are then killed) and how many runs ended in a timeout."""
    marker = f"bridge-short-{uuid.uuid4().hex}"
    program = f"import os\nos.execv('/bin/sleep', [{marker!r}, '30'])\n"
    statuses = [run_program(program, Limits(timeout=t), unsafe=unsafe).status for t in timeouts]
    time.sleep(settle)
    left = marked(marker)
    for pid in left:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    return len(left), statuses.count("timeout")


def tmpfs_filler(files: int) -> str:
    """A program that writes ``files`` files of 15 MiB into each tmpfs folder of the box (/work, /tmp
    and /dev/shm), each folder until it is full."""
    return textwrap.dedent(f"""
        for folder in ("/work", "/tmp", "/dev/shm"):
            try:
                for n in range({files}):
                    with open(f"{{folder}}/fill{{n}}", "wb") as fh:
                        for _ in range(15):
                            fh.write(b"x" * (1 << 20))
            except OSError:  # full
                pass
    """)

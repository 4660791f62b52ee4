"""The Python programs the code sandbox (:mod:`.sandbox`) starts, as the ``-c`` text of an
interpreter: the runner inside the bubblewrap box and the unsafe runner (both
:mod:`.sandbox_runner`: a checker process and the program's process), the supervisor between the
evaluator and each sandbox (:mod:`.sandbox_supervisor`), and the probe that checks a box works.
The program under test is never part of them (the runners read it from a file, the test from a
pipe)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def _text(name: str) -> str:
    return (_HERE / name).read_text(encoding="utf-8")


def runner_code(entry: str) -> str:
    """The runner (:mod:`.sandbox_runner`) with a call of ``entry`` on the command line's arguments:
    ``box_main`` (in the bwrap box) or ``unsafe_main``."""
    return _text("sandbox_runner.py") + f"\n{entry}(sys.argv[1:])\n"


def supervisor_code() -> str:
    """The supervisor (:mod:`.sandbox_supervisor`); it calls its ``main`` itself."""
    return _text("sandbox_supervisor.py")


# What the probe prints from inside a box: the interpreter's version, the uid it runs as, a string
# hash (PYTHONHASHSEED honoured) and whether memfd_create is refused (the seccomp filter holds).
PROBE = """import sys, os
try:
    os.close(os.memfd_create("probe"))
    memfd = "open"
except (AttributeError, OSError):
    memfd = "refused"
print(sys.version.split()[0], os.getuid(), hash('bridge'), memfd)
"""


def hash_seed() -> str:
    """The PYTHONHASHSEED a program runs with: the evaluator's when it is a number the interpreter
    accepts, else 0."""
    value = os.environ.get("PYTHONHASHSEED", "").strip()
    return value if value.isdigit() and int(value) <= 4294967295 else "0"

"""The damage-control runner of the code sandbox (:mod:`.sandbox`), used only with
``--unsafe-code-execution`` where bubblewrap is not available: a separate interpreter with rlimits,
``unshare`` PID and network namespaces where they work, and a Python-level guard in the program's
process (:func:`.sandbox_runner.unsafe_main`). Not a security boundary (see docs/security.md)."""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import containment
from .sandbox_outcome import Limits, Outcome, Program, classify, signalled, spec_pipe, tail
from .sandbox_programs import hash_seed, runner_code

UNSAFE_PREFIX = "unsafe: "


@functools.lru_cache(maxsize=None)
def namespace_prefix() -> tuple[str, ...]:
    """The ``unshare`` command line that gives a program new PID and network namespaces, or ``()``
    when that does not work here (or ``BRIDGE_SANDBOX_NAMESPACES=0``)."""
    if os.environ.get("BRIDGE_SANDBOX_NAMESPACES", "1") == "0":
        return ()
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    candidates: list[tuple[str, ...]] = [(exe, "--pid", "--net", "--fork", "--kill-child")]
    if os.geteuid() != 0:
        candidates.insert(0, (exe, "--user", "--map-root-user", "--pid", "--net", "--fork", "--kill-child"))
    for prefix in candidates:
        try:
            done = subprocess.run(
                [*prefix, "true"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return prefix
    return ()


def unsafe_isolation() -> str:
    """What the unsafe runner has here, as results record it (after ``unsafe: ``)."""
    return "pid+net namespaces" if namespace_prefix() else "process"


def _command(program: Path, work: Path, limits: Limits) -> list[str]:
    mem, cpu, fsize = limits.rlimits()
    # no -I/-E: the environment is ours alone, and PYTHONHASHSEED must take effect
    return [
        *namespace_prefix(),
        sys.executable,
        "-s",
        "-B",
        *(["-P"] if sys.version_info >= (3, 11) else []),
        "-c",
        runner_code("unsafe_main"),
        str(program),
        str(work),
        str(mem),
        str(cpu),
        str(fsize),
    ]


def run_unsafe(program_: Program, limits: Limits) -> Outcome:
    """Run ``program_`` with the damage-control runner under ``limits``; never raises for what the
    program does."""
    with tempfile.TemporaryDirectory(prefix="bridge-exec-") as tmp:
        root = Path(tmp)
        program = root / "program.py"
        program.write_text(program_.source, encoding="utf-8")
        work = root / "work"
        work.mkdir()
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(work),
            "TMPDIR": str(work),
            "PYTHONHASHSEED": hash_seed(),
        }
        cmd = _command(program, work, limits)
        token = secrets.token_hex(16).encode()
        spec_fd = spec_pipe(token, program_)
        timed_out = False
        start = time.monotonic()
        with (
            open(root / "stdout", "wb") as out,
            open(root / "stderr", "wb") as err,
            tempfile.TemporaryFile() as result,
        ):
            try:
                proc = containment.start(
                    [*cmd, str(spec_fd), str(result.fileno())],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    cwd=work,
                    env=env,
                    pass_fds=(spec_fd, result.fileno()),
                )
            finally:
                os.close(spec_fd)
            try:
                rc = proc.wait(timeout=limits.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                rc = containment.end_run(proc)  # its whole tree on a timeout; anything it left behind in its group
            passed = signalled(result, token)
        seconds = time.monotonic() - start
        stderr, stdout = tail(root / "stderr"), tail(root / "stdout")
    isolation = UNSAFE_PREFIX + unsafe_isolation()
    return classify(rc, stderr, seconds, limits, timed_out, False, isolation, stdout, passed)

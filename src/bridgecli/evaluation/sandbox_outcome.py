"""What a sandboxed run of generated code is and came to (:mod:`.sandbox`): the :class:`Program`
and its test, its :class:`Limits`, its :class:`Outcome`, and how both runners (bubblewrap and the
unsafe one) read a finished run.

A program passes only on the checker's success signal: a random token made for the run, handed
with the test to the checker through a pipe (:func:`spec_pipe`); the checker
(:mod:`.sandbox_runner`), a process the program cannot reach, writes it to a result file of its own
once the test's last statement has returned (:func:`signalled`). :func:`classify` turns the exit
status, the timeout and memory flags and that signal into one of the statuses below."""

from __future__ import annotations

import fcntl
import json
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import InputError

# Statuses of an execution
PASSED, FAILED, TIMEOUT, MEMORY, KILLED = "passed", "failed", "timeout", "memory", "killed"


@dataclass(frozen=True)
class Program:
    """What runs in the sandbox. ``source`` is the program (the model's solution with what it
    needs), executed as ``__main__`` in a process of its own; ``test`` judges it, executed with
    ``helpers`` (trusted code it uses, such as HumanEval's prompt helpers) in the checker's process,
    where a name they do not define is looked up in the program (``names`` first, before the
    builtins: the functions under test, which may shadow one). Without a test the program passes
    when it runs to its end, as far as it says so itself (nothing judges it)."""

    source: str
    test: str = ""
    helpers: str = ""
    names: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The whole as one script (what a person would run): the program, then the test."""
        return self.source if not self.test else f"{self.source}\n\n{self.test}"


@dataclass(frozen=True)
class Limits:
    timeout: float = 10.0  # wall-clock seconds
    memory_mb: int = 1024  # address space of each process, and resident memory of all of them together
    file_size_mb: int = 16  # largest file it may write (stdout/stderr included)
    processes: int = 64  # processes and threads of the program's whole tree
    disk_mb: int = 64  # size of each private tmpfs folder (/work, /tmp, /dev/shm)
    open_files: int = 256  # per process

    def rlimits(self) -> tuple[int, int, int]:
        """The runner's address-space and file-size limits in bytes and its CPU seconds
        (``(memory, cpu, file size)``; -1: none)."""
        mem = self.memory_mb * 2**20 if self.memory_mb > 0 else -1
        fsize = self.file_size_mb * 2**20 if self.file_size_mb > 0 else -1
        return mem, int(self.timeout) + 1, fsize


@dataclass(frozen=True)
class Outcome:
    status: str  # passed, failed, timeout, memory, killed
    returncode: int | None
    seconds: float
    error: str  # last line of the traceback (or what happened), "" when passed
    stderr: str  # its tail
    isolation: str  # "bwrap", or "unsafe: pid+net namespaces" / "unsafe: process"
    stdout: str = ""  # its tail

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def to_dict(self) -> dict:
        return asdict(self)


def tail(path_or_file, limit: int = 2000) -> str:
    """The last ``limit`` bytes of a file (a path or an open binary file), decoded; "" when unreadable."""
    try:
        if isinstance(path_or_file, (str, Path)):
            with open(path_or_file, "rb") as fh:
                return tail(fh, limit)
        fh = path_or_file
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - limit))
        return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def last_error(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


#: the most a test (with its helpers) may hold: what a pipe can be made to hold without a reader
MAX_SPEC = 1 << 20


def spec_pipe(token: bytes, program: Program) -> int:
    """The read end of a pipe that holds the run's token and ``program``'s test as JSON, and nothing
    more (the write end is closed): the checker reads it before the program runs anything."""
    data = json.dumps(
        {"token": token.decode(), "test": program.test, "helpers": program.helpers, "names": list(program.names)}
    ).encode("utf-8", "surrogatepass")
    read, write = os.pipe()
    try:
        if len(data) > 65536:
            try:
                fcntl.fcntl(write, getattr(fcntl, "F_SETPIPE_SZ", 1031), min(len(data), MAX_SPEC))
            except OSError:
                pass
        os.set_blocking(write, False)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(write, view) :]
        except BlockingIOError:
            os.close(read)
            raise InputError(
                f"a test of {len(data)} bytes (with its helpers) does not fit the checker's pipe "
                f"(at most {MAX_SPEC} bytes here)"
            ) from None
    finally:
        os.close(write)
    return read


def signalled(result, token: bytes) -> bool:
    """Whether the result file holds exactly the run's token."""
    try:
        result.seek(0)
        return result.read(len(token) + 1) == token
    except OSError:
        return False


def classify(
    rc: int | None,
    stderr: str,
    seconds: float,
    limits: Limits,
    timed_out: bool,
    over_memory: bool,
    isolation: str,
    stdout: str,
    signalled: bool = True,
) -> Outcome:
    """``signalled``: the runner wrote the run's token, i.e. the program ran to its end."""
    error = last_error(stderr)
    cpu = int(limits.timeout) + 1
    if over_memory:
        status, error = MEMORY, f"memory limit ({limits.memory_mb} MiB for all its processes) exceeded"
    elif timed_out:
        status, error = TIMEOUT, f"timed out after {limits.timeout:g} s"
    elif rc == 0 and signalled:
        status, error = PASSED, ""
    elif rc == 0:
        status, error = FAILED, "exited with status 0 before its end (no success signal from the test harness)"
    elif "MemoryError" in error:
        status = MEMORY
    elif rc in (1, 3):
        status = FAILED
    else:
        signum = rc - 128 if rc is not None and rc > 128 else -rc if rc is not None and rc < 0 else None
        name = signal.Signals(signum).name if signum and signum in signal.Signals._value2member_map_ else None
        if name == "SIGXCPU" or (name == "SIGKILL" and seconds >= cpu - 0.5):
            status, error = TIMEOUT, f"CPU time limit ({cpu} s) exceeded"
        elif name == "SIGXFSZ":
            status, error = KILLED, f"file size limit ({limits.file_size_mb} MiB) exceeded"
        elif name is not None:
            status, error = (MEMORY if name in ("SIGSEGV", "SIGBUS") and not error else KILLED), f"killed by {name}"
        else:
            status, error = FAILED, error or f"exit status {rc}"
    return Outcome(status, rc, round(seconds, 3), error, stderr, isolation, stdout)

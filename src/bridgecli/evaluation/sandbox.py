"""Run untrusted Python (model-written code plus its tests) in a sandbox built on bubblewrap.

Nothing generated ever runs in the calling process, and by default nothing runs at all: the code
tasks need a stated opt-in (``--allow-code-execution`` or ``BRIDGE_ALLOW_CODE_EXECUTION=1``, see
:func:`code_execution_mode`). Each program then runs under ``bwrap`` (bubblewrap) with:

- a new user namespace in which it is uid/gid 65534 with no capabilities; when the evaluator is
  root, ``bwrap`` itself is started as the host's uid/gid 65534 (nobody), so the program is
  unprivileged on the host as well, and never root;
- new PID, network, IPC, UTS and cgroup namespaces: a fresh ``/proc`` that shows only its own
  processes, no network but its own loopback (no abstract Unix sockets of the host either), and
  ``--disable-userns`` (when bwrap has it) so it cannot make further user namespaces;
- a root file system built from nothing: ``/usr`` (with the ``/bin``, ``/lib*`` links), the Python
  installation, ``/etc/ld.so.cache`` and ``/etc/localtime``, all read-only, then ``/`` remounted
  read-only; a minimal ``/dev``; private size-limited tmpfs folders ``/work`` (its working folder,
  HOME and TMPDIR, holding ``program.py``), ``/tmp`` and ``/dev/shm``; nothing of the host's ``/home``, ``/root``,
  ``/work``, ``/tmp``, ``/run`` or ``/sys``;
- ``--die-with-parent`` and ``--new-session``; an environment of only PATH, LANG, HOME, TMPDIR and
  PYTHONHASHSEED (the evaluator's own value when it is a number, else 0; honoured, as the
  interpreter runs without ``-I``/``-E`` in that clean environment);
- limits set inside the box, after the user namespace is made: address space per process, CPU
  seconds, file size, open files, no core files, and ``RLIMIT_NPROC``, which the kernel counts per
  user namespace and uid, so it caps the number of processes and threads of this program's whole
  tree (a fork bomb stops there);
- a seccomp filter (:func:`.containment.seccomp_filter`) that refuses ``memfd_create``,
  ``memfd_secret`` and SysV ``shmget``: memory that no process maps and no file system counts;
- a memory limit for all of the program's processes together. Where the evaluator can make a
  cgroup (root, or a delegated cgroup: :func:`.containment.cgroup_parent`), each program gets its
  own, and bwrap waits (``--block-fd``) until its first process is in it: the kernel counts
  everything (resident memory, tmpfs pages, kernel memory such as inodes and socket buffers) and
  kills past the limit. Elsewhere a monitor in the evaluator polls the resident memory of every
  process in the sandbox's PID namespace, what its tmpfs folders hold (pages and inodes), and each
  open socket at the most its buffers can hold, and kills the sandbox past the limit;
- a wall-clock timeout after which the sandbox is SIGKILLed: its whole process tree, stopped first
  so that none forks meanwhile (:func:`.containment.kill_tree`), which also reaches a sandbox still
  being set up (in a session of its own, before ``--die-with-parent`` applies), and its cgroup.

The program and its test never share a process (:mod:`.sandbox_runner`): the program runs in one,
the test in a checker that the program cannot reach (it is not dumpable, and what crosses between
the two is plain data or an opaque handle), and a program passes only on the checker's success
signal: a random token made for the run, which the checker reads with the test from a pipe before
the program runs anything and writes to a file of its own once the test's last statement has
returned. Exit status 0 alone (``os._exit(0)`` before the asserts) is a failure, and so is a
program that reads the runner's frames or memory, or answers with an object equal to anything.

Each sandbox is started under a supervisor (:mod:`.sandbox_supervisor`), a child subreaper that
kills it all when the run ends or the evaluator dies, by any signal, SIGKILL included.

Where bwrap is missing or cannot make namespaces here, :func:`run_program` refuses unless the
caller passes ``unsafe=True`` (``--unsafe-code-execution``); then the old damage-control runner is
used: a separate ``python`` process with rlimits, ``unshare`` PID/network namespaces where that
works, and a Python-level guard, which is not a security boundary. See docs/security.md.

This module holds the opt-in, the probe of what works here and the bwrap run; the pieces live in
:mod:`.sandbox_outcome` (the program, limits, outcome, the success signal), :mod:`.sandbox_runner`
(the checker and the program's process, inside the box), :mod:`.sandbox_supervisor` (between the
evaluator and each box), :mod:`.sandbox_programs` (their text for ``-c``), :mod:`.sandbox_bwrap`
(the box's command line), :mod:`.sandbox_memory` (the polling memory monitor),
:mod:`.sandbox_unsafe` (the unsafe runner) and :mod:`.containment` (cgroups, seccomp, starting
under the supervisor, killing a process tree).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import secrets
import select
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from ..errors import BridgeError, UsageError
from . import containment
from .sandbox_bwrap import (
    BWRAP,
    SANDBOX_UID,
    SECCOMP,
    SETUP,
    WANTED,
    Box,
    Fds,
    bwrap_argv,
    cgroup_parent,
    drop_privileges,
    installation,
    memory_limit,
    python_candidates,
    seccomp,
    seccomp_file,
)
from .sandbox_memory import box_namespace, resident_bytes
from .sandbox_outcome import KILLED, MEMORY, PASSED, TIMEOUT, FAILED, Limits, Outcome, Program, classify, last_error
from .sandbox_outcome import signalled, spec_pipe, tail
from .sandbox_programs import PROBE, hash_seed
from .sandbox_unsafe import UNSAFE_PREFIX, namespace_prefix, run_unsafe, unsafe_isolation

__all__ = [
    "ALLOW_ENV",
    "BWRAP",
    "FAILED",
    "KILLED",
    "MEMORY",
    "PASSED",
    "SANDBOX_UID",
    "TIMEOUT",
    "UNSAFE_PREFIX",
    "Limits",
    "Outcome",
    "Program",
    "SandboxError",
    "bwrap_problem",
    "code_execution_mode",
    "isolation",
    "namespace_prefix",
    "run_program",
    "run_programs",
    "sandbox_info",
    "sandbox_warnings",
]

ALLOW_ENV = "BRIDGE_ALLOW_CODE_EXECUTION"


class SandboxError(BridgeError):
    """The sandbox itself failed (not the program in it)."""

    exit_code = 1


# -- opt-in and the probe -----------------------------------------------------------------------


def _env_allows() -> bool:
    return os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def code_execution_mode(allow: bool = False, unsafe: bool = False) -> str:
    """``"bwrap"`` or ``"unsafe"``: how generated code will run; :class:`UsageError` (exit 2) when
    running it was not asked for, or when no sandbox works here and ``unsafe`` is not given.

    Asking is ``allow`` (``--allow-code-execution``), the environment variable
    ``BRIDGE_ALLOW_CODE_EXECUTION=1``, or ``unsafe`` (``--unsafe-code-execution``, a stronger
    statement of the same)."""
    if not (allow or unsafe or _env_allows()):
        raise UsageError(
            "this task runs model-written code on this machine; pass --allow-code-execution "
            f"(or set {ALLOW_ENV}=1) to allow it (it runs in a bubblewrap sandbox, see docs/security.md)"
        )
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    if unsafe:
        return "unsafe"
    raise UsageError(
        f"no sandbox for model-written code here: {problem}",
        hint="install bubblewrap where user namespaces are allowed (apt-get install bubblewrap), "
        "or pass --unsafe-code-execution to run it with process limits only",
    )


_MISSING = {
    "--disable-userns": "a program may create user namespaces of its own",
    "--size": "its tmpfs folders are not size-limited",
    "--perms": "program.py is writable inside",
    "--remount-ro": "the sandbox's root and /dev stay writable (in memory)",
    "--seccomp": "memfd_create and SysV shared memory are not refused",
}  # what a box loses without each optional bwrap feature


def sandbox_warnings() -> list[str]:
    """What of the sandbox does not work here (one line each), for the user to know."""
    box, _ = _probe()
    if box is None:
        return []
    out = [
        f"bwrap {box.bwrap} lacks {option} (older version): " + _MISSING[option]
        for option in WANTED
        if option not in box.options
    ]
    if "--seccomp" in box.options and SECCOMP is None:
        out.append(f"no seccomp filter for {platform.machine()}: memfd_create and SysV shared memory are not refused")
    mode = memory_limit(box)
    if mode == "none":
        out.append("the evaluator cannot see the sandbox's processes here: memory is limited per process only")
    elif mode == "monitor":
        why = containment.cgroup_parent()[1] if all(o in box.options for o in SETUP) else "bwrap lacks --block-fd"
        out.append(
            f"no cgroup for the sandbox here ({why}): the memory limit for all of a program's processes "
            "is a poll of their resident memory, tmpfs use and open sockets, which misses pipe buffers "
            "and sockets passed in flight (see docs/security.md)"
        )
    return out


@functools.lru_cache(maxsize=None)
def _probe() -> tuple[Box | None, str]:
    """Find bwrap and an interpreter that runs in the box here: ``(box, "")`` or ``(None, why not)``."""
    exe = shutil.which(BWRAP)
    if exe is None:
        return None, "bubblewrap (bwrap) is not installed"
    try:
        help_text = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"bwrap does not run: {exc}"
    options = frozenset(o for o in WANTED + SETUP if o in help_text)
    problem = "no Python interpreter found for the sandbox"
    for python in python_candidates():
        # with the seccomp filter first; where it does not load or does not hold, without it
        for opts in [options] + ([options - {"--seccomp"}] if "--seccomp" in options else []):
            box = Box(exe, python, installation(python), opts, "")
            try:
                done = _run_probe(box)
            except (OSError, subprocess.SubprocessError) as exc:
                problem = f"bwrap does not run: {exc}"
                break
            if done.returncode == 0:
                version, uid, _, memfd = done.stdout.split()
                if int(uid) != SANDBOX_UID:
                    return None, f"bwrap ran the probe as uid {uid}, not {SANDBOX_UID}"
                if "--seccomp" in opts and SECCOMP is not None and memfd != "refused":
                    continue
                found = Box(exe, python, box.binds, opts, version)
                return Box(exe, python, box.binds, opts, version, _monitor_works(found)), ""
            lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
            problem = (
                f"bwrap cannot start a sandbox here ({lines[-1].strip() if lines else f'exit {done.returncode}'}; "
                f"tried {python}; BRIDGE_SANDBOX_PYTHON names another interpreter)"
            )
    return None, problem


def _run_probe(box: Box) -> subprocess.CompletedProcess:
    with tempfile.TemporaryFile() as program, seccomp_file(box) as seccomp_fd:
        fds = Fds(seccomp=seccomp_fd)
        argv = bwrap_argv(box, Limits(), program.fileno(), runner=None, code=PROBE, fds=fds)
        run = containment.start(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            pass_fds=(program.fileno(), *fds.passed()),
            stdin=subprocess.DEVNULL,
            user=drop_privileges(),
        )
        try:
            stdout, stderr = run.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            containment.end_run(run)
            raise
        return subprocess.CompletedProcess(argv, containment.end_run(run), stdout, stderr)


def _monitor_works(box: Box) -> bool:
    """Whether the evaluator sees the resident memory of a process inside the box (it needs to read
    /proc/PID/ns/pid of the box's processes); without it only the per-process limits hold."""
    with tempfile.TemporaryFile() as program:
        argv = bwrap_argv(box, Limits(), program.fileno(), runner=None, code="import time; time.sleep(5)")
        try:
            run = containment.start(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(program.fileno(),),
                user=drop_privileges(),
            )
        except OSError:
            return False
        try:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline and run.poll() is None:
                ns = box_namespace(run.pid)
                if ns is not None and resident_bytes(ns) > 0:
                    return True
                time.sleep(0.02)
            return False
        finally:
            containment.end_run(run)


def bwrap_problem() -> str | None:
    """None when bubblewrap sandboxes work here, else why not (one line)."""
    return _probe()[1] or None


def sandbox_info() -> dict:
    """What results record about the sandbox."""
    box, problem = _probe()
    if box is None:
        return {"isolation": UNSAFE_PREFIX + unsafe_isolation(), "bwrap_problem": problem}
    mode = memory_limit(box)
    return {
        "isolation": BWRAP,
        "python": box.python,
        "python_version": box.version,
        "hash_seed": hash_seed(),
        "bwrap_options": sorted(box.options),
        "memory_limit": mode,
        "seccomp": seccomp(box) is not None,
        "missing": sorted(set(WANTED) - box.options)
        + ([] if mode.startswith("cgroup") else ["cgroup"])
        + ([] if box.monitor else ["tree memory monitor"]),
    }


# -- running --------------------------------------------------------------------------------------


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _sandbox_pid(info: int, deadline: float) -> int | None:
    """The host PID of the sandbox's first process, which bwrap writes to ``info`` (--info-fd) once
    it has made it; None when bwrap ended without (it failed: its stderr says why). Raises
    TimeoutError at ``deadline``."""
    data = b""
    poller = select.poll()  # not select(): descriptors past 1023 are fine
    poller.register(info, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            raise TimeoutError("bwrap did not report its sandbox in time")
        chunk = os.read(info, 4096)
        if not chunk:
            break
        data += chunk
    try:
        return int(json.loads(data.decode("utf-8", "replace"))["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def _new_cgroup(parent: containment.CgroupParent | None, budget: int | None) -> containment.Cgroup | None:
    if parent is None:
        return None
    try:
        return containment.Cgroup(parent, budget)
    except OSError as exc:
        raise SandboxError(f"cannot create the sandbox's cgroup in {parent.path}: {exc}") from None


def _box_fds(
    token: bytes, program: Program, result: int, seccomp_fd: int, cgroup: bool, pipes: list[int]
) -> tuple[Fds, int, int]:
    """The box's descriptors, and our ends of the cgroup handshake (``info``, ``block``; -1 without
    a cgroup). Every pipe end made here is added to ``pipes`` (the caller closes them)."""
    spec_fd = spec_pipe(token, program)
    pipes.append(spec_fd)
    if not cgroup:
        return Fds(spec=spec_fd, result=result, seccomp=seccomp_fd), -1, -1
    info, info_w = os.pipe()
    block_r, block = os.pipe()
    pipes += [info, info_w, block_r, block]
    return Fds(spec=spec_fd, result=result, seccomp=seccomp_fd, info=info_w, block=block_r), info, block


def _admit(cgroup: containment.Cgroup, info: int, block: int, deadline: float) -> bool:
    """Put the box in its cgroup before it runs anything; False when bwrap did not report in time.

    bwrap has made the sandbox's first process and waits (--block-fd) before it sets anything up:
    put it in the cgroup, where all it starts will be born, then let it go on."""
    try:
        child = _sandbox_pid(info, deadline)
    except TimeoutError:
        return False
    if child is not None:
        try:
            cgroup.add(child)
        except OSError as exc:
            raise SandboxError(f"cannot put the sandbox in its cgroup {cgroup.path}: {exc}") from None
        os.write(block, b"x")
    return True


def _watch(
    proc: containment.Run, box: Box, cgroup: containment.Cgroup | None, budget: int | None, deadline: float
) -> tuple[bool, bool]:
    """Wait for the box to end, polling its memory: ``(timed out, over memory)``. The kernel keeps
    the limit where there is a cgroup (we read its OOM kills); elsewhere the monitor does."""
    namespace = None
    interval = 0.01
    while True:
        try:
            proc.wait(timeout=max(0.0, min(interval, deadline - time.monotonic())))
            return False, False
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() >= deadline:
            return True, False
        if cgroup is not None:
            if cgroup.oom_kills():
                return False, True
        elif budget is not None and box.monitor:
            if namespace is None:
                namespace = box_namespace(proc.pid)
            if namespace is not None and resident_bytes(namespace) > budget:
                return False, True
        interval = min(0.05, interval * 1.5)


def run_program(program: Program | str, limits: Limits = Limits(), *, unsafe: bool = False) -> Outcome:
    """Execute ``program`` (a :class:`Program`, or a script without a test) in the sandbox under
    ``limits``; never raises for what the program does. Without a working bwrap this raises
    :class:`UsageError` unless ``unsafe``.

    It passes only on the checker's success signal: a random token, made for this run, that the
    checker (a process the program cannot reach) writes to a file of its own once the test's last
    statement returned."""
    if isinstance(program, str):
        program = Program(program)
    box, problem = _probe()
    if box is None:
        if not unsafe:
            raise UsageError(
                f"no sandbox for model-written code here: {problem}",
                hint="install bubblewrap, or pass --unsafe-code-execution",
            )
        return run_unsafe(program, limits)
    return _run_boxed(box, program, limits)


def _run_boxed(box: Box, program_: Program, limits: Limits) -> Outcome:
    token = secrets.token_hex(16).encode()
    budget = limits.memory_mb * 2**20 if limits.memory_mb > 0 else None
    with contextlib.ExitStack() as stack:
        program, out, err, result = (stack.enter_context(tempfile.TemporaryFile()) for _ in range(4))
        program.write(program_.source.encode("utf-8", "surrogatepass"))
        program.flush()
        program.seek(0)
        seccomp_fd = stack.enter_context(seccomp_file(box))
        pipes: list[int] = []
        stack.callback(_close_all, pipes)
        cgroup = _new_cgroup(cgroup_parent(box), budget)
        if cgroup is not None:
            stack.callback(cgroup.remove)
        fds, info, block = _box_fds(token, program_, result.fileno(), seccomp_fd, cgroup is not None, pipes)
        start = time.monotonic()
        deadline = start + limits.timeout
        proc = containment.start(
            bwrap_argv(box, limits, program.fileno(), fds=fds),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env={},
            pass_fds=(program.fileno(), *fds.passed()),
            user=drop_privileges(),
        )
        for fd in (fds.spec, fds.info, fds.block):  # the box's ends: only bwrap holds them now
            if fd >= 0:
                os.close(fd)
                pipes.remove(fd)
        timed_out = over_memory = False
        try:
            timed_out = cgroup is not None and not _admit(cgroup, info, block, deadline)
            if not timed_out:
                timed_out, over_memory = _watch(proc, box, cgroup, budget, deadline)
        finally:
            rc = containment.end_run(proc, cgroup)
        if cgroup is not None and cgroup.oom_kills():
            over_memory = True
        seconds = time.monotonic() - start
        stderr, stdout = tail(err), tail(out)
        passed = signalled(result, token)
    if rc == 70 and "bridge sandbox setup failed" in stderr:
        raise SandboxError(last_error(stderr))
    return classify(rc, stderr, seconds, limits, timed_out, over_memory, BWRAP, stdout, passed)


def run_programs(
    sources: Sequence[Program | str], limits: Limits = Limits(), workers: int | None = None, *, unsafe: bool = False
) -> list[Outcome]:
    """:func:`run_program` for each program, ``workers`` at a time (default: the CPU count); in order."""
    if not sources:
        return []
    workers = max(1, min(workers or os.cpu_count() or 1, len(sources)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda s: run_program(s, limits, unsafe=unsafe), sources))


def isolation() -> str:
    """``bwrap`` when the sandbox works here, else what the unsafe runner would have."""
    return BWRAP if _probe()[0] is not None else UNSAFE_PREFIX + unsafe_isolation()

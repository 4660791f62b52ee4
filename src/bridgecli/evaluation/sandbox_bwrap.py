"""The bubblewrap box of the code sandbox (:mod:`.sandbox`): what a box is made of here
(:class:`Box`: bwrap, the interpreter inside and the optional bwrap features this version has) and
the ``bwrap`` command line that builds it around one program (:func:`bwrap_argv`).

The module docstring of :mod:`.sandbox` lists what the box holds and why; this module turns that
into arguments. Where an optional feature is missing, its argument is left out and
:func:`.sandbox.sandbox_warnings` says what that costs."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Iterator

from . import containment
from .sandbox_outcome import Limits
from .sandbox_programs import hash_seed, runner_code

SANDBOX_UID = 65534  # nobody
BWRAP = "bwrap"

WANTED = ("--disable-userns", "--size", "--perms", "--remount-ro", "--seccomp")  # optional bwrap features we use
SETUP = ("--info-fd", "--block-fd")  # what putting the box in a cgroup before it runs needs
SECCOMP = containment.seccomp_filter()


@dataclass(frozen=True)
class Box:
    bwrap: str
    python: str  # interpreter inside the box
    binds: tuple[str, ...]  # extra read-only folders (the interpreter's installation)
    options: frozenset[str]  # optional bwrap options this version has
    version: str  # the interpreter's version
    monitor: bool = False  # whether the evaluator can see the box's processes (the tree-wide memory limit)


@dataclass(frozen=True)
class Fds:
    """File descriptors the box gets besides its program (-1: none)."""

    spec: int = -1  # the run's token and test, read and closed by the checker
    result: int = -1  # where the checker writes the token when the test has passed
    seccomp: int = -1  # the seccomp filter (bwrap reads it)
    info: int = -1  # bwrap writes the sandbox's PID there (--info-fd)
    block: int = -1  # bwrap waits for a byte there before it starts anything (--block-fd)

    def passed(self) -> tuple[int, ...]:
        return tuple(fd for fd in (self.spec, self.result, self.seccomp, self.info, self.block) if fd >= 0)


def python_candidates() -> list[str]:
    """Interpreters to try in the box: $BRIDGE_SANDBOX_PYTHON, this one's base installation, then
    the system's python3 (this one may live where the box's user cannot reach, like /root)."""
    found = []
    explicit = os.environ.get("BRIDGE_SANDBOX_PYTHON")
    if explicit:
        return [os.path.realpath(explicit)]
    for exe in (getattr(sys, "_base_executable", None), sys.executable):
        if exe:
            found.append(os.path.realpath(exe))
    for folder in ("/usr/bin", "/usr/local/bin"):
        for name in (f"python{sys.version_info.major}.{sys.version_info.minor}", "python3"):
            path = os.path.join(folder, name)
            if os.path.exists(path):
                found.append(os.path.realpath(path))
    return list(dict.fromkeys(found))


def installation(python: str) -> tuple[str, ...]:
    """The folder to bind for an interpreter outside /usr: its prefix (``bin/..``)."""
    if python.startswith("/usr/"):
        return ()
    return (os.path.dirname(os.path.dirname(python)),)


def drop_privileges() -> tuple[int, int] | None:
    """The (uid, gid) bwrap starts as: nobody when the evaluator is root; None (ours) otherwise."""
    if os.geteuid() != 0:
        return None
    return SANDBOX_UID, SANDBOX_UID


def cgroup_parent(box: Box) -> containment.CgroupParent | None:
    """Where this box's programs get their cgroups, or None (then the polling monitor)."""
    if not all(option in box.options for option in SETUP):
        return None
    return containment.cgroup_parent()[0]


def seccomp(box: Box) -> bytes | None:
    return SECCOMP if "--seccomp" in box.options else None


def memory_limit(box: Box) -> str:
    """How the memory limit for all of a program's processes is kept: ``cgroup v1``/``cgroup v2``
    (the kernel counts everything), ``monitor`` (resident memory and tmpfs use, polled) or ``none``."""
    parent = cgroup_parent(box)
    if parent is not None:
        return f"cgroup v{parent.version}"
    return "monitor" if box.monitor else "none"


@contextlib.contextmanager
def seccomp_file(box: Box) -> Iterator[int]:
    """An open file holding the box's seccomp filter (bwrap reads it), or -1 when there is none."""
    data = seccomp(box)
    if data is None:
        yield -1
        return
    with tempfile.TemporaryFile() as fh:
        fh.write(data)
        fh.flush()
        fh.seek(0)
        yield fh.fileno()


def _isolation_argv(box: Box) -> list[str]:
    """New namespaces, the box's user, and what ties its life to ours."""
    return [
        box.bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ]


def _filesystem_argv(box: Box, limits: Limits, program_fd: int) -> list[str]:
    """The root file system built from nothing: the read-only system and interpreter, the private
    tmpfs folders, the program file, then ``/`` read-only."""
    disk = str(max(1, limits.disk_mb) * 2**20)
    argv = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    for path in ("/etc/ld.so.cache", "/etc/localtime"):
        argv += ["--ro-bind-try", path, path]
    for folder in box.binds:
        argv += ["--ro-bind", folder, folder]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for folder in ("/work", "/tmp", "/dev/shm"):
        argv += (["--size", disk] if "--size" in box.options else []) + ["--tmpfs", folder]
    argv += (["--perms", "0444"] if "--perms" in box.options else []) + ["--file", str(program_fd), "/work/program.py"]
    if "--remount-ro" in box.options:
        argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    return argv


def bwrap_argv(
    box: Box,
    limits: Limits,
    program_fd: int,
    *,
    runner: str | None = None,
    code: str | None = None,
    fds: Fds = Fds(),
) -> list[str]:
    """The ``bwrap`` command line that runs ``runner`` (the program is the file ``program_fd``,
    seen as /work/program.py) under ``limits``, or, with ``code``, just that code (the probes)."""
    argv = _isolation_argv(box) + _filesystem_argv(box, limits, program_fd)
    if "--disable-userns" in box.options:
        argv += ["--disable-userns"]
    for option, fd in (("--seccomp", fds.seccomp), ("--info-fd", fds.info), ("--block-fd", fds.block)):
        if fd >= 0:
            argv += [option, str(fd)]
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/work",
        "TMPDIR": "/work",
        "PYTHONHASHSEED": hash_seed(),
    }
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += ["--chdir", "/work", "--", box.python, "-s", "-B"]
    if box.version and tuple(map(int, box.version.split(".")[:2])) >= (3, 11):
        argv += ["-P"]
    if code is not None:
        return argv + ["-c", code]
    mem, cpu, fsize = limits.rlimits()
    return argv + [
        "-c",
        runner or runner_code("box_main"),
        str(mem),
        str(cpu),
        str(fsize),
        str(limits.processes),
        str(limits.open_files),
        str(fds.spec),
        str(fds.result),
    ]

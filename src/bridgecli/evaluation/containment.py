"""Kernel-side limits for the code sandbox (:mod:`.sandbox`): a memory cgroup per program, a
seccomp filter, and killing a process tree that is still being set up.

- :func:`cgroup_parent` finds a memory cgroup under which the evaluator may create groups: a child
  of its own cgroup, in the cgroup v2 hierarchy when the memory controller is there (and can be
  enabled for children), else in the cgroup v1 memory hierarchy. Writing there needs root, or a
  cgroup delegated to the evaluator's user; where neither holds it is ``None`` and the sandbox
  falls back to its polling monitor. :class:`Cgroup` is one program's group: its memory limit
  counts everything the kernel charges to it (resident and page-cache memory, tmpfs and memfd
  pages, kernel memory such as inodes and socket buffers), the kernel's OOM killer enforces it,
  and :meth:`Cgroup.kill` ends every process in it.
- :func:`seccomp_filter` is a classic BPF program for ``bwrap --seccomp`` that refuses, with
  EPERM, the calls that make memory no process maps and no file system counts: ``memfd_create``,
  ``memfd_secret`` and SysV ``shmget`` (and every call of a foreign ABI: 32-bit x86 and x32 on
  x86-64), and allows the rest.
- :func:`start` starts a sandbox (bwrap, or the unsafe runner) under a supervisor
  (:mod:`.sandbox_supervisor`), a child subreaper that kills everything the sandbox started when the
  evaluator ends the run or dies, by any signal; :func:`end_run` ends and reaps a run that way,
  then kills its process group and its cgroup.
- :func:`kill_tree` stops a process and all its descendants (again and again until no new one
  appears), then kills them: it reaches processes that left the process group (``setsid``) and
  those not yet bound to their parent's death, which ``killpg`` alone misses; :func:`end_run` falls
  back on it when the supervisor does not end in time.
"""

from __future__ import annotations

import functools
import os
import platform
import signal
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field

from .sandbox_supervisor import descendants

GROUP_PREFIX = "bridge-sandbox-"

# -- seccomp -----------------------------------------------------------------------------------

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# memfd_create, memfd_secret, shmget
_REFUSED = {"x86_64": (319, 447, 29), "aarch64": (279, 447, 194)}
_X32_BIT = 0x40000000
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW, _RET_ERRNO, _EPERM = 0x7FFF0000, 0x00050000, 1


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The filter for this machine's architecture (``None`` where there is none: then nothing
    is refused). Each instruction is a ``struct sock_filter`` (code, jt, jf, k)."""
    machine = machine or platform.machine()
    if machine not in _AUDIT_ARCH:
        return None
    refused = _REFUSED[machine]
    tests = 1 + len(refused)  # the x32 test (x86-64 only) and one per refused call
    if machine != "x86_64":
        tests -= 1
    # 0: load arch; 1: foreign arch -> deny; 2: load nr; 3..: tests; then allow, deny
    deny = 3 + tests + 1
    program = [(_LD_W_ABS, 0, 0, 4), (_JEQ_K, 0, deny - 2, _AUDIT_ARCH[machine]), (_LD_W_ABS, 0, 0, 0)]
    if machine == "x86_64":
        program.append((_JGE_K, deny - len(program) - 1, 0, _X32_BIT))
    for nr in refused:
        program.append((_JEQ_K, deny - len(program) - 1, 0, nr))
    program += [(_RET_K, 0, 0, _RET_ALLOW), (_RET_K, 0, 0, _RET_ERRNO | _EPERM)]
    assert len(program) == deny + 1
    return b"".join(struct.pack("=HBBI", *insn) for insn in program)


# -- killing a process tree ---------------------------------------------------------------------


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tree(pid: int) -> None:
    """SIGSTOP ``pid`` and its descendants until no new one appears (a stopped process forks no
    more), then SIGKILL them all, so none is left running, wherever its setup had got to."""
    stopped: list[int] = []
    seen: set[int] = set()
    for _ in range(1000):  # each round stops what the last one's processes forked meanwhile
        new = [p for p in [pid, *descendants(pid)] if p not in seen]
        if not new:
            break
        for p in new:
            _signal(p, signal.SIGSTOP)
            seen.add(p)
            stopped.append(p)
    for p in stopped:
        _signal(p, signal.SIGKILL)


@dataclass
class Run:
    """A sandbox started by :func:`start`: its supervisor's process, and our end of the control pipe
    (-1 once closed: the supervisor then kills the sandbox)."""

    proc: subprocess.Popen
    control: int = field(default=-1)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)

    def release(self) -> None:
        """Close the control pipe: the supervisor kills whatever of the sandbox is left and exits."""
        if self.control >= 0:
            os.close(self.control)
            self.control = -1


def start(argv: list[str], *, user: tuple[int, int] | None = None, **popen) -> Run:
    """Start ``argv`` under a supervisor (:mod:`.sandbox_supervisor`), as ``user`` (uid, gid) when
    given (the supervisor stays ours and drops privileges in its child). ``popen``: what
    :class:`subprocess.Popen` takes (``pass_fds`` reach the command; ``start_new_session`` is set)."""
    from .sandbox_programs import supervisor_code

    uid, gid = user if user is not None else (-1, -1)
    control_r, control_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-S", "-I", "-c", supervisor_code(), str(control_r), str(uid), str(gid), *argv],
            pass_fds=(control_r, *popen.pop("pass_fds", ())),
            start_new_session=True,
            close_fds=True,
            **popen,
        )
    except BaseException:
        os.close(control_w)
        raise
    finally:
        os.close(control_r)
    return Run(proc, control_w)


def end_run(run: Run, cgroup: Cgroup | None = None, wait: float = 5.0) -> int:
    """End what is left of a sandboxed run: its supervisor kills its whole tree (wherever its setup
    had got to) and exits; :func:`kill_tree` when it has not within ``wait`` seconds; then its
    process group and its cgroup. Reaps it; returns its exit status."""
    run.release()
    try:
        run.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        kill_tree(run.pid)
    try:
        os.killpg(run.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if cgroup is not None:
        cgroup.kill()
    return run.wait()


# -- cgroups ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupParent:
    path: str  # the folder under which each program gets its group
    version: int  # 1 or 2


def _mounts(mountinfo: str) -> list[tuple[str, str, str, list[str]]]:
    """(root, mount point, file system type, super options) of each mount in ``mountinfo``."""
    out = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3:
            out.append((fields[3], fields[4].replace("\\040", " "), tail[0], tail[2].split(",")))
    return out


def candidates(cgroups: str, mountinfo: str) -> list[tuple[int, str]]:
    """(version, folder) of a process's own memory cgroup, v2 first, then v1, from the text of its
    /proc/PID/cgroup and /proc/PID/mountinfo."""
    mounts = _mounts(mountinfo)
    found: list[tuple[int, str]] = []
    for line in cgroups.splitlines():
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":
            version, wanted = 2, [m for m in mounts if m[2] == "cgroup2"]
        elif "memory" in controllers.split(","):
            version, wanted = 1, [m for m in mounts if m[2] == "cgroup" and "memory" in m[3]]
        else:
            continue
        for root, point, _, _ in wanted:
            root = root.rstrip("/") or "/"
            if path != root and not path.startswith(root.rstrip("/") + "/"):
                continue
            found.append((version, os.path.normpath(os.path.join(point, os.path.relpath(path, root)))))
            break
    return sorted(found, key=lambda c: -c[0])


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(value)


def _sweep(folder: str) -> None:
    """Remove groups left by evaluators that are gone (killed before they could clean up)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for name in entries:
        if not name.startswith(GROUP_PREFIX):
            continue
        owner = name[len(GROUP_PREFIX) :].split("-")[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            try:
                os.rmdir(os.path.join(folder, name))
            except OSError:
                pass


def _usable(version: int, folder: str) -> str:
    """ "" when groups with a memory limit can be made under ``folder``, else why not."""
    if version == 2:
        try:
            if "memory" not in _read(os.path.join(folder, "cgroup.controllers")).split():
                return "the memory controller is not available in its cgroup v2"
            if "memory" not in _read(os.path.join(folder, "cgroup.subtree_control")).split():
                _write(os.path.join(folder, "cgroup.subtree_control"), "+memory")
        except OSError as exc:
            return f"cannot enable the memory controller for child cgroups ({exc.strerror or exc})"
    _sweep(folder)
    try:
        group = Cgroup(CgroupParent(folder, version), 64 * 2**20)
    except OSError as exc:
        return f"cannot create a cgroup in {folder} ({exc.strerror or exc})"
    group.remove()
    return ""


@functools.lru_cache(maxsize=None)
def cgroup_parent() -> tuple[CgroupParent | None, str]:
    """Where program groups go, or ``(None, why not)``: checked once per process."""
    why = "no memory cgroup found in /proc/self/cgroup"
    try:
        found = candidates(_read("/proc/self/cgroup"), _read("/proc/self/mountinfo"))
    except OSError as exc:
        return None, f"cannot read /proc/self/cgroup ({exc.strerror or exc})"
    for version, folder in found:
        problem = _usable(version, folder)
        if not problem:
            return CgroupParent(folder, version), ""
        why = problem
    return None, why


class Cgroup:
    """One program's cgroup under ``parent``, with ``limit`` bytes of memory (``None``: none)."""

    def __init__(self, parent: CgroupParent, limit: int | None) -> None:
        self.version = parent.version
        self.path = os.path.join(parent.path, f"{GROUP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
        os.mkdir(self.path)
        try:
            if limit is not None:
                if self.version == 2:
                    self._set("memory.max", str(limit))
                    self._set("memory.swap.max", "0", optional=True)
                    self._set("memory.oom.group", "1", optional=True)
                else:
                    self._set("memory.limit_in_bytes", str(limit))
                    self._set("memory.memsw.limit_in_bytes", str(limit), optional=True)
                    # v1 charges TCP buffers only to groups with a TCP limit of their own
                    self._set("memory.kmem.tcp.limit_in_bytes", str(limit), optional=True)
        except OSError:
            self.remove()
            raise

    def _set(self, name: str, value: str, optional: bool = False) -> None:
        path = os.path.join(self.path, name)
        if optional and not os.path.exists(path):
            return
        _write(path, value)

    def add(self, pid: int) -> None:
        _write(os.path.join(self.path, "cgroup.procs"), str(pid))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in _read(os.path.join(self.path, "cgroup.procs")).split()]
        except (OSError, ValueError):
            return []

    def oom_kills(self) -> int:
        """How many processes the kernel killed here for want of memory."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in _read(os.path.join(self.path, name)).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def kill(self, wait: float = 2.0) -> None:
        """SIGKILL every process in the group, until it is empty (or ``wait`` seconds pass)."""
        if self.version == 2:
            try:
                self._set("cgroup.kill", "1", optional=True)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while True:
            pids = self.pids()
            if not pids or time.monotonic() > deadline:
                return
            for pid in pids:
                _signal(pid, signal.SIGKILL)
            time.sleep(0.002)

    def remove(self, wait: float = 2.0) -> None:
        """Remove the group (its processes are killed first); what still fails after ``wait``
        seconds is left to the next evaluator's sweep."""
        deadline = time.monotonic() + wait
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                self.kill(wait=max(0.0, deadline - time.monotonic()))
                time.sleep(0.005)

"""The code sandbox's polling memory monitor (:mod:`.sandbox`), for where the evaluator cannot make
a cgroup: what the processes of a box's PID namespace hold, as the host sees it.

:func:`resident_bytes` adds their resident memory, what the box's tmpfs folders hold (pages and
inodes, seen through one of its processes' root) and each socket they have open at the most its
buffers can hold (:data:`SOCKET_BYTES`). It misses pipe buffers and sockets passed in flight
(docs/security.md); a cgroup counts everything."""

from __future__ import annotations

import os

from .sandbox_supervisor import parents

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def children(pid: int) -> list[int]:
    """The PIDs whose parent is ``pid``."""
    return [child for child, parent in parents().items() if parent == pid]


def namespace(pid: int) -> str | None:
    """The PID namespace of process ``pid`` (``pid:[inode]``), None when it cannot be read."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def box_namespace(pid: int, depth: int = 3) -> str | None:
    """The PID namespace of the box that process ``pid`` (bwrap's supervisor) made: that of the
    nearest descendant of it (``depth`` generations at most) which is not its own; None until there
    is one."""
    outer, level = namespace(pid), [pid]
    for _ in range(depth):
        level = [child for parent in level for child in children(parent)]
        found = [ns for ns in map(namespace, level) if ns is not None and ns != outer]
        if found:
            return found[-1]
    return None


def resident_bytes(namespace: str) -> int:
    """What the processes of the PID namespace ``namespace`` hold, as the host sees it: their
    resident memory, what the box's tmpfs folders hold (:func:`tmpfs_bytes`, seen through one of
    them), and each socket they have open at the most its buffers can hold (:data:`SOCKET_BYTES`)."""
    total, member, sockets = 0, None, set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/ns/pid") != namespace:
                continue
            with open(f"/proc/{entry.name}/statm", "rb") as fh:
                total += int(fh.read().split()[1]) * _PAGE
            member = member or entry.name
            sockets.update(_sockets(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return total + (tmpfs_bytes(member) if member else 0) + len(sockets) * SOCKET_BYTES


def _sysctl(name: str, field: int = 0, default: int = 0) -> int:
    try:
        with open(f"/proc/sys/{name}", encoding="ascii") as fh:
            return max(default, int(fh.read().split()[field]))
    except (OSError, ValueError, IndexError):
        return default


# The most one socket's buffers can hold: a send buffer of up to twice net.core.wmem_max (SO_SNDBUF)
# or tcp_wmem's maximum (autotuning), and a receive buffer likewise (the kernel's defaults at least:
# a sandbox's own network namespace starts with them)
SOCKET_BYTES = max(2 * _sysctl("net/core/wmem_max", default=212992), _sysctl("net/ipv4/tcp_wmem", 2, 4 << 20)) + max(
    2 * _sysctl("net/core/rmem_max", default=212992), _sysctl("net/ipv4/tcp_rmem", 2, 6 << 20)
)


def _sockets(pid: str) -> set[str]:
    """The sockets process ``pid`` has open (``socket:[inode]``)."""
    out: set[str] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            out.add(target)
    return out


_INODE_BYTES = 1024  # what tmpfs charges an inode (and xattrs) in its inode count; ~960 B of kernel memory measured
_BOX_MOUNTS = ("/", "/dev", "/work", "/tmp", "/dev/shm")


def tmpfs_bytes(pid: str) -> int:
    """What the box's in-memory file systems hold (pages and inodes; files deleted but still open
    included), seen through ``/proc/PID/root``: 0 until the box has its own root."""
    root = f"/proc/{pid}/root"
    try:
        mine, theirs = os.stat("/"), os.stat(root)
    except OSError:
        return 0
    if (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino):
        return 0  # still being set up: its root is the host's
    total, seen = 0, set()
    for mount in _BOX_MOUNTS:
        try:
            path = root + mount
            device = os.stat(path).st_dev
            if device in seen:
                continue
            seen.add(device)
            fs = os.statvfs(path)
        except OSError:
            continue
        total += (fs.f_blocks - fs.f_bfree) * fs.f_frsize + (fs.f_files - fs.f_ffree) * _INODE_BYTES
    return total

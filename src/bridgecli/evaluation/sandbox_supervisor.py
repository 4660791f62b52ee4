"""The process between the evaluator and each sandbox (:mod:`.sandbox`), so that nothing of a
sandbox outlives the evaluator, whatever kills it (SIGKILL included).

bwrap's ``--die-with-parent`` does not cover its own start: its first process in the new
namespaces waits for the outer bwrap (reading an eventfd) before it binds itself to its parent's
death, so an evaluator killed at that moment (the outer bwrap then dies with it) leaves that
process behind for ever, a child of PID 1. The supervisor closes that gap from outside:

- it is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): a process of the sandbox whose parent
  dies is reparented to it, not to PID 1, so every process the sandbox started stays its
  descendant;
- it holds the read end of a pipe whose write end only the evaluator holds (:func:`control_pipe`):
  when the evaluator ends the run, or dies by any signal, the pipe reads end-of-file and the
  supervisor stops and kills all its descendants (stopped first, so that none forks meanwhile;
  one that was forking as it stopped leaves a child the next round finds), reaps them and exits;
- otherwise it starts the command (bwrap, or the unsafe runner), as the user it is told to
  (dropping root's privileges in the child, before the exec), and exits with its status (128+N
  for signal N) once it has killed whatever the command left.

Standard library only: its text is handed to the evaluator's interpreter with ``-c``. The evaluator
imports it too, for :func:`parents` and :func:`descendants` (:mod:`.containment`, :mod:`.sandbox_memory`)."""

from __future__ import annotations

import os
import select
import signal
import sys
import time


def parents() -> dict[int, int]:
    """pid -> parent pid, for every process in /proc (one that ends while it is read is left out)."""
    out: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    stat = fh.read()
                out[int(entry.name)] = int(stat[stat.rfind(b")") + 2 :].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return out


def descendants(pid: int) -> list[int]:
    """Every living descendant of ``pid`` (children first)."""
    children: dict[int, list[int]] = {}
    for child, parent in parents().items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def kill_descendants() -> None:
    """Stop this process's descendants until no new one appears, kill them all, and reap, in rounds until
    no child is left. A stop takes effect when the stopped process returns from its system call: one
    that was forking then (bwrap starting its sandbox) makes its child after the round's last scan, and
    that child, its parent killed, is reparented to us (a subreaper) and stopped and killed in the next
    round. Each round scans afresh: a pid reaped meanwhile may be a new process's."""
    me = os.getpid()
    while True:
        stopped: list[int] = []
        seen: set[int] = set()
        for _ in range(1000):
            new = [p for p in descendants(me) if p not in seen]
            if not new:
                break
            for p in new:
                seen.add(p)
                stopped.append(p)
                try:
                    os.kill(p, signal.SIGSTOP)
                except OSError:
                    pass
        for p in stopped:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        if not _reap_children(ROUND_S):
            return


#: how long a round of :func:`kill_descendants` reaps before it looks for descendants again
ROUND_S = 0.05


def _reap_children(seconds: float) -> bool:
    """Reap ended children for up to ``seconds``; whether a child is still left then."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            if time.monotonic() >= deadline:
                return True
            time.sleep(0.002)


def reap(block: bool, watched: int = -1) -> int | None:
    """Reap ended children; the wait status of ``watched`` when it was among them."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == watched:
            found = status


def _has_children() -> bool:
    """Whether a child is left (an orphan of the command's is reparented to us, a subreaper: no
    child means no descendant)."""
    try:
        os.waitpid(-1, os.WNOHANG)
        return True
    except ChildProcessError:
        return False


def _close_all_but(*keep: int) -> None:
    """Close every descriptor above 2 but ``keep``."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _prctl(option: int, value: int) -> None:
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def main(argv: list) -> None:
    """``CONTROL_FD UID GID COMMAND...``: UID/GID -1 keep the supervisor's own."""
    control, uid, gid, command = int(argv[0]), int(argv[1]), int(argv[2]), argv[3:]
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the evaluator decides (through the pipe)
    poller = select.poll()
    poller.register(control, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    if any(fd == control for fd, _ in poller.poll(0)):
        os._exit(1)  # the evaluator already ended this run, or is gone
    pid = os.fork()
    if pid == 0:
        try:
            for fd in (control, wake_r, wake_w):
                os.close(fd)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            if gid >= 0:
                os.setgroups([])
                os.setresgid(gid, gid, gid)
            if uid >= 0:
                os.setresuid(uid, uid, uid)
            os.execv(command[0], command)
        except BaseException as exc:
            sys.stderr.write(f"bridge sandbox supervisor: cannot start {command[0]}: {exc}\n")
        os._exit(127)
    _close_all_but(control, wake_r, wake_w)  # what was passed for the command is the command's alone
    status = None
    while status is None:
        ready = {fd for fd, _ in poller.poll()}
        if control in ready:
            kill_descendants()
            os._exit(1)
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        status = reap(block=False, watched=pid)
    if _has_children():
        kill_descendants()  # what the command left behind (orphans are reparented to us)
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


if __name__ == "__main__":  # pragma: no cover - run with -c by the evaluator
    main(sys.argv[1:])

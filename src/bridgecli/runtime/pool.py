"""The process pool every parallel part of bridgecli runs on, and how many processes to start.

:class:`Pool` is :class:`multiprocessing.pool.Pool` without its spinning and with a safe ``terminate``;
:func:`frames_on_pool` hands a stream's zstd frames to a pool, still compressed. The step workers
(:mod:`.workers`) and the shard merge (:mod:`.merge`) both build on them.
"""

from __future__ import annotations

import collections
import multiprocessing.pool
import os
from typing import Any, Callable, Iterator

#: the most bytes of one compressed frame that a worker gets whole (the parent reads a larger one)
MAX_FRAME = 32 << 20


class Pool(multiprocessing.pool.Pool):
    """A pool whose worker-maintaining thread wakes when a worker ends or the pool changes state, and not
    whenever results wait in the result pipe: the standard one also waits on that pipe, so it spins, holding
    the GIL in turns with the thread that reads results, for as long as any wait there (with a frame's worth
    of results per task, most of the time: about half the parent's CPU time)."""

    def _get_sentinels(self):
        return [self._change_notifier._reader]

    def terminate(self) -> None:
        """Stop the pool once its workers have finished the tasks they were handed (a bounded few). Killed
        at once, a worker caught sending a result (a frame's worth: it takes a while) would leave the result
        queue's lock taken, and the pool's task thread would wait for it forever: a hang seen on an
        error's path in the tests, where the pool ends while results are still on their way."""
        if getattr(self, "_state", None) == multiprocessing.pool.RUN:
            self.close()
        self.join()
        super().terminate()


def worker_signals() -> None:
    """A worker dies at once on the SIGTERM of ``Pool.terminate`` (the pool's end, an error): the handler it
    inherits from the CLI would print "bridge: terminated" and unwind through multiprocessing's exit
    handlers, which can wait forever on a lock another worker thread held (a hang seen under load)."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def frames_on_pool(reader, pool, task: Callable, args: tuple, most: int) -> Iterator[tuple[int, int, Any]]:
    """Hand ``reader``'s zstd frames (``reader.frames``) to ``pool`` as ``task(*args, size, frame)``, at
    most ``most`` at a time, and yield ``(offset, end, result)`` per frame in input order. The caller stops
    where a result says the frame cannot be taken whole, and then calls ``reader.restart`` from that
    frame's offset (the frames handed out after it are read again)."""
    pending: collections.deque = collections.deque()  # (frame's offset, its end, its result) in order
    frames = reader.frames(MAX_FRAME)
    more = True
    while True:
        while more and len(pending) < most:
            got = next(frames, None)
            if got is None:
                more = False
                break
            offset, size, frame = got
            pending.append((offset, offset + size, pool.apply_async(task, (*args, size, frame))))
        if not pending:
            return
        offset, end, result = pending.popleft()
        yield offset, end, result.get()


def default_workers() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one, else the CPU count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cap_workers(workers: int, flag: str = "--workers") -> int:
    """``workers`` lowered to :func:`default_workers` (more processes than CPUs only wait on each other
    and hold memory), with a one-line note on stderr when it is."""
    most = max(1, default_workers())
    if workers <= most:
        return workers
    from ..progress import note

    note(f"{flag} {workers} lowered to {most}, the number of CPUs this process may use")
    return most

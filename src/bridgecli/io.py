"""File plumbing shared by every step: ``-`` for stdin/stdout, atomic outputs, TTY checks."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from .errors import InputError, UsageError

STDIO = "-"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def is_stdio(path: str | os.PathLike | None) -> bool:
    return path is None or str(path) == STDIO


def describe(path: str | os.PathLike | None) -> str:
    return "<stdin>" if is_stdio(path) else str(path)


def check_input(path: str | os.PathLike | None, *, hint: str | None = None) -> None:
    """Fail at once (InputError, exit 4, one line naming it) when an input file or folder is missing:
    called by every step before it loads a model. ``-``/None (stdin) passes."""
    if is_stdio(path):
        return
    if not Path(path).exists():
        raise InputError("no such file or folder", file=str(path), hint=hint)


@contextlib.contextmanager
def open_binary_input(path: str | os.PathLike | None) -> Iterator[BinaryIO]:
    """Open ``path`` for binary reading; ``-``/None is stdin, refused when it is a terminal."""
    if is_stdio(path):
        if sys.stdin.isatty():
            raise UsageError("no input: give a FILE argument or pipe a bridge stream into stdin")
        yield sys.stdin.buffer
        return
    p = Path(path)
    check_input(p)
    with open(p, "rb") as fh:
        yield fh


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it over ``path``, on failure remove it."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix + ".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def refuse_terminal(path: str | os.PathLike | None, *, what: str = "a bridge stream") -> None:
    """Fail early (before any expensive work) when binary output would go to a terminal."""
    if is_stdio(path) and sys.stdout.isatty():
        raise UsageError(
            f"refusing to write {what} (binary) to a terminal",
            hint="redirect it (> out.bridge), pipe it into the next step, or pass -o FILE",
        )


@contextlib.contextmanager
def open_binary_output(path: str | os.PathLike | None, *, what: str = "a bridge stream") -> Iterator[BinaryIO]:
    """Open ``path`` for binary writing, atomically (temp file + rename). ``-``/None is stdout,
    refused when stdout is a terminal so binary data never lands on a screen."""
    refuse_terminal(path, what=what)
    if is_stdio(path):
        out = sys.stdout.buffer
        yield out
        out.flush()
        return
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())


@contextlib.contextmanager
def open_text_output(path: str | os.PathLike | None) -> Iterator:
    """Text output: stdout for ``-``/None, otherwise an atomically written file."""
    if is_stdio(path):
        yield sys.stdout
        sys.stdout.flush()
        return
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            yield fh


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder next to ``path``; on success it replaces ``path`` (an existing
    folder is moved aside first and removed after), on failure it is removed."""
    import shutil

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def lock_exclusively(fh, path: str | os.PathLike, what: str) -> None:
    """Hold an advisory lock on the open file ``fh`` for as long as it stays open, so that a second
    bridge process writing the same partial output stops at once with a clear error instead of
    interleaving its writes. Open the file without truncating it first (a lock taken after a
    truncation would come too late). No-op where advisory locks do not exist (Windows)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise UsageError(f"another process is writing this {what}", file=str(path),
                         hint="wait for it to finish, or give this run another output") from None

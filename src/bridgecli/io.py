"""File plumbing shared by every step: ``-`` for stdin/stdout, atomic outputs, TTY checks."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
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
    if path is None or is_stdio(path):
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
    assert path is not None  # None is stdin
    p = Path(path)
    check_input(p)
    if p.is_dir():
        raise UsageError(f"{p}: a folder, not a file")
    with open(p, "rb") as fh:
        yield fh


#: a temporary file or folder is only swept when it is at least this old (seconds) and nobody holds it
STALE_AFTER = 10.0


def _hold(fd: int) -> bool:
    """Lock the open file or folder ``fd`` for this process (released when it is closed); False where
    advisory locks do not exist or the lock is taken."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def sweep_stale(folder: Path, pattern: str) -> list[Path]:
    """Remove what an interrupted run left in ``folder``: temporary files or folders whose names match
    ``pattern`` (a regular expression), that no running process holds (every writer locks its own)
    and that are older than :data:`STALE_AFTER`. Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    regex = re.compile(pattern)
    for entry in entries:
        if not regex.fullmatch(entry.name):
            continue
        path = Path(entry.path)
        try:
            if time.time() - entry.stat(follow_symlinks=False).st_mtime < STALE_AFTER or entry.is_symlink():
                continue
            fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if entry.is_dir() else 0))
        except OSError:
            continue
        try:
            if not _hold(fd):
                continue  # a running writer holds it
            if entry.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed


def _temp_pattern(name: str, suffix: str) -> str:
    """What ``tempfile.mkstemp``/``mkdtemp`` with prefix ``.NAME.`` and this suffix make."""
    return re.escape(f".{name}.") + r"[a-z0-9_]{8}" + re.escape(suffix)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it over ``path``, on failure remove it.
    The temporary file is locked while it exists, and temporary files of earlier runs into the same
    place that were killed before they could clean up are removed first."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{target}: a folder; the output must be a file path", hint="pass -o FOLDER/NAME")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix + ".tmp", dir=target.parent)
    except OSError as exc:
        raise UsageError(f"{target}: cannot write here ({exc.strerror or exc})") from None
    _hold(fd)  # kept open (and locked) until the rename: a sweep by another run leaves it alone
    tmp_path = Path(tmp)
    sweep_stale(target.parent, _temp_pattern(target.name, suffix + ".tmp"))
    try:
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
        yield tmp_path
        os.replace(tmp_path, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise
    finally:
        os.close(fd)


def check_output_file(path: str | os.PathLike | None) -> None:
    """Fail early (before any expensive work) when ``path`` is a folder or cannot be written where
    it lies; ``-``/None (stdout) passes."""
    if path is None or is_stdio(path):
        return
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{target}: a folder; the output must be a file path", hint="pass -o FOLDER/NAME")
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        if not parent.is_dir():
            raise NotADirectoryError(f"{parent} is not a folder")
        with tempfile.TemporaryFile(dir=parent):  # what the atomic write will do there
            pass
    except OSError as exc:
        raise UsageError(f"{target}: cannot write here ({exc.strerror or exc})") from None


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
    assert path is not None  # None is stdout
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
    assert path is not None  # None is stdout
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            yield fh


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder next to ``path``; on success it replaces ``path`` (an existing
    folder is moved aside first and removed after), on failure it is removed."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target}: exists and is not a folder", hint="pass another -o")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    except OSError as exc:
        raise UsageError(f"{target}: cannot write here ({exc.strerror or exc})") from None
    held = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    _hold(held)  # locked while it exists, like atomic_path's files
    sweep_stale(target.parent, _temp_pattern(target.name, ""))
    old = target.with_name(f".{target.name}.old")
    if old.is_dir() and target.exists():  # a run killed between its two renames below
        shutil.rmtree(old, ignore_errors=True)
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(held)


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
        raise UsageError(
            f"another process is writing this {what}",
            file=str(path),
            hint="wait for it to finish, or give this run another output",
        ) from None


@contextlib.contextmanager
def folder_lock(path: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold an advisory lock for the output folder ``path`` while the block runs, so that a second
    bridge process writing the same folder stops at once (:class:`UsageError`) instead of both
    finishing and one run vanishing. The lock file ``.NAME.lock`` lies next to the folder (the
    folder itself may be replaced or cleared) and stays there; it holds nothing."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fh = open(target.parent / f".{target.name}.lock", "a")
    except OSError as exc:
        raise UsageError(f"{target}: cannot write here ({exc.strerror or exc})") from None
    lock_exclusively(fh, target, what)
    try:
        yield
    finally:
        fh.close()

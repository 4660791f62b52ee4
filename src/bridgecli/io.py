"""File plumbing shared by every step: ``-`` for stdin/stdout, atomic outputs, TTY checks, the one
check of what an output may replace (:func:`check_output`), and the one place where a failed write (a
full disk, a file over the size limit, a broken device) becomes one line naming the output and why
(:class:`~bridgecli.errors.WriteError`, exit 7).

Outputs only create or replace regular files (and, for folder outputs, folders): a path that is, or
whose links lead to, a device, a FIFO, a socket, a folder where a file is expected, a link to nothing
or a loop of links is refused, and so is an output that is one of the command's inputs (the same
file, through any link), or a folder holding one. ``-``, ``/dev/stdout`` (and, for inputs,
``/dev/stdin``) name the standard streams.

An output given as a symbolic link is written through it: the temporary file or folder lies next to
the file or folder the link names, which is replaced, and the link stays. Locks are taken on that real
path too, so two runs writing one output through different names see each other."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

from .errors import BridgeError, InputError, UsageError, WriteError

STDIO = "-"
#: how errors name standard output
STDOUT = "<stdout>"
#: other names of the standard streams: what a path that says so means, not the device behind it
STDIO_ALIASES = frozenset({STDIO, "/dev/stdout", "/dev/stdin"})


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: errno values of a write that failed for want of room or of a working device (not the user's flags)
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})

_WRITE_HINTS = {
    errno.ENOSPC: "free some space or write elsewhere, then run again",
    errno.EDQUOT: "the disk quota is used up: free some space or write elsewhere, then run again",
    errno.EFBIG: "the file outgrew the file size limit that `ulimit -f` sets, or the largest file the file system holds",
    errno.EIO: "the device reported an error",
    errno.EROFS: "the file system is read-only",
}

#: how libraries that write files themselves report the OS error underneath (safetensors, the Rust std)
_OS_ERROR_IN_TEXT = re.compile(r"\(os error (\d+)\)|Os \{ code: (\d+)")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling (as a traceback would show them)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


#: torch's serializer's own words after the "[enforce fail at inline_container.cc:N] ." it starts with
_TORCH_WORDS = re.compile(r"^\s*\[enforce fail at inline_container\.cc:\d+\]\s*\.?\s*")


def failed_write(exc: BaseException) -> tuple[int | None, str] | None:
    """``(errno, reason)`` when ``exc`` is (or was raised from) a write that failed for want of room or
    of a working device: an ``OSError`` with an errno in :data:`WRITE_ERRNOS`, safetensors' error
    wrapping one, or torch's serializer failing to write a file it opened itself (its errno is lost:
    None, and the reason is its own words). None otherwise, and always for a :class:`BridgeError`
    (already the user's one line)."""
    for cause in _causes(exc):
        if isinstance(cause, BridgeError):
            return None
        if isinstance(cause, OSError) and cause.errno in WRITE_ERRNOS:
            return cause.errno, os.strerror(cause.errno)
        text = str(cause)
        if type(cause).__name__ == "SafetensorError" and (m := _OS_ERROR_IN_TEXT.search(text)):
            code = int(m.group(1) or m.group(2))
            if code in WRITE_ERRNOS:
                return code, os.strerror(code)
        if isinstance(cause, RuntimeError) and "inline_container.cc" in text:  # torch.save's writer
            words = _TORCH_WORDS.sub("", text.strip().splitlines()[0] if text.strip() else "").strip()
            return None, f"torch's writer failed ({words or 'no reason given'})"
    return None


def free_bytes(path: str | os.PathLike) -> int | None:
    """The bytes an unprivileged writer may still put on the file system that holds ``path`` (or its
    nearest existing folder above it); None when none can be asked."""
    start = Path(path).absolute()
    for folder in (start, *start.parents):
        with contextlib.suppress(OSError):
            st = os.statvfs(folder)
            return st.f_bavail * st.f_frsize
    return None


def human_bytes(n: float) -> str:
    """``n`` bytes in words: 512 B, 3.4 MB, 18.0 GB (powers of 1000, as df -H)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


#: the probe write that finds the errno a writer lost (:func:`probe_errno`)
_PROBE_BYTES = 1 << 20


def probe_errno(path: str | os.PathLike) -> int | None:
    """Why a write next to ``path`` fails now, found by trying one (a temporary file of 1 MiB, synced and
    removed, in its nearest existing folder): the errno of :data:`WRITE_ERRNOS` it fails with, or None
    when it goes through (or fails otherwise)."""
    start = Path(path).absolute()
    folder = next((f for f in (start, *start.parents) if f.is_dir()), None)
    if folder is None:
        return None
    try:
        with tempfile.TemporaryFile(dir=folder) as fh:
            chunk = b"\0" * 65536
            for _ in range(_PROBE_BYTES // len(chunk)):
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        return exc.errno if exc.errno in WRITE_ERRNOS else None
    return None


def write_error(exc: BaseException, path: str | os.PathLike | None) -> WriteError | None:
    """The one-line :class:`WriteError` for ``exc`` when it is a failed write (:func:`failed_write`) of
    the output ``path`` (``-``: standard output; None: the file the OS error names, if any); None when it
    is something else. It says why: the OS's reason and its errno's name (ENOSPC, EDQUOT, EIO, ...); for
    a full disk or quota, the room left there; where the writer lost the errno (torch's serializer), the
    errno of a probe write next to the output (:func:`probe_errno`), else the writer's own words. Call it
    before the failed write's files are removed (they hold the room it took)."""
    found = failed_write(exc)
    if found is None:
        return None
    code, reason = found
    if path is None:
        path = next((c.filename for c in _causes(exc) if isinstance(c, OSError) and c.filename), None)
    on_disk = path is not None and str(path) != STDIO
    if code is None and on_disk:
        assert path is not None
        probed = probe_errno(path)
        if probed is not None:
            code, reason = probed, os.strerror(probed)
    if code is not None:
        reason = f"{reason} ({errno.errorcode.get(code, code)}"
        free = free_bytes(path) if on_disk and code in (errno.ENOSPC, errno.EDQUOT) else None  # type: ignore[arg-type]
        reason += f", {human_bytes(free)} free there)" if free is not None else ")"
    return WriteError(
        f"cannot write: {reason}",
        file=None if path is None else STDOUT if str(path) == STDIO else str(path),
        hint=_WRITE_HINTS.get(code) if code is not None else None,
    )


@contextlib.contextmanager
def reporting_write_errors(path: str | os.PathLike | None) -> Iterator[None]:
    """Turn a failed write (:func:`failed_write`) in the block into a :class:`WriteError` naming ``path``."""
    try:
        yield
    except Exception as exc:
        err = write_error(exc, path)
        if err is None:
            raise
        raise err from None


def _silence(stream) -> None:
    """After a failed write to standard output: point its descriptor at /dev/null, so that what is still
    buffered goes nowhere at exit instead of failing once more (Python would print that failure and
    exit 120). A stream with no descriptor (a test's capture) is left alone."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class _GuardedStream:
    """Standard output (text, or its binary ``buffer``) as a command sees it: a write or flush that
    fails is a :class:`WriteError` naming ``<stdout>`` (``> /dev/full``, a full disk), or the
    ``BrokenPipeError`` of a reader that went away. Everything else is the stream's own."""

    def __init__(self, stream, raised: list[BaseException] | None = None):
        self._stream = stream
        self._buffer: _GuardedStream | None = None
        self.raised: list[BaseException] = [] if raised is None else raised  # shared with .buffer

    def _failed(self, exc: OSError) -> BaseException:
        out = exc if isinstance(exc, BrokenPipeError) else write_error(exc, STDIO) or exc
        self.raised.append(out)
        return out

    def write(self, data):
        try:
            return self._stream.write(data)
        except OSError as exc:
            raise self._failed(exc) from None

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise self._failed(exc) from None

    @property
    def buffer(self) -> "_GuardedStream":
        if self._buffer is None:
            self._buffer = _GuardedStream(self._stream.buffer, self.raised)
        return self._buffer

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_stdout() -> Iterator[None]:
    """Run the block with ``sys.stdout`` guarded (:class:`_GuardedStream`), and flush it at the end, so
    that a failure to write the output is reported in one line instead of being lost at exit. When the
    block ends by such a failure, standard output is silenced (:func:`_silence`) and the failure is
    raised as it was (whatever a library turned it into); a failure that the block caught (a library
    probing the stream) changes nothing."""
    original = sys.stdout
    if original is None:
        yield
        return
    guarded = _GuardedStream(original)
    sys.stdout = guarded
    try:
        yield
        guarded.flush()
    except BaseException as exc:
        ours = next((c for c in _causes(exc) if any(c is r for r in guarded.raised)), None)
        if ours is None:
            raise
        _silence(original)
        if ours is exc:
            raise
        raise ours from None  # what a library made of it (rich: SystemExit(1) for a closed pipe)
    finally:
        if sys.stdout is guarded:
            sys.stdout = original


def silence_stdout() -> None:
    """Standard output's reader went away (EPIPE): drop what is still buffered for it (see :func:`_silence`)."""
    _silence(sys.stdout)


def real_path(path: str | os.PathLike) -> Path:
    """Where an output named ``path`` really lies: symbolic links (of the file or folder itself and of
    the folders above it) followed. Locks, temporary files and renames use this path, so that a run
    writing through a link and one writing the real name share one lock, and the link stays a link."""
    return Path(os.path.realpath(path))


def is_stdio(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` names standard input or output: None, ``-``, ``/dev/stdout`` or ``/dev/stdin``."""
    return path is None or str(path) in STDIO_ALIASES


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


# -- what an output may replace ------------------------------------------------------------------

_NOT_REGULAR = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)
_ONLY_FILES = "bridge writes only regular files; for standard output pass -o - (or /dev/stdout)"


def _kind(st: os.stat_result) -> str:
    """What a ``stat`` says a path is, in words."""
    for test, kind in _NOT_REGULAR:
        if test(st.st_mode):
            return kind
    return "a folder" if stat.S_ISDIR(st.st_mode) else "a file"


def _link_trail(path: Path) -> str:
    """`` -> TARGET`` when ``path`` is a symbolic link (what it says), else ""."""
    try:
        return f" -> {os.readlink(path)}"
    except OSError:
        return ""


def output_target(path: str | os.PathLike, *, folder: bool = False) -> os.stat_result | None:
    """What the output ``path`` names, symbolic links followed: its ``stat``, or None where nothing is
    yet (and it can be made: no link to nothing on the way to it). A :class:`UsageError` naming it
    (exit 2, one line) when it is a link to nothing, a loop of links, a device, a FIFO or a socket, a
    folder where a file is expected (``folder`` False) or a file where a folder is (``folder`` True),
    or when a folder on the way to it is a link to nothing or a file."""
    target = Path(path)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        if os.path.islink(target):
            raise UsageError(
                f"{target}: a link to nothing{_link_trail(target)}",
                hint="bridge does not create what a dangling link names: remove the link or pass another -o",
            ) from None
        _check_missing_parents(target)
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(f"{target}: a loop of symbolic links", hint="pass another -o") from None
        if exc.errno == errno.ENOTDIR:
            _check_missing_parents(target)  # names the one in the way
            raise UsageError(f"{target}: a folder on the way to it is not one", hint="pass another -o") from None
        raise UsageError(f"{target}: cannot write here ({exc.strerror or exc})") from None
    where = f" ({os.path.realpath(target)})" if os.path.islink(target) else ""
    for test, kind in _NOT_REGULAR:
        if test(st.st_mode):
            raise UsageError(f"{target}: {kind}{where}, not a file bridge may replace", hint=_ONLY_FILES)
    if stat.S_ISDIR(st.st_mode) and not folder:
        raise UsageError(f"{target}{where}: a folder; the output must be a file path", hint="pass -o FOLDER/NAME")
    if not stat.S_ISDIR(st.st_mode) and folder:
        raise UsageError(f"{target}{where}: exists and is not a folder", hint="pass another -o")
    return st


def _check_missing_parents(target: Path) -> None:
    """The folders on the way to a missing output that are missing too (they will be made): none may
    be a link to nothing (it would make the folder it names, wherever that is), and the first that
    exists must be a folder."""
    parent = target.absolute().parent
    while not os.path.exists(parent):
        if os.path.islink(parent):
            raise UsageError(
                f"{target}: {parent} is a link to nothing{_link_trail(parent)}",
                hint="bridge does not create what a dangling link names: remove the link or pass another -o",
            )
        if parent == parent.parent:
            break
        parent = parent.parent
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise UsageError(f"{target}: {parent} is {_kind(os.stat(parent))}, not a folder", hint="pass another -o")


def _refuse_stdout(path: str | os.PathLike) -> None:
    raise UsageError(f"{path}: standard output cannot take this output", hint="pass a file path")


def _empty(folder: str | os.PathLike) -> bool:
    with os.scandir(os.fspath(folder)) as entries:
        return next(entries, None) is None


def check_output(
    path: str | os.PathLike | None,
    *,
    inputs: Iterable[str | os.PathLike | None] = (),
    folder: bool = False,
    ours: Callable[[Path], bool] | None = None,
    stdout: bool = True,
) -> None:
    """Refuse, before any work (:class:`UsageError`, exit 2, one line naming it), an output that a
    command must not write: what :func:`output_target` refuses; one that is the same file as one of
    ``inputs`` (device and inode compared, so through any link, hard links too), or, for a ``folder``
    output, a folder that holds one of them (replacing it would delete it); and, for a ``folder``
    output with ``ours``, a non-empty folder that ``ours`` does not recognise as one this command
    wrote (``ours=None``: the command judges the contents itself). Standard output passes where the
    command can write there (``stdout``; never for a ``folder``)."""
    if is_stdio(path):
        if path is not None and (folder or not stdout):
            _refuse_stdout(path)
        return
    assert path is not None
    st = output_target(path, folder=folder)
    if st is None:
        return
    real = os.path.realpath(path)
    for inp in inputs:
        if inp is None or is_stdio(inp):
            continue
        try:
            ist = os.stat(inp)
        except OSError:
            continue  # a missing input is the input check's to report
        if (st.st_dev, st.st_ino) == (ist.st_dev, ist.st_ino):
            raise UsageError(
                f"{path}: the same file as the input {inp}: writing it would destroy the input",
                hint="pass another -o",
            )
        if folder and os.path.commonpath([real, os.path.realpath(inp)]) == real:
            raise UsageError(
                f"{path}: holds the input {inp}: replacing the folder would delete it", hint="pass another -o"
            )
    if folder and ours is not None and not _empty(path) and not ours(Path(path)):
        raise UsageError(
            f"{path}: a folder that is not empty and was not written by this command",
            hint="pass another -o, or empty it",
        )


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
    place that were killed before they could clean up are removed first. A failed write in the block
    (a full disk, ...) is a :class:`WriteError` naming ``path``; an earlier file there is kept. A
    ``path`` that is a symbolic link stays one: the file it names is replaced."""
    if is_stdio(path):
        _refuse_stdout(path)
    target = Path(path)
    output_target(target)
    real = real_path(target)
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=suffix + ".tmp", dir=real.parent)
    except OSError as exc:
        raise write_error(exc, target) or UsageError(f"{target}: cannot write here ({exc.strerror or exc})") from None
    _hold(fd)  # kept open (and locked) until the rename: a sweep by another run leaves it alone
    tmp_path = Path(tmp)
    sweep_stale(real.parent, _temp_pattern(real.name, suffix + ".tmp"))
    try:
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
        yield tmp_path
        os.replace(tmp_path, real)
    except BaseException as exc:
        err = write_error(exc, target) if isinstance(exc, Exception) else None  # before the room is given back
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        if err is not None:
            raise err from None
        raise
    finally:
        os.close(fd)


def check_output_file(path: str | os.PathLike | None, *, inputs: Iterable[str | os.PathLike | None] = ()) -> None:
    """Fail early (before any expensive work) when ``path`` may not be written (:func:`check_output`)
    or cannot be written where it lies; ``-``/None (stdout) passes."""
    if path is None or is_stdio(path):
        return
    check_output(path, inputs=inputs)
    target = Path(path)
    parent = real_path(target).parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        if not parent.is_dir():
            raise NotADirectoryError(f"{parent} is not a folder")
        with tempfile.TemporaryFile(dir=parent):  # what the atomic write will do there
            pass
    except OSError as exc:
        raise write_error(exc, target) or UsageError(f"{target}: cannot write here ({exc.strerror or exc})") from None


def check_stream_output(
    path: str | os.PathLike | None,
    *,
    inputs: Iterable[str | os.PathLike | None] = (),
    what: str = "a bridge stream",
    binary: bool = True,
) -> bool:
    """Fail early (before any expensive work), one line, when the output ``path`` may not or cannot be
    written (:func:`check_output_file`: what it would replace, ``inputs`` included) or, for ``binary``
    output, when it is standard output on a terminal (:func:`refuse_terminal`); returns whether it is
    standard output (``-``/None)."""
    check_output_file(path, inputs=inputs)
    if binary:
        refuse_terminal(path, what=what)
    return is_stdio(path)


def refuse_terminal(path: str | os.PathLike | None, *, what: str = "a bridge stream") -> None:
    """Fail early (before any expensive work) when binary output would go to a terminal."""
    if is_stdio(path) and sys.stdout.isatty():
        raise UsageError(
            f"refusing to write {what} (binary) to a terminal",
            hint="redirect it (> out.bridge), pipe it into the next step, or pass -o FILE",
        )


@contextlib.contextmanager
def open_binary_output(
    path: str | os.PathLike | None, *, what: str = "a bridge stream", refuse: bool = True
) -> Iterator[BinaryIO]:
    """Open ``path`` for binary writing, atomically (temp file + rename). ``-``/None is stdout,
    refused when stdout is a terminal so binary data never lands on a screen (unless ``refuse`` is
    false: text bytes); a failed write to stdout is reported by the command line's guard,
    :func:`guarded_stdout`."""
    if refuse:
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
    folder is moved aside first and removed after), on failure it is removed. A failed write in the
    block (a full disk, ...) is a :class:`WriteError` naming ``path``; an earlier folder there is kept.
    A ``path`` that is a symbolic link stays one: the folder it names is replaced."""
    if is_stdio(path):
        _refuse_stdout(path)
    target = Path(path)
    output_target(target, folder=True)
    real = real_path(target)
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{real.name}.", dir=real.parent))
    except OSError as exc:
        raise write_error(exc, target) or UsageError(f"{target}: cannot write here ({exc.strerror or exc})") from None
    held = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    _hold(held)  # locked while it exists, like atomic_path's files
    sweep_stale(real.parent, _temp_pattern(real.name, ""))
    old = moved_aside(real)
    if old.is_dir() and real.exists():  # a run killed between its two renames below
        shutil.rmtree(old, ignore_errors=True)
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
        replace_dir(tmp, real)
    except BaseException as exc:
        err = write_error(exc, target) if isinstance(exc, Exception) else None  # before the room is given back
        shutil.rmtree(tmp, ignore_errors=True)
        if err is not None:
            raise err from None
        raise
    finally:
        os.close(held)


def moved_aside(real: Path) -> Path:
    """Where :func:`replace_dir` moves the folder ``real`` (a real path) aside: ``.NAME.old`` beside it."""
    return real.with_name(f".{real.name}.old")


def replace_dir(new: str | os.PathLike, path: str | os.PathLike) -> None:
    """Put the folder ``new`` (written next to it) in the place of the folder ``path`` (symbolic links
    followed: :func:`real_path`): an existing folder there is moved aside to ``.NAME.old`` first and
    removed after, so that a run killed between the two renames leaves the old folder whole."""
    real = real_path(path)
    if not real.exists():
        os.replace(new, real)
        return
    old = moved_aside(real)
    shutil.rmtree(old, ignore_errors=True)
    os.replace(real, old)
    os.replace(new, real)
    shutil.rmtree(old, ignore_errors=True)


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
    folder itself may be replaced or cleared); it holds nothing, and it is removed when the block
    ends, whether it succeeds, fails or is interrupted (Ctrl-C, SIGTERM). One left by a run killed
    outright (SIGKILL, a lost machine) is stale: the next run says so and removes it. It is named
    after the real folder (:func:`real_path`), so a run through a symbolic link to the folder takes
    the same lock. A failed write in the block that no inner writer reported is a :class:`WriteError`
    naming the folder."""
    if is_stdio(path):
        _refuse_stdout(path)
    target = Path(path)
    output_target(target, folder=True)
    real = real_path(target)
    lock = real.parent / f".{real.name}.lock"
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        fh = _take_lock_file(lock, target, what)
    except OSError as exc:
        raise write_error(exc, target) or UsageError(f"{target}: cannot write here ({exc.strerror or exc})") from None
    try:
        with reporting_write_errors(target):
            yield
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()  # while still held: a run waiting on this file sees it gone and makes its own
        fh.close()


def _take_lock_file(lock: Path, target: Path, what: str):
    """Create ``lock`` and hold it (its open file). A lock file that exists is either held (another
    run is writing ``target``: :class:`UsageError`) or stale (no process holds it): then a note says
    so, it is removed, and a fresh one is made. After taking the lock the file must still be the one
    at ``lock``: a run that ends removes its lock file while holding it, so a file opened just
    before that removal is locked in vain, and this tries again."""
    from .progress import note

    for _ in range(100):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            created = True
        except FileExistsError:
            try:
                fd = os.open(lock, os.O_RDWR)
            except FileNotFoundError:  # removed in between by the run that held it
                continue
            created = False
        fh = os.fdopen(fd, "r+b")
        lock_exclusively(fh, target, what)  # closes fh and raises when another run holds it
        try:
            current = os.stat(lock)
        except FileNotFoundError:
            current = None
        if current is None or not os.path.samestat(os.fstat(fd), current):
            fh.close()
            continue
        if not created:
            note(f"removed the stale lock file {lock}: a run into {target} stopped without removing it (killed?)")
            lock.unlink()
            fh.close()
            continue
        return fh
    raise UsageError(f"{lock}: could not take the lock (it kept changing)", file=str(target))

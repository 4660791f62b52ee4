"""Progress on stderr (stdout stays clean for piping).

Four modes, chosen once per process (:func:`mode`):

- ``bar``: a rich bar that redraws in place, when stderr is a terminal and the process is not part
  of a pipe;
- ``lines``: inside a pipe (stdin or stdout a pipe) several bridge processes share one terminal, and
  bars redrawing in place would overwrite each other; each process instead prints whole lines of
  its own: one every :data:`LINE_EVERY` seconds while a long step runs, and one summary line when it
  ends (a step that ends sooner prints only the summary);
- ``log``: stderr is a file or a pipe to a logger (tmux logging, nohup, CI, a cluster queue): plain
  lines as in ``lines``, one every :data:`LOG_EVERY` seconds and one at each tenth of a known total
  (unless a line came in the last :data:`MILESTONE_GAP` seconds), and the summary line;
- ``off``: ``BRIDGE_NO_PROGRESS`` is set (tests, grid scripts).

Every bar and line shows the rate and, when the total is known, the ETA, both averaged since the
task started (a windowed estimate shows nothing while single steps take minutes). A line comes on
time even while one unit of work (a training step, a scoring pass) takes minutes: a thread of
:class:`LineProgress` prints the line when it is due, not the next update.

Why not rich's own output for files: rich's Live draws nothing on a console that is not a terminal
until it stops, and then the final bar once (``Live.refresh``); tqdm redraws with carriage returns,
which a log keeps as one endless line. So ``lines`` and ``log`` keep rich's Progress for what it
tracks (tasks, counts, times, rates) with its display off, and print whole lines themselves.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.text import Text

stderr = Console(stderr=True)
#: seconds between two progress lines of one task in ``lines`` mode (a pipe on a terminal)
LINE_EVERY = 10.0
#: seconds between two progress lines of one task in ``log`` mode (stderr not a terminal)
LOG_EVERY = 30.0
#: in ``log`` mode, a line at each of these fractions of a known total ...
MILESTONE = 0.1
#: ... unless the task printed a line this many seconds ago or less (a quick loop prints its summary only)
MILESTONE_GAP = 3.0


def enabled() -> bool:
    """Progress of any kind (off under ``BRIDGE_NO_PROGRESS``)."""
    return os.environ.get("BRIDGE_NO_PROGRESS") is None


def _is_pipe(fd: int) -> bool:
    try:
        mode_ = os.fstat(fd).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode_) or stat.S_ISSOCK(mode_)


def in_pipe() -> bool:
    """Whether this process reads from or writes to a pipe (another process shares the terminal)."""
    return _is_pipe(0) or _is_pipe(1)


def mode(console: Console | None = None) -> str:
    """``bar``, ``lines``, ``log`` or ``off`` (see the module docstring)."""
    return shown_mode(console) if enabled() else "off"


def shown_mode(console: Console | None = None) -> str:
    """How progress shows on ``console`` (default: stderr) when it shows: ``log`` when that is not a
    terminal, else ``lines`` inside a pipe and ``bar`` outside one."""
    if not (console or stderr).is_terminal:
        return "log"
    return "lines" if in_pipe() else "bar"


# ---------------------------------------------------------------------------------------------
# rate and ETA, averaged since the task started


def _done(task: Task) -> float:
    return task.completed - task.fields.get("_start", 0)


def rate(task: Task) -> float | None:
    """Units per second since the task started (None before the first unit)."""
    elapsed = task.elapsed
    done = _done(task)
    if not elapsed or done <= 0:
        return None
    return done / elapsed


def eta(task: Task) -> float | None:
    """Seconds left at the average rate (None: unknown total or no rate yet)."""
    r = rate(task)
    if task.total is None or r is None:
        return None
    return max(0.0, (task.total - task.completed) / r)


def plural(unit: str) -> str:
    """``step`` -> ``steps``; abbreviations (``ex``, ``it``) stay as they are."""
    return unit if unit in ("ex", "it") or unit.endswith("s") else unit + "s"


def format_rate(task: Task) -> str:
    """``12.3 steps/s``, or ``4.5 s/step`` below one unit per second."""
    r = rate(task)
    unit = task.fields.get("unit", "it")
    if r is None:
        return f"-- {plural(unit)}/s"
    if r < 1:
        return f"{1 / r:,.1f} s/{unit}"
    return f"{r:,.1f} {plural(unit)}/s"


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-:--:--"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(format_rate(task), style="progress.data.speed")


class EtaColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        if task.finished:
            return Text("")
        return Text("ETA " + format_seconds(eta(task)), style="progress.remaining")


class CountColumn(ProgressColumn):
    """``done/total``, or ``done`` when the total is unknown."""

    def __init__(self):
        super().__init__()
        self._mofn = MofNCompleteColumn()

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text(f"{int(task.completed)}", style="progress.download")
        return self._mofn.render(task)


class BridgeProgress(Progress):
    """A rich Progress whose tasks remember where they started (for the average rate)."""

    def add_task(self, description, start=True, total=100.0, completed=0, visible=True, **fields):
        fields.setdefault("_start", completed)
        return super().add_task(description, start=start, total=total, completed=completed, visible=visible, **fields)


def _fields_text(task: Task) -> str:
    shown = [f"{k} {v}" for k, v in task.fields.items() if not k.startswith("_") and k != "unit" and v != "-"]
    return (", " + ", ".join(shown)) if shown else ""


def progress_line(task: Task, *, final: bool = False) -> str:
    """One line of ``lines`` mode."""
    count = f"{int(task.completed)}" + (f"/{int(task.total)}" if task.total is not None else "")
    unit = plural(task.fields.get("unit", "it"))
    if final:
        return (
            f"{task.description}: {count} {unit} in {task.elapsed or 0.0:.1f} s ({format_rate(task)})"
            + _fields_text(task)
        )
    share = f" {100 * task.completed / task.total:.0f}%" if task.total else ""
    left = f", ETA {format_seconds(eta(task))}" if task.total is not None else ""
    return (
        f"{task.description}: {count} {unit}{share} after {format_seconds(task.elapsed or 0.0)} "
        f"({format_rate(task)}{left})" + _fields_text(task)
    )


class LineProgress(BridgeProgress):
    """``lines`` and ``log`` modes: no live display; a whole line per task every ``every`` seconds
    (printed by a thread when no update comes in time), with ``milestones`` also one at each tenth of
    a known total, and a summary line per task at the end."""

    def __init__(self, *columns, console=None, every: float = LINE_EVERY, milestones: bool = False, **kwargs):
        kwargs["disable"] = True
        super().__init__(*columns, console=console, **kwargs)
        self._out = console or stderr
        self._every = every
        self._milestones = milestones
        self._last: dict = {}  # task id -> when it last printed (its start before that)
        self._tenth: dict = {}  # task id -> the last tenth of its total it reached
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def _maybe_print(self, task_id) -> None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None or task.finished or not task.visible or task.start_time is None:
                return  # the summary line says the rest
            now = self.get_time()
            last = self._last.setdefault(task_id, task.start_time)
            due = now - last >= self._every
            if self._milestones and task.total:
                tenth = int(min(task.completed, task.total) / task.total / MILESTONE + 1e-9)
                if tenth > self._tenth.setdefault(task_id, tenth):
                    self._tenth[task_id] = tenth
                    due = due or now - last > MILESTONE_GAP
            if not due:
                return
            self._last[task_id] = now
            line = progress_line(task)
        self._out.print(line, highlight=False, soft_wrap=True, markup=False, emoji=False)

    def tick(self) -> None:
        """Print every task's line that is due (the thread calls this about once a second)."""
        for task_id in list(self._tasks):
            self._maybe_print(task_id)

    def _beat(self) -> None:
        while not self._stopping.wait(min(1.0, self._every / 4)):
            self.tick()

    def add_task(self, description, start=True, total=100.0, completed=0, visible=True, **fields):
        task_id = super().add_task(
            description, start=start, total=total, completed=completed, visible=visible, **fields
        )
        if total:  # a resumed task's first milestone is the next tenth after where it starts
            self._tenth[task_id] = int(min(completed, total) / total / MILESTONE + 1e-9)
        return task_id

    def update(self, task_id, **kwargs):
        super().update(task_id, **kwargs)
        self._maybe_print(task_id)

    def advance(self, task_id, advance: float = 1):
        super().advance(task_id, advance)
        self._maybe_print(task_id)

    def start(self) -> None:
        super().start()
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._beat, name="bridge-progress-lines", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for task in self.tasks:
            if task.visible:
                self._out.print(
                    progress_line(task, final=True), highlight=False, soft_wrap=True, markup=False, emoji=False
                )
        super().stop()


def make_progress(
    show: bool | None = None, *extra: ProgressColumn, console: Console | None = None, rate_column: bool = True
) -> Progress:
    """A Progress (use it as a context manager) in the mode this process should use: ``show=None``
    decides by :func:`mode`, False turns it off, True shows it even under ``BRIDGE_NO_PROGRESS`` (a bar
    on a terminal, lines elsewhere: :func:`shown_mode`). ``rate_column=False`` for a caller whose
    ``extra`` columns already show a rate (tokens/s)."""
    chosen = mode(console) if show is None else (shown_mode(console) if show else "off")
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        CountColumn(),
        *extra,
        *((RateColumn(),) if rate_column else ()),
        TimeElapsedColumn(),
        EtaColumn(),
    )
    if chosen == "lines":
        return LineProgress(*columns, console=console)
    if chosen == "log":
        return LineProgress(*columns, console=console, every=LOG_EVERY, milestones=True)
    return BridgeProgress(*columns, console=console or stderr, disable=chosen == "off", transient=False)


@contextlib.contextmanager
def progress_bar(show: bool | None = None) -> Iterator[Progress]:
    with make_progress(show) as bar:
        yield bar


def note(message: str) -> None:
    """A one-line status message on stderr, printed as it is: no rich markup or emoji codes, and every
    control character written as a visible escape (the ids and names it may quote are data)."""
    from .display import printable

    stderr.print(printable(message), highlight=False, soft_wrap=True, markup=False, emoji=False)


__all__ = [
    "LINE_EVERY",
    "LOG_EVERY",
    "enabled",
    "in_pipe",
    "make_progress",
    "mode",
    "note",
    "progress_bar",
    "shown_mode",
]

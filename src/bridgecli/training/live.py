"""The live view of a training run on stderr: step, loss, lr, tokens/s, elapsed, ETA.

Shown only by rank 0, and not under BRIDGE_NO_PROGRESS: a bar on a terminal, plain lines in a pipe or
a log (:mod:`bridgecli.progress`); metrics.jsonl carries the same numbers for machines.
"""

from __future__ import annotations

from rich.progress import TextColumn

from ..progress import make_progress


class LiveView:
    def __init__(self, total: int, done: int = 0, *, show: bool | None = None, title: str = "train", console=None):
        self.bar = make_progress(
            show,
            TextColumn("loss [cyan]{task.fields[loss]}"),
            TextColumn("lr {task.fields[lr]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            console=console,
            rate_column=False,
        )  # tok/s is the rate here
        self.task = self.bar.add_task(title, total=total, completed=done, loss="-", lr="-", tps="-", unit="step")

    def __enter__(self) -> "LiveView":
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def update(self, rec: dict) -> None:
        self.bar.update(
            self.task,
            completed=rec["step"],
            loss=f"{rec['loss']:.4f}",
            lr=f"{rec['lr']:.2e}",
            tps=f"{rec['tokens_per_s']:,.0f}",
        )

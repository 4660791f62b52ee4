"""Two passes over one input stream, for selectors whose budgets depend on the whole stream
(:meth:`bridgecli.hookspecs.Selector.prepare`) and for ``--budget global``."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from typing import Iterator

from ..format.reader import open_reader
from ..hookspecs import Plan, Selector
from ..io import is_stdio, reporting_write_errors
from ..progress import note
from .common import naming, require_stage


@contextlib.contextmanager
def rereadable(inp: str | None) -> Iterator[str | None]:
    """``inp`` itself when it is a file; for stdin, a temporary copy (removed afterwards) so that the
    stream can be read twice."""
    if not is_stdio(inp):
        yield inp
        return
    if sys.stdin.isatty():
        yield inp  # open_reader reports the missing input
        return
    fd, path = tempfile.mkstemp(prefix="bridge-select-", suffix=".bridge")
    try:
        with reporting_write_errors(path), os.fdopen(fd, "wb") as fh:  # a full /tmp: one line naming the copy
            shutil.copyfileobj(sys.stdin.buffer, fh, 1 << 20)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def first_pass(
    selector: Selector, inp: str | None, rho_p: float, rho_r: float, options: dict, display: str | None = None
) -> Plan:
    """Run the selector's ``prepare`` over the stream (``options``: what its ``parse`` returned);
    returns its plan. ``display`` names the input in errors."""
    with open_reader(inp) as reader:
        require_stage(reader.header, "scores", display or reader.name, "run `bridge score` first")
        with naming(display or reader.name):
            plan = selector.prepare(iter(reader), rho_p, rho_r, options)
    summary = plan.summary
    if summary.get("unmatched_by"):
        note(
            f"keeping the unselected side whole already exceeds the matched total by {summary['unmatched_by']} "
            f"tokens: the selected side gets none (see docs/compared-methods.md, budget matching)"
        )
    return plan

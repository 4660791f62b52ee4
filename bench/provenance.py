"""Where a benchmark result came from: the commit of the checkout that made it.

Not part of the package: bench scripts in every folder import it from ``bench/``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str | None:
    """HEAD of this checkout, with ``+dirty`` when tracked files differ from it; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
    except OSError:
        return None
    sha = head.stdout.strip()
    if not sha:
        return None
    return sha + ("+dirty" if dirty.stdout.strip() else "")

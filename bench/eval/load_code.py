"""Python files imported by path, for benchmarks that measure code other than the ``bridgecli`` on the
path: a file of this checkout, or one of the package as it was at another commit (from git).
Shared by gen_speed.py, math_graders.py and sandbox_limits.py; standard library only."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def import_file(path: Path, name: str):
    """The file at ``path`` imported as the module ``name`` (registered in ``sys.modules``: a dataclass
    or a relative import looks its module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def import_at(rev: str, path: str, name: str):
    """The repository's file ``path`` as it was at commit ``rev``, imported as the module ``name``."""
    text = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:{path}"], capture_output=True, text=True, check=True
    ).stdout
    copy = Path(tempfile.mkdtemp()) / Path(path).name
    copy.write_text(text)
    return import_file(copy, name)

"""Plain type labels in ``--help``: TEXT, INTEGER, FLOAT, PATH (as click writes them) instead of the
Python annotations Typer shows (``<list[str]>``, ``<str>``, ``<bool>`` on a flag)."""

from __future__ import annotations

import functools
import re

_NAMES = {
    "str": "TEXT",
    "int": "INTEGER",
    "float": "FLOAT",
    "bool": "BOOLEAN",
    "path": "PATH",
    "file": "FILE",
    "directory": "DIRECTORY",
    "datetime": "DATETIME",
    "uuid": "UUID",
}


def clean(label: str | None) -> str | None:
    """``<list[str]>`` -> ``TEXT``, ``<int range>`` -> ``INTEGER RANGE``, ``<a|b>`` -> ``[a|b]``; anything
    unknown is returned without its angle brackets."""
    if not label:
        return label
    inner = label[1:-1] if label.startswith("<") and label.endswith(">") else label
    while (m := re.fullmatch(r"list\[(.*)\]", inner)) is not None:
        inner = m.group(1)
    if inner in _NAMES:
        return _NAMES[inner]
    if inner.endswith(" range") and inner[:-6] in _NAMES:
        return f"{_NAMES[inner[:-6]]} RANGE"
    if "|" in inner:
        return f"[{inner}]"
    return inner.upper() if inner.isidentifier() else inner


def install() -> None:
    """Patch Typer's parameter classes once so every command's help shows the plain labels (flags
    show none)."""
    try:
        from typer.core import _TyperParameter
    except ImportError:  # another Typer: keep its labels
        return
    if getattr(_TyperParameter.display_type, "_bridge", False):
        return
    original = _TyperParameter.display_type

    @functools.wraps(original)
    def display_type(self, ctx):
        if getattr(self, "is_flag", False):  # --resume, --tf32/--no-tf32, --help: no value to label
            return None
        return clean(original(self, ctx))

    display_type._bridge = True  # type: ignore[attr-defined]  # a marker on the wrapper: patched once
    _TyperParameter.display_type = display_type  # type: ignore[method-assign]  # patching typer's label

    from typer.core import TyperArgument

    def usage_name(self) -> str:  # "eval [OPTIONS] MODEL...", not "{model}..."
        name = self.metavar or (self.name or "").upper()
        name = name if self.required else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")

    if hasattr(TyperArgument, "_usage_display_name"):
        TyperArgument._usage_display_name = usage_name  # type: ignore[method-assign]  # patching typer's usage line

"""Plain type labels in ``--help``: TEXT, INTEGER, FLOAT, PATH (as click writes them) instead of the
Python annotations Typer shows (``<list[str]>``, ``<str>``, ``<bool>`` on a flag), and ``MODEL...``
instead of ``{model}...`` on the usage line.

Through Typer's public classes only: :class:`Command` and :class:`Group` (given to Typer as ``cls``)
turn their parameters (Click's public ``get_params``) into :class:`PlainOption` and
:class:`PlainArgument`, subclasses of ``typer.core.TyperOption`` and ``TyperArgument`` that override
the public ``display_type`` and ``get_usage_pieces``. Were a Typer upgrade to drop those methods, the
labels would only go back to Typer's own.

The help is text, not Rich markup: Typer's ``rich`` mode reads every help string, docstring and panel
title as markup, where ``[lm-eval]`` or ``[[supervised response]]`` is a tag and vanishes. When
:class:`Command` and :class:`Group` format their help, Typer renders a copy of them whose texts are
escaped (:func:`rich.markup.escape`) and whose help paragraphs are unwrapped (a docstring's source line
breaks would otherwise stay, and the terminal wrap come on top); the texts themselves stay as written,
for everything else that reads them (``docs/cli-reference.md``, Click's plain help)."""

from __future__ import annotations

import copy
import inspect
import re
from typing import Any

import typer.core
from rich.markup import escape

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


class PlainOption(typer.core.TyperOption):
    def display_type(self, ctx: Any) -> Any:
        if self.is_flag:  # --resume, --tf32/--no-tf32, --help: no value to label
            return None
        return clean(super().display_type(ctx))


class PlainArgument(typer.core.TyperArgument):
    def display_type(self, ctx: Any) -> Any:
        return clean(super().display_type(ctx))

    def get_usage_pieces(self, ctx: Any) -> list[str]:  # "eval [OPTIONS] MODEL...", not "{model}..."
        name = self.metavar or (self.name or "").upper()
        name = name if self.required else f"[{name}]"
        return [name + ("..." if self.nargs != 1 else "")]


def plain(params: list | None) -> list | None:
    """``params`` with Typer's options and arguments made :class:`PlainOption` and :class:`PlainArgument`
    (the same objects: only their class changes, to a subclass that adds no state)."""
    for param in params or []:
        if type(param) is typer.core.TyperOption:
            param.__class__ = PlainOption
        elif type(param) is typer.core.TyperArgument:
            param.__class__ = PlainArgument
    return params


def unwrapped(doc: str | None) -> str | None:
    """A help text with each paragraph's source line breaks joined, since Typer's rich help keeps them
    and then wraps again to the terminal (ragged lines at 80 columns). A line that starts a list item
    (``* ``, ``- ``) or is indented stays a line of its own."""
    return None if doc is None else _unwrap(doc)


def _unwrap(doc: str) -> str:
    out: list[str] = []
    for para in inspect.cleandoc(doc).split("\n\n"):
        lines: list[str] = []
        for line in para.splitlines():
            if lines and not line.startswith(("* ", "- ", " ")):
                lines[-1] = f"{lines[-1]} {line.strip()}"
            else:
                lines.append(line.rstrip())
        out.append("\n".join(lines))
    return "\n\n".join(out)


def _escaped(obj: Any) -> Any:
    """A shallow copy of a command or parameter whose help texts and panel title are escaped markup, a
    command's help with its paragraphs unwrapped (:func:`unwrapped`)."""
    view = copy.copy(obj)
    for name in ("help", "short_help", "epilog", "rich_help_panel"):
        text = getattr(view, name, None)
        if isinstance(text, str):
            setattr(view, name, escape(_unwrap(text) if name == "help" else text))
    return view


class _Escaping:
    """Help formatted from a copy whose texts are escaped (see the module docstring): ``format_help``
    hands Typer :func:`_escaped` ``self``, whose ``get_params`` (and a group's ``get_command``) give
    escaped copies too."""

    rich_markup_mode: Any
    escaping = False  # True on the copy being formatted

    def format_help(self, ctx: Any, formatter: Any) -> None:
        if self.escaping or self.rich_markup_mode != "rich":
            return super().format_help(ctx, formatter)  # type: ignore[misc]
        view = _escaped(self)
        view.escaping = True
        return view.format_help(ctx, formatter)

    def _params(self, params: list) -> list:
        return [_escaped(p) for p in params] if self.escaping else params


class Command(_Escaping, typer.core.TyperCommand):
    """A command whose help shows the plain labels, its texts as written."""

    def get_params(self, ctx: Any) -> list:
        return self._params(plain(super().get_params(ctx)) or [])


class Group(_Escaping, typer.core.TyperGroup):
    """A group whose help shows the plain labels, its texts and its commands' as written."""

    def get_params(self, ctx: Any) -> list:
        return self._params(plain(super().get_params(ctx)) or [])

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        found = super().get_command(ctx, cmd_name)
        return _escaped(found) if self.escaping and found is not None else found

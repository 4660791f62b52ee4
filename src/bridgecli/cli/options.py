"""Typer parameters read from the steps' options types: a flag's default, help and flags are declared
once, on its field (bridgecli.optionspec.option), and the command line only reads them. The checks are the
steps' (they run for Python callers too); the CLI layer parses and reports."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..optionspec import MAX_COUNT, field_of

_SAME: Any = object()

InputArg = Annotated[str, typer.Argument(help="Input bridge stream ('-' for stdin).", show_default=True)]
StreamOut = Annotated[str, typer.Option("--output", "-o", help="Output bridge stream ('-' for stdout).")]


def opt(cls: type, name: str, *decls: str, default: Any = _SAME, help: str | None = None, **kw: Any) -> Any:
    """``typer.Option`` for field ``name`` of the options type ``cls``: its default, help and flags.
    ``default`` is given only where the command line spells "not set" its own way (None for an empty
    list, or for a value the step derives); ``help`` only where a command words a shared field its own way."""
    spec, value = field_of(cls, name)
    return typer.Option(
        value if default is _SAME else default, *(decls or spec.flags), help=spec.help if help is None else help, **kw
    )


def arg(cls: type, name: str, *, default: Any = _SAME, help: str | None = None, **kw: Any) -> Any:
    """``typer.Argument`` for field ``name`` of ``cls`` (required when the field has no default)."""
    spec, value = field_of(cls, name)
    return typer.Argument(value if default is _SAME else default, help=spec.help if help is None else help, **kw)


def shown_range(cls: type, name: str) -> dict[str, Any]:
    """``min``/``max`` for ``typer.Option`` from field ``name``'s integer range, so --help shows it
    (``INTEGER RANGE [x>=1]``). Click then refuses a value outside it while parsing, through the same
    one-line error as every other (cli/app.py); the step checks the same range for Python callers."""
    spec, _ = field_of(cls, name)
    rng = spec.range
    assert rng is not None and rng.integer, f"{cls.__name__}.{name} has no integer range"
    return {
        "min": None if rng.low is None else int(rng.low),
        "max": None if rng.high is None or rng.high >= MAX_COUNT else int(rng.high),
    }


def data_options(prompt_field, response_field, chat_template, max_length, split, limit=None):
    from ..data.examples import DataOptions

    return DataOptions(
        prompt_field=prompt_field,
        response_field=response_field,
        chat_template=chat_template,
        max_length=max_length,
        split=split,
        limit=limit,
    )

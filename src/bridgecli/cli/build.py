"""Each command built from its options type, as TRL's ``HfArgumentParser`` builds a parser from dataclasses:
:func:`command` gives the command function a signature of ``typer.Option``/``typer.Argument`` parameters
made from the :func:`~bridgecli.optionspec.option` metadata of the type's fields (and its groups'), which
Typer reads as any function's; called, it builds the options object and hands it on. Adding a flag is
adding a field; defaults, help and checks are the options type's. A field with a ``fallback`` (select's
--method) defaults to None, so a flag given at the fallback's value still counts as given.

The help is Typer's rich help of text escaped as markup (:func:`escaped`: ``[lm-eval]`` would vanish);
an option's label is its ``metavar`` (TEXT, INTEGER, ...), a flag has none; :class:`Command` does the same
for Typer's own ``--help`` and names arguments on the usage line as Click does."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import keyword
import types
import typing
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import typer
import typer.core

from ..optionspec import MAX_COUNT, Group, Spec


@dataclass(frozen=True)
class _Flag:
    name: str  # the parameter's
    value: Callable[[Any], Any]  # its value -> the field's


@dataclass
class _Node:
    """An options type as the command builds it: each field from a flag or a nested node."""

    cls: type
    items: list[tuple[str, _Flag | _Node]] = field(default_factory=list)
    #: fields that are no flags here but that the group sets (``defaults``)
    fixed: dict[str, Any] = field(default_factory=dict)
    #: an optional group: the switch's flag and ``build(on, **values)``
    switch: _Flag | None = None
    build: Callable[..., Any] | None = None

    def make(self, values: dict[str, Any]) -> Any:
        kwargs = {
            name: item.make(values) if isinstance(item, _Node) else item.value(values[item.name])
            for name, item in self.items
        }
        if self.switch is not None:
            assert self.build is not None
            return self.build(values[self.switch.name], **kwargs)
        return self.cls(**self.fixed, **kwargs)


def command(options: type) -> Callable[[Callable[[Any], Any]], Callable[..., Any]]:
    """Decorate ``fn(opts)``: the command function Typer gets, whose parameters are the flags of
    ``options`` (see the module docstring) and which calls ``fn`` with the options object."""

    def decorate(fn: Callable[[Any], Any]) -> Callable[..., Any]:
        params: list[inspect.Parameter] = []
        root = _walk(options, Group(), params)
        names = [p.name for p in params]
        assert len(set(names)) == len(names), f"{options.__name__}: two flags share a name in {names}"

        @functools.wraps(fn)
        def run(**values: Any) -> Any:
            return fn(root.make(values))

        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # what Typer reads
        return run

    return decorate


def _walk(cls: type, group: Group, params: list[inspect.Parameter]) -> _Node:
    hints = typing.get_type_hints(cls)
    node = _Node(cls)
    chosen = group.fields(cls)
    node.fixed = {k: v for k, v in group.defaults.items() if k not in {f.name for f in chosen}}
    if group.switch is not None:
        node.switch = _Flag(_name(group.switch, "switch"), bool)
        node.build = group.build
        params.append(_parameter(node.switch.name, bool, group.switch, False, group.switch.help, group.panel))
    for f in chosen:
        if "group" in f.metadata:
            sub: Group = f.metadata["group"]
            if group.panel and not sub.panel:
                sub = dataclasses.replace(sub, panel=group.panel)
            node.items.append((f.name, _walk(_without_none(hints[f.name])[0], sub, params)))
            continue
        spec: Spec = f.metadata["option"]
        default = group.defaults.get(f.name, f.default_factory() if f.default_factory is not MISSING else f.default)
        help = group.help.get(f.name, spec.help)
        if group.prefix and help:
            help = f"{group.prefix}{help[0].lower()}{help[1:]}"
        name = _name(spec, f.name)
        tp = _cli_type(hints[f.name], spec)
        extra: dict[str, Any] = {}
        if spec.fallback is not None:  # None unless given; --help shows the fallback
            extra["show_default"] = str(spec.fallback)
            value: Any = None
        elif group.switch is not None:  # not given: None, so that build() tells "not given" from a value
            extra["show_default"] = f"{default} with {group.switch.flags[0]}"
            value = None
        elif spec.parse is not None and spec.parse.text is not None:
            value = spec.parse.text(default)
        elif default is not MISSING and isinstance(default, (list, dict, tuple)) and not default:
            value = None  # a repeatable flag given no value: the field's empty default
        else:
            value = default
        params.append(_parameter(name, tp, spec, value, help, spec.panel or group.panel, **extra))
        convert = _converter(spec, f.name, hints[f.name], group.switch is not None)
        node.items.append((f.name, _Flag(name, convert)))
    return node


def _parameter(name: str, tp: Any, spec: Spec, default: Any, help: str, panel: str | None, **extra: Any):
    """The ``inspect.Parameter`` of one flag or argument."""
    optional = default is None
    extra["rich_help_panel"] = escaped(panel) if panel else None
    if spec.argument:
        info = typer.Argument(... if default is MISSING else default, help=escaped(help), **extra)
    else:
        extra["metavar"] = spec.metavar if spec.metavar is not None else _label(tp, spec)
        if spec.show_range and spec.range is not None:
            extra["min"] = None if spec.range.low is None else int(spec.range.low)
            extra["max"] = None if spec.range.high is None or spec.range.high >= MAX_COUNT else int(spec.range.high)
        info = typer.Option(... if default is MISSING else default, *spec.flags, help=escaped(help), **extra)
    annotation = Optional[tp] if optional else tp
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)


#: what --help calls a value of each type (click's names)
_LABELS = {str: "TEXT", int: "INTEGER", float: "FLOAT", Path: "PATH", bool: ""}


def _label(tp: Any, spec: Spec) -> str:
    """The value label of an option of command-line type ``tp`` (a flag has none)."""
    if typing.get_origin(tp) is list:
        tp = typing.get_args(tp)[0]
    label = _LABELS[tp]
    return f"{label} RANGE" if spec.show_range and spec.range is not None and label else label


def _name(spec: Spec, field_name: str) -> str:
    """The parameter's name: an argument's own (``input``) or its field's; an option's from its first
    long flag (``--from`` -> ``from_``), so that Typer makes no other flag of it."""
    if spec.argument:
        name = spec.flags[0] if spec.flags else field_name
    else:
        longs = [f.split("/")[0] for f in spec.flags if f.startswith("--")]
        name = longs[0][2:].replace("-", "_") if longs else field_name
    return name + "_" if keyword.iskeyword(name) else name


def _without_none(tp: Any) -> list[Any]:
    """The types of ``tp`` less None: ``[LoraSettings]`` of ``LoraSettings | None``."""
    union = typing.get_origin(tp) in (Union, types.UnionType)
    return [a for a in typing.get_args(tp) if a is not type(None)] if union else [tp]


def _cli_type(tp: Any, spec: Spec) -> Any:
    """The type the command line reads for a field of type ``tp``: the declared parse's, else ``tp``
    less None, with PATH for a union holding ``Path`` and TEXT for one holding ``str``."""
    if spec.parse is not None:
        return spec.parse.type
    args = _without_none(tp)
    tp = Path if Path in args else str if str in args else args[0]
    assert len(args) == 1 or tp in (Path, str), f"no command-line type for {tp}"
    assert tp in _LABELS or typing.get_origin(tp) is list, f"no command-line type for {tp}"
    return tp


def _converter(spec: Spec, field_name: str, tp: Any, raw: bool) -> Callable[[Any], Any]:
    """From the parsed value to the field's: the declared parse (given the flag, for its message), a
    list for a repeatable flag, else the value itself."""
    if spec.parse is not None and not raw:
        longs = [f for f in spec.flags if f.startswith("--")]
        flag = longs[0] if longs else "--" + field_name.replace("_", "-")
        parse = spec.parse.value
        return lambda value: parse(value, flag)
    if typing.get_origin(_cli_type(tp, spec)) is list and not raw:
        return lambda value: list(value or [])
    return lambda value: value


def escaped(text: str) -> str:
    """``text`` as Typer's rich help must get it to show it as written: its paragraphs unwrapped
    (:func:`unwrapped`), Rich's markup escaped."""
    from rich.markup import escape

    return escape(unwrapped(text))


def unwrapped(doc: str) -> str:
    """``doc`` with each paragraph's source line breaks joined (rich would keep them and wrap again); a line
    that starts a list item (``* ``, ``- ``) or is indented stays a line."""
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


def plain_flags(params: list) -> list:
    """``params`` with every flag's value label empty: a flag takes no value (Typer would show <bool>)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class Command(typer.core.TyperCommand):
    """Every ``bridge`` command: Typer's own flags (``--help``) without a value label, and arguments on the
    usage line as Click names them (``DATA``, ``[INPUT]``, ``MODEL...``, not ``{data}``)."""

    def get_params(self, ctx: Any) -> list:
        return plain_flags(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = (param.metavar or param.name or "").upper()
                pieces.append((name if param.required else f"[{name}]") + ("..." if param.nargs != 1 else ""))
        return pieces


__all__ = ["Command", "command", "escaped", "plain_flags", "unwrapped"]

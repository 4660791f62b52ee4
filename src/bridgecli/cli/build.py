"""Each command built from its options type, the way TRL's ``HfArgumentParser`` builds a parser from
dataclasses. :func:`command` walks the type's fields, and those of the groups it holds (the data
options, the SFT settings, analyze's source, ...), and gives the command function a signature of
``typer.Option``/``typer.Argument`` parameters made from their
:func:`~bridgecli.optionspec.option` metadata (Typer reads ``__signature__`` as it reads any
function's). Called, the function builds the options object from the values and hands it on. Adding
a flag is adding a field; the defaults, the help and the checks are the options type's.

Parsing only: every check is the step's (and runs for Python callers too), bar the ranges a field
asks the parser to show (``show_range``). A field with a ``fallback`` (select's --method and --rho-p,
which --preset fills in) shows the fallback as its default but gets None unless its flag is given, by
click's parameter source, so that a flag given with the default's value still counts as given."""

from __future__ import annotations

import dataclasses
import inspect
import keyword
import types
import typing
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import typer

from ..optionspec import MAX_COUNT, Group, Spec


@dataclass(frozen=True)
class _Flag:
    """One parameter of the command: its name and how its value becomes the field's."""

    name: str
    value: Callable[[Any], Any]
    #: the field is None unless the flag is given (a field with a fallback, ``Spec.fallback``)
    unless_given: bool = False


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

    def make(self, values: dict[str, Any], given: set[str]) -> Any:
        kwargs = {name: self._value(item, values, given) for name, item in self.items}
        if self.switch is not None:
            assert self.build is not None
            return self.build(values[self.switch.name], **kwargs)
        return self.cls(**self.fixed, **kwargs)

    @staticmethod
    def _value(item: _Flag | _Node, values: dict[str, Any], given: set[str]) -> Any:
        if isinstance(item, _Node):
            return item.make(values, given)
        if item.unless_given and item.name not in given:
            return None
        return item.value(values[item.name])


def command(options: type) -> Callable[[Callable[[Any], Any]], Callable[..., Any]]:
    """Decorate ``fn(opts)``: the command function Typer gets, whose parameters are the flags of
    ``options`` (see the module docstring) and which calls ``fn`` with the options object."""

    def decorate(fn: Callable[[Any], Any]) -> Callable[..., Any]:
        params: list[inspect.Parameter] = []
        root = _walk(options, Group(), params)
        names = [p.name for p in params]
        assert len(set(names)) == len(names), f"{options.__name__}: two flags share a name in {names}"
        assert _CONTEXT not in names, f"{options.__name__}: a flag is named {_CONTEXT}"
        # Typer hands the command's context to the parameter annotated typer.Context
        params.append(inspect.Parameter(_CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))

        def run(**values: Any) -> Any:
            ctx = values.pop(_CONTEXT, None)
            return fn(root.make(values, _given(ctx, values)))

        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # what Typer reads
        run.__name__ = fn.__name__
        run.__qualname__ = fn.__qualname__
        run.__module__ = fn.__module__
        run.__doc__ = fn.__doc__
        return run

    return decorate


#: the command function's parameter that receives the context
_CONTEXT = "command_context"


def _given(ctx: typer.Context | None, values: dict[str, Any]) -> set[str]:
    """The parameters the command line was given, not left at their defaults: their parameter source,
    told by its name (the enum is the vendored click's); all of them without a context."""
    if ctx is None:
        return set(values)
    sources = {name: ctx.get_parameter_source(name) for name in values}
    return {name for name, src in sources.items() if src is not None and src.name not in ("DEFAULT", "DEFAULT_MAP")}


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
            node.items.append((f.name, _walk(_options_type(hints[f.name]), sub, params)))
            continue
        spec: Spec = f.metadata["option"]
        default = group.defaults[f.name] if f.name in group.defaults else _default(f)
        help = group.help.get(f.name, spec.help)
        if group.prefix and help:
            help = f"{group.prefix}{help[0].lower()}{help[1:]}"
        name = _name(spec, f.name)
        tp = _cli_type(hints[f.name], spec)
        extra: dict[str, Any] = {}
        if spec.fallback is not None:  # shown as the default; the field gets None unless given
            value: Any = spec.fallback
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
        node.items.append((f.name, _Flag(name, convert, unless_given=spec.fallback is not None)))
    return node


def _parameter(name: str, tp: Any, spec: Spec, default: Any, help: str, panel: str | None, **extra: Any):
    """The ``inspect.Parameter`` of one flag or argument."""
    optional = default is None
    if spec.argument:
        info = typer.Argument(... if default is MISSING else default, help=help, rich_help_panel=panel, **extra)
    else:
        if spec.metavar is not None:
            extra["metavar"] = spec.metavar
        if spec.show_range and spec.range is not None:
            extra["min"] = None if spec.range.low is None else int(spec.range.low)
            extra["max"] = None if spec.range.high is None or spec.range.high >= MAX_COUNT else int(spec.range.high)
        info = typer.Option(
            ... if default is MISSING else default, *spec.flags, help=help, rich_help_panel=panel, **extra
        )
    annotation = Optional[tp] if optional else tp
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)


def _name(spec: Spec, field_name: str) -> str:
    """The parameter's name: an argument's own (``input``) or its field's; an option's from its first
    long flag (``--from`` -> ``from_``), so that Typer makes no other flag of it."""
    if spec.argument:
        name = spec.flags[0] if spec.flags else field_name
    else:
        longs = [f.split("/")[0] for f in spec.flags if f.startswith("--")]
        name = longs[0][2:].replace("-", "_") if longs else field_name
    return name + "_" if keyword.iskeyword(name) else name


def _default(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def _options_type(tp: Any) -> type:
    """``LoraSettings`` of ``LoraSettings | None``."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] if _is_union(tp) else [tp]
    assert len(args) == 1 and isinstance(args[0], type) and dataclasses.is_dataclass(args[0]), tp
    return args[0]


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _cli_type(tp: Any, spec: Spec) -> Any:
    """The type the command line reads for a field of type ``tp``: the declared parse's, else ``tp``
    less None, with PATH for a union holding ``Path`` and TEXT for one holding ``str``."""
    if spec.parse is not None:
        return spec.parse.type
    if _is_union(tp):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if Path in args:
            return Path
        if str in args:
            return str
        assert len(args) == 1, f"no command-line type for {tp}"
        tp = args[0]
    origin = typing.get_origin(tp)
    assert tp in (str, int, float, bool, Path) or origin is list, f"no command-line type for {tp}"
    return tp


def _converter(spec: Spec, field_name: str, tp: Any, raw: bool) -> Callable[[Any], Any]:
    """From the parsed value to the field's: the declared parse (given the flag, for its message), a
    list for a repeatable flag, else the value itself."""
    if raw:
        return _same
    if spec.parse is not None:
        longs = [f for f in spec.flags if f.startswith("--")]
        flag = longs[0] if longs else "--" + field_name.replace("_", "-")
        parse = spec.parse.value
        return lambda value: parse(value, flag)
    if typing.get_origin(_cli_type(tp, spec)) is list:
        return lambda value: list(value or [])
    return _same


def _same(value: Any) -> Any:
    return value


__all__ = ["command"]

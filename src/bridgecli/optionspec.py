"""Option fields, declared once. Each step's options type (a dataclass in steps/ or training/config.py)
declares every option with :func:`option`: its default, its help text, its flags and its range, and
how the command line shows it (an argument, a panel, a value label). A field that holds another
options type (the data options, the SFT settings, fidelity's source) is declared with :func:`group`:
its option fields are flags of the same command. ``cli/build.py`` makes each command from its options
type alone, the way TRL's ``HfArgumentParser`` makes a parser from dataclasses; the step checks the
values with :func:`check`, so a Python caller of a step gets the same one-line :class:`UsageError`
(exit 2) as the command line. The step's record in the stream it writes (its parameters) comes from
the same fields (:func:`recorded`): every field is recorded unless its declaration says ``record=False``
(a field that does not change what the step writes: where it writes, how many processes). Torch-free
and import-light: the CLI builds its help from it."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import MISSING, dataclass
from numbers import Integral, Real
from typing import Any, Callable, Mapping

from .errors import UsageError

# Upper bounds that only catch nonsense (a typo, an overflow); no real run comes near them.
MAX_COUNT = 2**40  # rows, tokens, steps, ...
MAX_ROUNDS = 10_000  # select -T
MAX_LAYERS = 100_000
MAX_SEED = 2**32 - 1  # numpy's and torch's generators take it

# Help shared by several commands: a flag means the same thing everywhere.
DEVICE_HELP = "auto (cuda if present), cpu, cuda, cuda:1, ..."
MODEL_HELP = "HF model folder, .gguf file or HF id (default: the embedded SmolLM2-135M-Instruct)."
SEED_HELP = "Random seed (data order, splits)."
ALLOW_EMPTY_HELP = "Accept an empty input or result (0 examples or rows) instead of failing."
WORKERS_HELP = (
    "Processes for the per-example work (1: this process). Output is identical for any number; about one per "
    "core (more than the CPUs this process may use is lowered to that)."
)


def switch(text: str) -> bool | None:
    """An on/off word of an option given as text (1/0, true/false, yes/no, on/off, any case), or
    None when ``text`` is none of them."""
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    return None


def _fail(flag: str, value: Any, want: str) -> None:
    raise UsageError(f"{flag} must be {want}, got {value!r}")


def integer(flag: str, value: Any, *, low: int = 1, high: int = MAX_COUNT, optional: bool = False) -> None:
    """``value`` an integer in [low, high] (None allowed when ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, Integral) or not low <= int(value) <= high:
        _fail(flag, value, f"an integer in [{low}, {high}]" if high != MAX_COUNT else f"an integer >= {low}")


def real(
    flag: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
) -> None:
    """``value`` a finite number in the interval given (open or closed at each end)."""
    if value is None and optional:
        return
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        if low is not None and high is not None:
            want = f"a finite number in {left}{low:g}, {high:g}{right}"
        elif low is not None:
            want = f"a finite number {'>' if low_open else '>='} {low:g}"
        elif high is not None:
            want = f"a finite number {'<' if high_open else '<='} {high:g}"
        else:
            want = "a finite number"
        _fail(flag, value, want)


@dataclass(frozen=True)
class Range:
    """An option's allowed values: integers in [low, high], or finite numbers in an interval."""

    integer: bool = False
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def check(self, flag: str, value: Any, *, optional: bool = False) -> None:
        if self.integer:
            integer(
                flag,
                value,
                low=int(self.low if self.low is not None else 1),
                high=int(self.high if self.high is not None else MAX_COUNT),
                optional=optional,
            )
        else:
            real(
                flag,
                value,
                low=self.low,
                high=self.high,
                low_open=self.low_open,
                high_open=self.high_open,
                optional=optional,
            )


def count(low: int = 1, high: int = MAX_COUNT) -> Range:
    """Integers in [low, high] (a count of rows, steps, layers, ...)."""
    return Range(integer=True, low=low, high=high)


def number(
    low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False
) -> Range:
    """Finite numbers in an interval."""
    return Range(low=low, high=high, low_open=low_open, high_open=high_open)


#: A retention ratio rho (select, analyze fidelity and robustness): b = ceil(rho * eligible), so
#: rho = 0 keeps nothing on that side and rho = 1 keeps everything (paper, Algorithm 1).
RETENTION = number(0, 1)
#: A fraction of the data split off (warmup --warm-fraction, --val-fraction): neither part may be empty.
FRACTION = number(0, 1, low_open=True, high_open=True)
SEED = count(0, MAX_SEED)


@dataclass(frozen=True)
class Parse:
    """How the command line spells a field whose value is not one value of the field's own type: the
    type the command line reads (``list[str]``, ``str``), the function from that to the field's value
    (given the flag, for its one-line error) and, where the default is not shown as it is, the
    function from the field's default to what ``--help`` shows."""

    type: Any
    value: Callable[[Any, str], Any]
    text: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Spec:
    """What the command line and the checks need to know about one option field."""

    help: str
    flags: tuple[str, ...] = ()  # e.g. ("--rounds", "-T"); () means --field-name
    range: Range | None = None
    choices: tuple[str, ...] | None = None
    optional: bool = False  # None is allowed (meaning "not set" / "the default rule")
    #: a positional argument (required when the field has no default); ``flags``, if given, holds its
    #: one name (``("input",)``)
    argument: bool = False
    metavar: str | None = None  # what --help shows for the value (default: TEXT, INTEGER, FLOAT, PATH)
    panel: str | None = None  # the --help panel that lists it (default: Options)
    #: the parser refuses an integer outside ``range`` itself and --help shows the range
    #: (``INTEGER RANGE [x>=1]``); otherwise the step's check does, with the same message for Python callers
    show_range: bool = False
    parse: Parse | None = None
    #: a field that is None unless given, filled in by a rule of the step (select's --preset): what it
    #: stands for when the rule sets nothing, which --help shows as its default. The command line
    #: passes None where the flag is not given, not this value, so the step tells "not given" from a
    #: value equal to it. None: no fallback.
    fallback: Any = None
    #: whether the step records the field in what it writes (:func:`recorded`)
    record: bool = True

    def label(self, name: str) -> str:
        """How errors name the option: ``-T/--rounds``, ``--rho-p``."""
        if not self.flags:
            return "--" + name.replace("_", "-")
        return "/".join(sorted(self.flags, key=len)) if len(self.flags) > 1 else self.flags[0]


def option(
    default: Any = MISSING,
    help: str = "",
    *flags: str,
    factory: Any = MISSING,
    choices: tuple[str, ...] | list[str] | None = None,
    optional: bool | None = None,
    **spec: Any,
) -> Any:
    """A dataclass field that is also a command-line option (see the module docstring): its default (or
    ``factory``), its help and flags, and the rest of its :class:`Spec` by name (``range``, ``argument``,
    ``metavar``, ``panel``, ``show_range``, ``parse``); with ``fallback``, one whose default is None = "not
    given" (:attr:`Spec.fallback`); with ``record=False``, one the step's record leaves out (:func:`recorded`)."""
    assert spec.get("fallback") is None or default is None, "a field with a fallback defaults to None (not given)"
    optional = (default is None and factory is MISSING) if optional is None else optional
    made = Spec(help=help, flags=tuple(flags), choices=tuple(choices) if choices else None, optional=optional, **spec)
    if factory is not MISSING:
        return dataclasses.field(default_factory=factory, metadata={"option": made})
    return dataclasses.field(default=default, metadata={"option": made})


def internal(default: Any = MISSING, *, factory: Any = MISSING, record: bool = True) -> Any:
    """A dataclass field of an options type that is no command-line option (a Python caller's, or one a
    step fills in); with ``record=False``, one the step's record leaves out (:func:`recorded`)."""
    metadata = {"record": record}
    if factory is not MISSING:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Group:
    """A field holding another options type whose option fields are flags of the same command."""

    #: its fields that are flags here (None: every option field), less ``exclude``
    only: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    #: defaults of its fields where this type sets them its own way (warmup: one epoch)
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: help of its fields where this type words them its own way
    help: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: put before each of its flags' help, first letter lowered (``--compare: ``)
    prefix: str = ""
    panel: str | None = None  # the --help panel of its flags (where a field names none)
    #: an optional group (None unless turned on): the flag that turns it on; its fields' flags then
    #: default to None (shown as "16 with --lora"), and ``build(on, **values)`` makes the field's value
    switch: Spec | None = None
    build: Callable[..., Any] | None = None
    #: whether the step records the group's fields (:func:`recorded`)
    record: bool = True

    def fields(self, cls: type) -> list[dataclasses.Field]:
        """The option fields and groups of ``cls`` that are flags here, in their order."""
        return [
            f
            for f in dataclasses.fields(cls)
            if ("option" in f.metadata or "group" in f.metadata)
            and (self.only is None or f.name in self.only)
            and f.name not in self.exclude
        ]


def group(cls: type | None = None, *, default: Any = MISSING, **settings: Any) -> Any:
    """A dataclass field holding the options type ``cls``, with the :class:`Group` ``settings`` (``only``,
    ``exclude``, ``defaults``, ``help``, ``prefix``, ``panel``, ``switch``, ``build``, ``record``): its default
    is ``cls(**defaults)``; without ``cls`` it is ``default`` (required when not given)."""
    spec = Group(**settings)
    if cls is not None:
        return dataclasses.field(default_factory=functools.partial(cls, **spec.defaults), metadata={"group": spec})
    return dataclasses.field(default=default, metadata={"group": spec})


def field_of(cls: type, name: str) -> tuple[Spec, Any]:
    """(spec, default) of option ``name`` of the options type ``cls``; the default is ``...`` for a
    required field."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            spec = f.metadata.get("option")
            if spec is None:
                raise KeyError(f"{cls.__name__}.{name} is not declared with option()")
            if f.default is not MISSING:
                return spec, f.default
            if f.default_factory is not MISSING:
                return spec, f.default_factory()
            return spec, ...
    raise KeyError(f"{cls.__name__} has no field {name!r}")


def check(opts: Any, *, prefix: str = "") -> None:
    """Check every option field of ``opts`` that declares a range or choices (in field order)."""
    for f in dataclasses.fields(opts):
        spec: Spec | None = f.metadata.get("option")
        if spec is None or (spec.range is None and spec.choices is None):
            continue
        value = getattr(opts, f.name)
        flag = prefix + spec.label(f.name)
        if value is None and spec.optional:
            continue
        if spec.range is not None:
            spec.range.check(flag, value)
        if spec.choices is not None and value not in spec.choices:
            _fail(flag, value, f"one of {', '.join(spec.choices)}")


# -- the step's record -------------------------------------------------------------------------


def _records(f: dataclasses.Field) -> bool:
    """Whether the field ``f`` is recorded: what its declaration says (:func:`option`, :func:`group`,
    :func:`internal`); a field declared otherwise is recorded."""
    spec = f.metadata.get("option") or f.metadata.get("group")
    return spec.record if spec is not None else bool(f.metadata.get("record", True))


def _holds_options(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def recorded_names(cls: type) -> list[str]:
    """The keys :func:`recorded` gives an options object of type ``cls``: each recorded field's name, a
    recorded group's fields in its place (by their own names)."""
    hints = None
    out: list[str] = []
    for f in dataclasses.fields(cls):
        if not _records(f):
            continue
        if "group" in f.metadata:
            if hints is None:
                import typing

                hints = typing.get_type_hints(cls)
            tp = hints[f.name]
            args = [a for a in getattr(tp, "__args__", ()) if a is not type(None)] or [tp]
            out += recorded_names(args[0])
        else:
            out.append(f.name)
    return out


def _plain(value: Any) -> Any:
    """A field's value as the record keeps it (JSON's kinds: a path as text, a set sorted, ...)."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if _holds_options(value):
        return recorded(value)
    return value


def recorded(opts: Any, **resolved: Any) -> dict[str, Any]:
    """The step record of the options object ``opts``: every field, by its name, unless its declaration
    says ``record=False``; a group's fields in its place (a group that is None: its fields left out).
    ``resolved`` gives what the step made of a field (``dtype="bfloat16"`` for ``auto``) and what it adds
    (a fingerprint); a resolved value replaces the field's."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(opts):
        if not _records(f):
            continue
        value = getattr(opts, f.name)
        if "group" in f.metadata:
            if value is None:
                continue
            for key, item in recorded(value).items():
                assert key not in out, f"{type(opts).__name__}: two recorded fields named {key!r}"
                out[key] = item
        else:
            assert f.name not in out, f"{type(opts).__name__}: two recorded fields named {f.name!r}"
            out[f.name] = _plain(value)
    out.update({key: _plain(value) for key, value in resolved.items()})
    return out


# -- what the command line reads as text --------------------------------------------------------


def key_values(items: list[str] | None, flag: str) -> dict[str, str]:
    """``["k=v", ...]`` (a repeatable ``--flag KEY=VALUE``) as a dict; a malformed item, or a key given
    twice (which value was meant?), is a usage error."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} expects KEY=VALUE, got {item!r}")
        if key.strip() in out:
            raise UsageError(
                f"{flag} gives {key.strip()} twice ({out[key.strip()]!r} and {value.strip()!r}): give each key once"
            )
        out[key.strip()] = value.strip()
    return out


def single(values: list[str] | None, flag: str) -> str | None:
    """The one value of a flag read as a list (:data:`ONCE`): None when not given; given twice, a usage
    error (which one was meant?), not the last one silently."""
    values = list(values or [])
    if len(values) > 1:
        shown = ", ".join(repr(v) for v in values)
        raise UsageError(f"{flag} given {len(values)} times ({shown}): give it once")
    return values[0] if values else None


def number_list(text: str, flag: str) -> tuple[float, ...]:
    """``"1.0,0.5"`` (a comma-separated ``--flag``) as numbers; anything else is a usage error."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated numbers, got {text!r}") from None


def names(values: list[str] | None) -> list[str]:
    """Comma-separated or repeated names (``--task gsm8k,math --task mmlu``) as one list."""
    out: list[str] = []
    for value in values or []:
        out.extend(v.strip() for v in value.split(",") if v.strip())
    return out


#: a repeatable ``--flag KEY=VALUE`` read into a dict
KEY_VALUES = Parse(list[str], key_values)
#: a flag given at most once (``--preset``): a second one is a usage error, not the last one winning
ONCE = Parse(list[str], single)
#: comma-separated numbers (``--levels 1.0,0.5``), shown as such
NUMBERS = Parse(str, number_list, lambda values: ",".join(map(str, values)))
#: comma-separated or repeated names (``--task gsm8k,math --task mmlu``)
NAMES = Parse(list[str], lambda values, flag: names(values))

# -- fields several commands share -------------------------------------------------------------

INPUT_HELP = "Input bridge stream ('-' for stdin)."
OUTPUT_HELP = "Output bridge stream ('-' for stdout)."


def stream_input() -> Any:
    """The input bridge stream: the command's argument INPUT, stdin by default (the stream itself
    records where it came from: not recorded)."""
    return option("-", INPUT_HELP, "input", argument=True, record=False)


def stream_output() -> Any:
    """The output bridge stream: ``-o/--output``, stdout by default (not recorded)."""
    return option("-", OUTPUT_HELP, "--output", "-o", record=False)


def workers(help: str = WORKERS_HELP) -> Any:
    """``--workers N``: processes for the per-example work (the output is the same for any number: not
    recorded)."""
    return option(1, help, "--workers", range=count(), show_range=True, record=False)


__all__ = [
    "ALLOW_EMPTY_HELP",
    "DEVICE_HELP",
    "FRACTION",
    "INPUT_HELP",
    "KEY_VALUES",
    "MAX_COUNT",
    "MAX_LAYERS",
    "MAX_ROUNDS",
    "MAX_SEED",
    "MODEL_HELP",
    "NAMES",
    "NUMBERS",
    "ONCE",
    "OUTPUT_HELP",
    "RETENTION",
    "SEED",
    "SEED_HELP",
    "WORKERS_HELP",
    "Group",
    "Parse",
    "Range",
    "Spec",
    "check",
    "count",
    "field_of",
    "group",
    "integer",
    "internal",
    "key_values",
    "names",
    "number",
    "number_list",
    "option",
    "real",
    "recorded",
    "single",
    "recorded_names",
    "stream_input",
    "stream_output",
    "switch",
    "workers",
]

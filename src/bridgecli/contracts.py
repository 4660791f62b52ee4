"""Plugin objects held to their contracts (the Protocols of :mod:`bridgecli.hookspecs`).

:func:`check` runs when a plugin registers an object (:mod:`bridgecli.registry`): the object must have
every required member of its kind's Protocol, and an optional member it declares must have the declared
type; otherwise a :class:`PluginError` names the plugin, the object and the member. :func:`complete`
gives the steps an object's every member, the Protocol's value standing in for an optional one it left
out, so no step reads a member with ``getattr`` and a default of its own. :func:`as_selector` makes a
plain selector function a whole :class:`~bridgecli.hookspecs.Selector`; :func:`build_scorer` builds a
scorer and holds it to :class:`~bridgecli.hookspecs.Scorer`.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Iterable, cast

from .errors import FormatError, PluginError, UsageError
from .hookspecs import EvalTask, Plan, Scorer, ScorerFactory, Segmenter, Selector, SelectorFunction

if TYPE_CHECKING:
    from .core.select import SelectionResult
    from .format.records import Example

#: the contract of each kind the registry collects (``registry.KINDS``)
PROTOCOLS: dict[str, type] = {
    "segmenter": Segmenter,
    "scorer": ScorerFactory,
    "selector": Selector,
    "eval_task": EvalTask,
}
#: what the Protocol machinery puts in a Protocol's class body (not members)
_NOT_MEMBERS = frozenset({"__init__", "__subclasshook__", "__class_getitem__", "__init_subclass__"})


def members(proto: type) -> tuple[list[str], dict[str, Any]]:
    """(required members, {optional member: its value}) of a Protocol: a member given a value in the
    class body is optional; an annotation without one, or a method, is required."""
    required: list[str] = []
    optional: dict[str, Any] = {}
    for name in proto.__dict__.get("__annotations__", {}):
        if name in proto.__dict__:
            optional[name] = proto.__dict__[name]
        else:
            required.append(name)
    for name, value in proto.__dict__.items():
        public = not name.startswith("_") or name == "__call__"
        if public and name not in _NOT_MEMBERS and name not in optional and inspect.isfunction(value):
            required.append(name)
    return required, optional


class _Completed:
    """A plugin object seen through its contract: what it has, else the Protocol's value."""

    def __init__(self, obj: Any, optional: dict[str, Any]):
        self._obj = obj
        self._optional = optional

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._obj, name)
        except AttributeError:
            if name in self._optional:
                return self._optional[name]
            raise

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._obj(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self._obj!r} as its contract>"


def complete(obj: Any, proto: type) -> Any:
    """``obj`` with every member of ``proto``: one it lacks reads as the Protocol's value."""
    return _Completed(obj, members(proto)[1])


def as_eval_task(obj: Any) -> EvalTask:
    """A registered eval task with every member of :class:`EvalTask` (what it declares, else the defaults)."""
    return cast(EvalTask, complete(obj, EvalTask))


def as_scorer_factory(obj: Any) -> ScorerFactory:
    """A registered scorer factory with every member of :class:`ScorerFactory`."""
    return cast(ScorerFactory, complete(obj, ScorerFactory))


def _has(obj: Any, name: str, proto: type) -> bool:
    if name == "__call__":
        return callable(obj)
    if inspect.isfunction(proto.__dict__.get(name)):  # a method: present and callable
        return callable(getattr(obj, name, None))
    return hasattr(obj, name)


def _types_ok(value: Any, default: Any) -> bool:
    """Whether a declared optional member has the type of the Protocol's value (None: anything)."""
    if default is None:
        return True
    if isinstance(default, tuple):
        return isinstance(value, (tuple, list)) and all(isinstance(v, type(default[0])) for v in value)
    return isinstance(value, type(default))


def _type_name(default: Any) -> str:
    return f"tuple of {type(default[0]).__name__}" if isinstance(default, tuple) else type(default).__name__


def missing(obj: Any, proto: type) -> list[str]:
    """The required members of ``proto`` that ``obj`` lacks."""
    return [name for name in members(proto)[0] if not _has(obj, name, proto)]


def check(kind: str, name: str, obj: Any, plugin: str) -> None:
    """``obj``, registered as ``kind`` ``name`` by ``plugin``, against its kind's Protocol (see the module)."""
    proto = PROTOCOLS[kind]
    what = f"plugin {plugin} registered the {kind.replace('_', ' ')} '{name}'"
    hint = f"see bridgecli.hookspecs.{proto.__name__}"
    if kind == "selector" and not isinstance(obj, Selector):
        if inspect.isfunction(obj) or not any(hasattr(obj, m) for m in ("needs_plan", "prepare", "budgets")):
            try:  # a plain selector function (or a callable object that is one)
                as_selector(obj, name)
            except PluginError as err:
                raise PluginError(f"plugin {plugin}: {err.message}", hint=err.hint) from None
            return
    lacks = missing(obj, proto)
    if lacks == ["__call__"]:
        raise PluginError(f"{what}, which is not callable", hint=hint)
    if lacks:
        raise PluginError(f"{what} without '{lacks[0]}'", hint=hint)
    for member, default in members(proto)[1].items():
        if hasattr(obj, member) and not _types_ok(getattr(obj, member), default):
            value = getattr(obj, member)
            raise PluginError(f"{what} with {member} = {value!r}, not a {_type_name(default)}", hint=hint)


# ------------------------------------------------------------------------------------------ selectors


def default_budgets(example: Example, rho_p: float, rho_r: float) -> tuple[int, int]:
    """b = ceil(rho * eligible) on each side."""
    from .core.budgets import budget
    from .format.spec import PROMPT, RESPONSE

    kinds = example.tokens.kinds  # one byte per token: the eligible ones counted without numpy
    return budget(rho_p, kinds.count(PROMPT)), budget(rho_r, kinds.count(RESPONSE))


def plan_budgets(plan: Plan, example: Example) -> tuple[int, int]:
    """(b_p, b_r) of ``example`` in a first pass's ``plan``; an example the pass did not see is an error."""
    if example.index not in plan.budgets:
        raise FormatError("this example was not in the stream's first pass", record=example.index)
    return plan.budgets[example.index]


def first_pass_sees(seen: set[int], example: Example) -> None:
    """In a first pass that builds a :class:`~bridgecli.hookspecs.Plan`: add ``example``'s index to
    ``seen``. An index seen before is an error, since a plan keeps the budgets by index."""
    if example.index in seen:
        raise FormatError(
            f"two examples with index {example.index} in one stream",
            record=example.index,
            hint="select each input file's stream on its own",
        )
    seen.add(example.index)


class FunctionSelector:
    """A :class:`SelectorFunction` with the rest of :class:`Selector`: its own ``protects``,
    ``surrogate`` and ``parse`` when it carries them, else no protection, no surrogate, the options
    as given; no first pass; the default budgets."""

    def __init__(self, fn: SelectorFunction):
        self.fn = fn
        self.protects = bool(getattr(fn, "protects", False))
        self.surrogate = bool(getattr(fn, "surrogate", False))
        self._parse = getattr(fn, "parse", None)
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def parse(self, options: dict[str, Any]) -> dict[str, Any]:
        if callable(self._parse):
            parsed = self._parse(dict(options))
            return dict(options) if parsed is None else parsed
        return dict(options)

    def needs_plan(self, options: dict[str, Any]) -> bool:
        return False

    def prepare(self, examples: Iterable[Example], rho_p: float, rho_r: float, options: dict[str, Any]) -> Plan:
        raise NotImplementedError("a plain selector function has no first pass")

    def budgets(self, example: Example, rho_p: float, rho_r: float, options: dict[str, Any]) -> tuple[int, int]:
        return default_budgets(example, rho_p, rho_r)

    def __call__(self, example: Example, b_p: int, b_r: int, options: dict[str, Any]) -> SelectionResult:
        return self.fn(example, b_p, b_r, options)


def as_selector(obj: Any, name: str = "?") -> Selector:
    """``obj`` as a full :class:`Selector`: itself when it is one, a :class:`FunctionSelector` when it
    is a plain function. A function that carries ``budgets`` or ``prepare`` (the contract before
    :class:`Plan`) is refused: those must now be methods of a :class:`Selector` object."""
    if isinstance(obj, Selector):
        return obj
    if not callable(obj):
        raise PluginError(f"selector '{name}' is not callable")
    stale = [a for a in ("budgets", "prepare") if getattr(obj, a, None) is not None]
    if stale:
        raise PluginError(
            f"selector '{name}' carries {' and '.join(stale)} as attributes of a function",
            hint="make it an object with parse, prepare, budgets and __call__ (bridgecli.hookspecs.Selector)",
        )
    return FunctionSelector(obj)


# ------------------------------------------------------------------------------------------ scorers


def build_scorer(factory: Callable[[Any], Any], ctx: Any, flag: str, plugin: str) -> Scorer:
    """The scorer ``factory`` builds for ``ctx``, with every member of :class:`Scorer`. An option it
    refuses (its ``UsageError``) is reported with ``flag`` (e.g. ``--scorer atp``); an object without
    ``score`` is the plugin's error."""
    try:
        scorer = factory(ctx)
    except UsageError as err:
        raise UsageError(f"{flag}: {err.message}", hint=err.hint) from None
    lacks = missing(scorer, Scorer)
    if lacks:
        raise PluginError(
            f"{flag}: plugin {plugin} built a scorer without '{lacks[0]}'", hint="see bridgecli.hookspecs.Scorer"
        )
    return cast(Scorer, _BuiltScorer(scorer))


class _BuiltScorer:
    """A built scorer with every member of :class:`Scorer` as a plain attribute, read once: its own, else
    the Protocol's value (the scoring loop reads them for every batch)."""

    def __init__(self, scorer: Any):
        self.scorer = scorer
        for name, value in members(Scorer)[1].items():
            setattr(self, name, getattr(scorer, name, value))
        self.score = scorer.score

    def __repr__(self) -> str:
        return f"<{self.scorer!r} as its contract>"


__all__ = [
    "FunctionSelector",
    "PROTOCOLS",
    "as_eval_task",
    "as_scorer_factory",
    "as_selector",
    "build_scorer",
    "check",
    "complete",
    "default_budgets",
    "first_pass_sees",
    "members",
    "missing",
    "plan_budgets",
]

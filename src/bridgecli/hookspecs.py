"""The plugin hooks and the contract of every kind of plugin.

Each hook receives a ``register(name, obj, description="")`` callback; built-ins use the same hooks.
What ``obj`` must be is a Protocol below: :class:`Segmenter`, :class:`ScorerFactory` (building a
:class:`Scorer`), :class:`Selector` (or the plain :class:`SelectorFunction`) and :class:`EvalTask`.
A Protocol declares every member a step reads. A member given a value here is optional: a plugin
that leaves it out gets that value (:func:`bridgecli.contracts.complete`). The registry checks each
object against its Protocol when it is registered (:mod:`bridgecli.contracts`), and names the plugin
and the member it lacks. A plugin raises :class:`~bridgecli.errors.UsageError` for an option the user
got wrong (the step adds which flag it came with). This module holds declarations only: the helpers
that implement the defaults and read a :class:`Plan` live in :mod:`bridgecli.contracts`.

A plugin module implements any of the hooks with ``@bridgecli.hookimpl`` and is published under the
``bridgecli`` entry-point group (see plugins/ for a complete example package)::

    @hookimpl
    def register_segmenters(register):
        register("bullets", split_bullets, "one unit per bullet point")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, runtime_checkable

import pluggy

if TYPE_CHECKING:
    from .core.select import SelectionResult
    from .evaluation.tasks import EvalOptions, EvalRun
    from .format.records import Example, Scores
    from .modeling.scoring import ScoringContext

hookspec = pluggy.HookspecMarker("bridgecli")
hookimpl = pluggy.HookimplMarker("bridgecli")


# ------------------------------------------------------------------------------------------ segmenters


class Segmenter(Protocol):
    """``bridge close --segmenter NAME``: sorted, non-overlapping, non-empty ``[start, end)``
    character spans of ``text`` (the response). Characters outside every span become one-token
    units. Deterministic; never raises."""

    def __call__(self, text: str) -> list[tuple[int, int]]: ...


# ------------------------------------------------------------------------------------------ scorers


class PendingScores(Protocol):
    """A batch's scores on their way: :meth:`result` waits for them."""

    def result(self) -> list[Scores]: ...


class Scorer(Protocol):
    """Scores a batch of tokenised examples: for each, ``Scores`` with a_j for every eligible
    response token, the routing rows A [n, m] and the history mass c [n], and optionally B [n, m]
    (the effect of prompt token i on a_j), which ``select`` then uses in place of A x a.

    ``bridge score`` reads the optional members once the scorer is built."""

    #: one line shown before the first batch (a scorer that compiles first says so); None: nothing
    startup_note: str | None = None
    #: what ``bridge score`` records in the stream's header beside the scorer options (the score step's
    #: ``scorer_params``), e.g. the slope ``debias=common`` subtracts with; None: nothing
    header_params: dict[str, Any] | None = None
    #: the padded tokens of one pass on a GPU, the default of ``--max-tokens`` there; None: 32768
    max_tokens_cuda: int | None = None
    #: queue a batch's device work and return at once, a :class:`PendingScores` whose ``result()`` is what
    #: ``score`` returns (the step reads ahead while the device computes); None: the step calls ``score``
    launch: Callable[[list[Example]], PendingScores] | None = None

    def score(self, batch: list[Example]) -> list[Scores]: ...


class ScorerFactory(Protocol):
    """``bridge score --scorer NAME``: builds the scorer from the scoring context (checkpoint,
    tokenizer, direction v, device, and ``ctx.options["scorer_options"]``: the ``--scorer-option
    KEY=VALUE`` pairs, as strings). Raise ``UsageError`` for an option it does not take: the user
    gets one line naming ``--scorer NAME``, exit 2."""

    #: whether ``bridge score`` may compile the fast JVP tail's GPU kernels in a thread while the model
    #: loads (:mod:`bridgecli.modeling.kernel_warmup`): true for a scorer that runs that tail
    warm_kernels: bool = False

    def __call__(self, ctx: ScoringContext) -> Scorer: ...


# ------------------------------------------------------------------------------------------ selectors


@dataclass(frozen=True)
class Plan:
    """What a selector's first pass over the whole stream decided: the budgets (b_p, b_r) of every
    example, by example index, a summary that ``select`` records in the step parameters, and
    ``options``: what the per-example calls need from the first pass (merged over the parsed options
    of every call; keys start with ``_``, as the step's own do)."""

    budgets: dict[int, tuple[int, int]]
    summary: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)


class SelectorFunction(Protocol):
    """The least a selector is: a function of one scored example and its budgets returning a
    ``SelectionResult`` (indices into the eligible prompt and response positions, the response scores
    the closure projects, a U_sur history). ``options`` holds ``--option KEY=VALUE`` (strings) and
    ``rounds`` (-T). The step checks that exactly ``min(b, eligible)`` tokens come back per side.
    A function may also carry the attributes ``protects``, ``surrogate`` and ``parse`` of
    :class:`Selector`; :func:`bridgecli.contracts.as_selector` gives it the rest."""

    def __call__(self, example: Example, b_p: int, b_r: int, options: dict[str, Any]) -> SelectionResult: ...


@runtime_checkable
class Selector(Protocol):
    """``bridge select --method NAME``, the whole contract. ``select`` calls, in this order:

    1. ``parse(options)`` once, before reading anything: the ``--option`` values checked and
       converted (raise ``UsageError`` for a bad one). What it returns is the ``options`` of every
       later call.
    2. when ``needs_plan(options)``, ``prepare(examples, rho_p, rho_r, options)``: a first pass over
       the whole stream for budgets that depend on it (budget matching, global or batch ranking).
       The :class:`Plan` it returns gives each example its budgets, and in ``Plan.options`` what the
       per-example calls need from it (stdin is then copied to a temporary file, to be read twice).
    3. per example, the budgets: the plan's, else ``budgets(example, rho_p, rho_r, options)``
       (default: b = ceil(rho * eligible) per side);
    4. then ``selector(example, b_p, b_r, options)``.

    ``protects``: whether it honours ``--protect-prompt/--protect-response`` (it then keeps the
    indices in ``options["_protect_prompt"]`` / ``options["_protect_response"]``, which the step adds).
    ``surrogate``: whether it ranks by BRIDGE's surrogate (``--budget global`` needs that).
    """

    protects: bool
    surrogate: bool

    def parse(self, options: dict[str, Any]) -> dict[str, Any]: ...

    def needs_plan(self, options: dict[str, Any]) -> bool: ...

    def prepare(self, examples: Iterable[Example], rho_p: float, rho_r: float, options: dict[str, Any]) -> Plan: ...

    def budgets(self, example: Example, rho_p: float, rho_r: float, options: dict[str, Any]) -> tuple[int, int]: ...

    def __call__(self, example: Example, b_p: int, b_r: int, options: dict[str, Any]) -> SelectionResult: ...


# ------------------------------------------------------------------------------------------ eval tasks


class EvalTask(Protocol):
    """``bridge eval --task NAME``: reads ``options.data``, generates or scores with the model,
    grades, and returns a summary and one record per item (``bridgecli.evaluation.tasks``)."""

    #: where its data lies under a ``--data-dir`` folder; None: ``--data`` must name it
    default_data: str | None = None
    #: whether it runs model-written code: ``bridge eval`` then asks for the opt-in and the sandbox
    #: (``--allow-code-execution``, docs/security.md) before the model loads
    runs_code: bool = False
    #: the ``--engine`` values that can run it
    engines: tuple[str, ...] = ("bridge",)
    #: what its summary reports: ``loss`` (``loss``, ``ci_low``, ``ci_high``) or the name of an accuracy
    #: (``accuracy`` and ``correct``; the summary's ``metric`` field, when it has one, says the same)
    metric: str = "accuracy"

    def __call__(self, model: Any, tokenizer: Any, options: EvalOptions) -> EvalRun: ...


# ------------------------------------------------------------------------------------------ the hooks


@hookspec
def register_segmenters(register):
    """Register response segmenters for ``bridge close``: ``register(name, segmenter, description="")``
    with a :class:`Segmenter`."""


@hookspec
def register_scorers(register):
    """Register scorers for ``bridge score``: ``register(name, factory, description="")`` with a
    :class:`ScorerFactory`."""


@hookspec
def register_selectors(register):
    """Register token selectors for ``bridge select --method NAME``: ``register(name, selector,
    description="")`` with a :class:`Selector` or a plain :class:`SelectorFunction`."""


@hookspec
def register_eval_tasks(register):
    """Register evaluation tasks for ``bridge eval --task NAME``: ``register(name, task,
    description="")`` with an :class:`EvalTask`."""

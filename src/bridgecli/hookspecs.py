"""The plugin hooks. Each hook receives a ``register`` callback; built-ins use the same hooks.

A plugin module implements any of these with ``@bridgecli.hookimpl`` and is published under the
``bridgecli`` entry-point group (see plugins/ for a complete example package)::

    @hookimpl
    def register_segmenters(register):
        register("bullets", split_bullets, "one unit per bullet point")
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("bridgecli")
hookimpl = pluggy.HookimplMarker("bridgecli")


@hookspec
def register_segmenters(register):
    """Register response segmenters for ``bridge close``.

    ``register(name, fn, description="")`` where ``fn(text: str) -> list[tuple[int, int]]`` returns
    non-overlapping ``[start, end)`` character spans of ``text`` (the response). Characters outside
    every span become one-token units."""


@hookspec
def register_scorers(register):
    """Register scorers for ``bridge score``.

    ``register(name, factory, description="")`` where ``factory(context: ScoringContext)`` returns an
    object with ``score(batch: list[Example]) -> list[Scores]`` (see bridgecli.modeling.scoring)."""


@hookspec
def register_selectors(register):
    """Register token selectors for ``bridge select --method NAME``.

    ``register(name, fn, description="")`` where ``fn(example, b_p, b_r, options) -> SelectionResult``
    with indices into the eligible prompt/response positions (see bridgecli.core.select)."""


@hookspec
def register_eval_tasks(register):
    """Register evaluation tasks for ``bridge eval --task NAME``.

    ``register(name, task, description="")`` where ``task(model, tokenizer, options) -> EvalRun``
    (see bridgecli.evaluation.tasks)."""

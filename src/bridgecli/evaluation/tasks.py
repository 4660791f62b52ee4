"""The evaluation task interface: what ``bridge eval --task NAME`` calls.

A task is any callable ``task(model, tokenizer, options: EvalOptions) -> EvalRun``. It reads its
own data (``options.data``), generates or scores with the model, grades, and returns a summary
plus one record per evaluated item. Tasks registered by plugins (hook ``register_eval_tasks``)
get exactly the same options as the built-ins.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, TypedDict

from ..hookspecs import EvalTask  # the contract, with every other plugin kind's


@dataclass(frozen=True)
class EvalOptions:
    """Settings shared by every task. A task ignores what does not apply to it (a multiple-choice
    task has no use for ``max_new_tokens``)."""

    data: str  # the task's data file
    limit: int | None = None  # evaluate only the first N items
    few_shot: int = 0  # worked examples prepended to every prompt
    few_shot_data: str | None = None  # where they come from (default: the data file, past the evaluated items)
    batch_size: int = 8  # prompts per generation batch / (context, choice) inputs per forward
    batch_tokens: int | None = None  # generation: rows x (longest prompt + max_new_tokens) per batch, at most
    compile: bool = False  # generation on CUDA: static KV cache + torch.compile'd decoding step
    max_new_tokens: int | None = None  # generation length limit; None: the task's default
    # True: render prompts with the tokenizer's chat template when it has one; False: plain text;
    # None: the task's default (generation tasks use the template, log-likelihood tasks do not)
    chat_template: bool | None = None
    progress: bool = True  # progress bar on stderr
    code_timeout: float = 10.0  # seconds per program, for tasks that execute generated code
    # tasks that execute generated code refuse to without this (or BRIDGE_ALLOW_CODE_EXECUTION=1)
    allow_code_execution: bool = False
    # where no bubblewrap sandbox works: run it anyway, with process limits only
    unsafe_code_execution: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_name(model: Any) -> str | None:
    """What a result records as the model: its ``name_or_path`` (None for a bare object)."""
    config = getattr(model, "config", None)
    return getattr(model, "name_or_path", None) or getattr(config, "_name_or_path", None) or None


class EvalRun(TypedDict):
    """What a task returns. ``summary`` holds at least ``task``, ``n``, ``accuracy`` (a fraction),
    ``correct`` and ``settings``; each item holds at least ``index`` and ``correct``. A loss task
    (``metric: "loss"``, e.g. ``heldout-loss``) gives ``loss``, ``ci_low`` and ``ci_high`` in place
    of ``accuracy`` and ``correct``."""

    summary: dict[str, Any]
    items: list[dict[str, Any]]


__all__ = ["EvalOptions", "EvalRun", "EvalTask", "model_name"]

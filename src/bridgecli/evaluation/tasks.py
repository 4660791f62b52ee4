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
from ..optionspec import check, count, number, option


@dataclass(frozen=True)
class EvalOptions:
    """Settings shared by every task. A task ignores what does not apply to it (a multiple-choice
    task has no use for ``max_new_tokens``). The settings are ``bridge eval``'s flags (declared here
    once, with their ranges: :func:`bridgecli.optionspec.check` checks them)."""

    data: str  # the task's data file
    limit: int | None = option(None, "Evaluate only the first N items (MMLU: per subject).", range=count())
    few_shot: int = option(0, "Worked examples prepended to each prompt.", range=count(0, 1000))
    #: where they come from (default: the data file, past the evaluated items)
    few_shot_data: str | None = option(
        None, "Where few-shot examples come from (default: the data past the evaluated items; MMLU: dev/)."
    )
    #: prompts per generation batch / (context, choice) inputs per forward
    batch_size: int = option(8, "Prompts per generation batch / inputs per scoring forward.", range=count())
    #: generation: rows x (longest prompt + max_new_tokens) per batch, at most
    batch_tokens: int | None = option(
        None,
        "Generation: also cap a batch at this many tokens, rows x (longest prompt + max new tokens), "
        "so --batch-size can be large (e.g. --batch-size 2048 --batch-tokens 400000).",
        range=count(),
    )
    #: generation on CUDA: static KV cache + torch.compile'd decoding step
    compile: bool = option(
        False,
        "Generation on CUDA: a static KV cache and a torch.compile'd decoding step (elsewhere: ignored, with a note).",
        "--compile",
    )
    #: generation length limit; None: the task's default
    max_new_tokens: int | None = option(
        None, "Generation length limit (default: the task's: gsm8k 256, math 512, humaneval/mbpp 512).", range=count()
    )
    #: True: render prompts with the tokenizer's chat template when it has one; False: plain text;
    #: None: the task's default (generation tasks use the template, log-likelihood tasks do not)
    chat_template: bool | None = option(
        None,
        "Use the tokenizer's chat template (default: yes for generation tasks, "
        "heldout-loss and answer-loss, no for multiple choice).",
        "--chat-template/--no-chat-template",
    )
    progress: bool = True  # progress bar on stderr
    #: seconds per program, for tasks that execute generated code
    code_timeout: float = option(
        10.0, "Seconds per generated program (humaneval, mbpp).", range=number(0, 86400, low_open=True)
    )
    #: tasks that execute generated code refuse to without this (or BRIDGE_ALLOW_CODE_EXECUTION=1)
    allow_code_execution: bool = option(
        False,
        "Let humaneval/mbpp run model-written code (in a bubblewrap sandbox; or set BRIDGE_ALLOW_CODE_EXECUTION=1).",
        "--allow-code-execution",
    )
    #: where no bubblewrap sandbox works: run it anyway, with process limits only
    unsafe_code_execution: bool = option(
        False,
        "Where no bubblewrap sandbox works: run model-written code anyway, "
        "with process limits only (not a security boundary).",
        "--unsafe-code-execution",
    )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def task_options(data: str, settings: dict[str, Any]) -> EvalOptions:
    """What a task runs with, whichever engine runs it: ``settings`` (fields of :class:`EvalOptions`) on
    ``data``, checked against their declared ranges."""
    options = EvalOptions(data=str(data), **settings)
    check(options)
    return options


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

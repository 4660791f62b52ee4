"""Multiple-choice tasks scored by log-likelihood: ``arc_challenge``, ``arc_easy``, ``hellaswag``, ``mmlu``.

Every choice is a continuation of the question's context; the model's pick is the choice with the
highest total log-likelihood (``acc``) or the highest log-likelihood per character of the
continuation, leading space included (``acc_norm``, as lm-evaluation-harness). Prompts follow the
lm-evaluation-harness task definitions:

- ARC: ``"Question: {stem}\\nAnswer:"`` + ``" {choice text}"``.
- HellaSwag: ``"{activity label}: {context}"`` + ``" {ending}"`` (lm-eval's preprocessing).
- MMLU: ``"The following are multiple choice questions (with answers) about {subject}.\\n\\n"``, then
  ``"{question}\\nA. ..\\nB. ..\\nC. ..\\nD. ..\\nAnswer:"`` + ``" A"``..``" D"``.

Few-shot demonstrations are the same blocks with the gold answer filled in, separated by a blank
line: MMLU takes them from the subject's dev split; ARC and HellaSwag (which have no other split
here) from ``--few-shot-data`` or the data file past the evaluated items. Prompts are plain text
(no chat template) unless ``--chat-template`` is passed explicitly.

The data files are read in :mod:`.mc_data` (its names are importable from here too).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

from ..errors import InputError, UsageError
from .mc_data import (
    ARC_HINT,
    HELLASWAG_HINT,
    LETTERS,
    MMLU_HINT,
    Item,
    arc_query,
    hellaswag_preprocess,
    load_arc,
    load_hellaswag,
    load_mmlu_csv,
    mmlu_description,
    mmlu_files,
    mmlu_query,
    mmlu_shots,
    mmlu_subject,
)
from .readers import check_limit
from .tasks import EvalOptions, EvalRun, model_name

__all__ = [
    "ARC_HINT",
    "FEW_SHOT_SEPARATOR",
    "HELLASWAG_HINT",
    "LETTERS",
    "MMLU_HINT",
    "Item",
    "arc_challenge_task",
    "arc_easy_task",
    "arc_query",
    "hellaswag_preprocess",
    "hellaswag_task",
    "load_arc",
    "load_hellaswag",
    "load_mmlu_csv",
    "mmlu_description",
    "mmlu_files",
    "mmlu_query",
    "mmlu_shots",
    "mmlu_subject",
    "mmlu_task",
    "run_pooled_task",
    "score_items",
    "add_subject_metrics",
    "summarize",
    "take_shots",
]

FEW_SHOT_SEPARATOR = "\n\n"
T = TypeVar("T")


# -- scoring ----------------------------------------------------------------------------------


def score_items(
    model: Any,
    tokenizer: Any,
    items: Sequence[Item],
    contexts: Sequence[str],
    *,
    batch_size: int,
    progress: bool,
    description: str,
    chat: bool = False,
) -> list[dict[str, Any]]:
    """Log-likelihood of every choice of every item after its context; one record per item. After a
    chat template's assistant opening the choices lose their leading space."""
    from .loglik import loglikelihood

    requests = [
        (ctx, choice.lstrip(" ") if chat else choice)
        for item, ctx in zip(items, contexts, strict=True)
        for choice in item.choices
    ]
    scores = loglikelihood(
        model, tokenizer, requests, batch_size=batch_size, progress=progress, description=description
    )
    records, k = [], 0
    for item in items:
        lls = scores[k : k + len(item.choices)]
        k += len(item.choices)
        logprobs = [s.logprob for s in lls]
        normed = [s.logprob / max(1, len(c.lstrip(" ") if chat else c)) for s, c in zip(lls, item.choices)]
        pred = max(range(len(logprobs)), key=logprobs.__getitem__)
        pred_norm = max(range(len(normed)), key=normed.__getitem__)
        record = {
            "index": item.index,
            "id": item.id,
            **({"subject": item.subject} if item.subject else {}),
            "query": item.query,
            "choices": list(item.choices),
            "gold": item.gold,
            "loglik": logprobs,
            "n_tokens": [s.n_tokens for s in lls],
            "greedy": [s.greedy for s in lls],
            "pred": pred,
            "pred_norm": pred_norm,
            "correct": pred == item.gold,
            "correct_norm": pred_norm == item.gold,
        }
        records.append(record)
    return records


def _metrics(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    n = len(records)
    correct = sum(r["correct"] for r in records)
    correct_norm = sum(r["correct_norm"] for r in records)
    return {
        "n": n,
        "acc": correct / n if n else 0.0,
        "acc_norm": correct_norm / n if n else 0.0,
        "correct": correct,
        "correct_norm": correct_norm,
    }


def summarize(task: str, records: Sequence[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    m = _metrics(records)
    return {
        "task": task,
        "n": m["n"],
        "accuracy": m["acc"],
        "correct": m["correct"],
        "metric": "acc",
        "acc": m["acc"],
        "acc_norm": m["acc_norm"],
        "correct_norm": m["correct_norm"],
        "settings": settings,
    }


def add_subject_metrics(summary: dict[str, Any], records: Sequence[dict[str, Any]]) -> None:
    """MMLU's per-subject metrics (``subjects``) and their unweighted mean accuracy (``acc_macro``)."""
    by_subject: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_subject.setdefault(r["subject"], []).append(r)
    summary["subjects"] = {s: _metrics(rs) for s, rs in by_subject.items()}
    summary["acc_macro"] = sum(m["acc"] for m in summary["subjects"].values()) / len(summary["subjects"])


def _score_after(
    task: str,
    model: Any,
    tokenizer: Any,
    items: Sequence[Item],
    prefix_for: Callable[[Item], str],
    options: EvalOptions,
    chat: bool,
) -> list[dict[str, Any]]:
    """:func:`score_items` with each item's context: description + few-shot blocks + the query;
    with the chat template, all of that is one user turn and the choices start the assistant's reply."""
    from .generate import render_prompt

    texts = [prefix_for(item) + item.query for item in items]
    contexts = [render_prompt(tokenizer, t) for t in texts] if chat else texts
    return score_items(
        model,
        tokenizer,
        items,
        contexts,
        batch_size=options.batch_size,
        progress=options.progress,
        description=task,
        chat=chat,
    )


def _shot_block(item: Item) -> str:
    return item.query + item.choices[item.gold]


def take_shots(candidates: list[T], k: int, source: str) -> list[T]:
    """The first ``k`` few-shot examples of ``candidates`` (both engines); a one-line error naming
    ``source`` when it holds fewer."""
    if len(candidates) < k:
        raise UsageError(
            f"--few-shot {k} needs {k} examples; {source} has {len(candidates)}",
            hint="pass --few-shot-data, or lower --limit",
        )
    return candidates[:k]


def _pool_shots(items: list[Item], evaluated: int, k: int, pool: list[Item] | None, source: str) -> list[Item]:
    if k <= 0:
        return []
    return take_shots(pool if pool is not None else items[evaluated:], k, source)


def _settings(options: EvalOptions, model: Any, chat: bool, **extra: Any) -> dict[str, Any]:
    return {
        **options.to_dict(),
        "chat_template_used": chat,
        "normalisation": "loglik / len(continuation chars)",
        "model": model_name(model),
        **extra,
    }


def _use_chat(tokenizer: Any, options: EvalOptions) -> bool:
    from .generate import uses_chat_template

    # log-likelihood tasks default to plain text, like lm-evaluation-harness
    return uses_chat_template(tokenizer, options.chat_template is True)


def run_pooled_task(
    task: str, loader: Callable[[str], list[Item]], model: Any, tokenizer: Any, options: EvalOptions
) -> EvalRun:
    """ARC / HellaSwag: one file, ``--limit`` first items, few-shot from a pool."""
    check_limit(options.limit, options.few_shot)
    items = loader(options.data)
    evaluated = items if options.limit is None else items[: options.limit]
    if not evaluated:
        raise InputError("no items to evaluate", file=options.data)
    pool = loader(options.few_shot_data) if options.few_shot and options.few_shot_data else None
    source = options.few_shot_data or "the data file past the evaluated items"
    shots = _pool_shots(items, len(evaluated), options.few_shot, pool, source)
    prefix = "".join(_shot_block(s) + FEW_SHOT_SEPARATOR for s in shots)
    chat = _use_chat(tokenizer, options)
    records = _score_after(task, model, tokenizer, evaluated, lambda item: prefix, options, chat)
    settings = _settings(options, model, chat, few_shot_ids=[s.id for s in shots])
    return {"summary": summarize(task, records, settings), "items": records}


def arc_task(name: str) -> Callable[[Any, Any, EvalOptions], EvalRun]:
    def task(model: Any, tokenizer: Any, options: EvalOptions) -> EvalRun:
        return run_pooled_task(name, load_arc, model, tokenizer, options)

    task.__name__ = f"{name}_task"
    return task


arc_challenge_task = arc_task("arc_challenge")
arc_easy_task = arc_task("arc_easy")


def hellaswag_task(model: Any, tokenizer: Any, options: EvalOptions) -> EvalRun:
    return run_pooled_task("hellaswag", load_hellaswag, model, tokenizer, options)


def mmlu_task(model: Any, tokenizer: Any, options: EvalOptions) -> EvalRun:
    """MMLU: every subject's test CSV; ``--limit N`` takes the first N questions of each subject;
    ``--few-shot k`` (at most 5) the first k rows of the subject's dev CSV."""
    check_limit(options.limit, options.few_shot)
    tests, devs = mmlu_files(options.data)
    if options.few_shot_data:
        devs = mmlu_files(options.few_shot_data)[0]
    chat = _use_chat(tokenizer, options)
    evaluated: list[Item] = []
    prefixes: dict[str, str] = {}
    for subject, path in tests.items():
        items = load_mmlu_csv(path)
        evaluated.extend(items if options.limit is None else items[: options.limit])
        prefix = mmlu_description(subject)
        if options.few_shot:
            shots = mmlu_shots(devs, subject, options.few_shot)
            prefix += "".join(_shot_block(s) + FEW_SHOT_SEPARATOR for s in shots[: options.few_shot])
        prefixes[subject] = prefix
    if not evaluated:
        raise InputError("no items to evaluate", file=options.data)
    records = _score_after(
        "mmlu", model, tokenizer, evaluated, lambda item: prefixes[item.subject or ""], options, chat
    )
    settings = _settings(options, model, chat, limit_applies_to="each subject", subjects=len(tests))
    summary = summarize("mmlu", records, settings)
    add_subject_metrics(summary, records)
    return {"summary": summary, "items": records}

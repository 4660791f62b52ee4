r"""MATH / MATH-500: greedy generation, the ``\boxed{}`` answer graded by math-verify (:mod:`.math_verify_grader`).

Data is a local JSONL (or .jsonl.gz) file of ``{"problem", "solution"[, "answer"]}`` records
(hendrycks_math_test.jsonl, math500_test.jsonl); the reference is ``answer`` when present, else
the last ``\boxed{}`` of ``solution``. ``level``/``type``/``subject``/``unique_id`` are kept when
present and the summary breaks accuracy down by subject and level.

Prompts: with a chat template, the problem followed by "Please reason step by step, and put your
final answer within \boxed{}." as a user turn (few-shot examples as earlier user/assistant turns
with the reference solution); in plain mode ``Problem:\n...\n\nSolution:`` blocks (the Minerva
layout), stopping at the next ``Problem:``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, UsageError
from .math_verify_grader import extracted_text, parse_prediction, parse_reference, reference_answer, verify
from .readers import Where, check_limit, field, iter_jsonl
from .tasks import EvalOptions, EvalRun, model_name

TASK = "math"
MAX_NEW_TOKENS = 512
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
PLAIN_STOP = ("\nProblem:", "\n\n\n\n")
HINT = "MATH records have 'problem' and 'solution' (and optionally 'answer')"


@dataclass(frozen=True)
class Item:
    index: int
    line: int
    problem: str
    solution: str
    reference: str
    subject: str | None
    level: str | None
    unique_id: str | None


def load(path: str | Path) -> list[Item]:
    """Read a MATH JSONL file. Raises :class:`InputError` naming file, line and field."""
    items: list[Item] = []
    for n, obj in iter_jsonl(path, hint="pass a MATH JSONL file with --data (e.g. data/math/math500_test.jsonl)"):
        where = Where(file=str(path), line=n, hint=HINT)
        problem = field(obj, "problem", str, **where)
        solution = field(obj, "solution", str, **where)
        answer = field(obj, "answer", str, optional=True, **where)
        reference = reference_answer(solution, answer)
        if reference is None:
            raise InputError(
                "no 'answer' field and no \\boxed{} answer in the solution",
                file=str(path),
                record=f"line {n}",
                field="solution",
            )
        subject = obj.get("subject", obj.get("type"))
        level = obj.get("level")
        items.append(
            Item(
                len(items),
                n,
                problem,
                solution,
                reference,
                str(subject) if subject is not None else None,
                str(level) if level is not None else None,
                str(obj["unique_id"]) if obj.get("unique_id") is not None else None,
            )
        )
    return items


def build_prompt(problem: str, shots: list[Item], *, chat: bool) -> str | list[dict[str, str]]:
    if chat:
        from .generate import chat_turns

        return chat_turns([(f"{s.problem}\n\n{INSTRUCTION}", s.solution) for s in shots], f"{problem}\n\n{INSTRUCTION}")
    blocks = [f"Problem:\n{s.problem}\n\nSolution:\n{s.solution}" for s in shots]
    return "\n\n".join([*blocks, f"Problem:\n{problem}\n\nSolution:"])


def grade(items: list[Item], predictions: list[str]) -> list[dict[str, Any]]:
    records = []
    for item, prediction in zip(items, predictions, strict=True):
        parsed = parse_prediction(prediction)
        extracted = extracted_text(parsed)
        records.append(
            {
                "index": item.index,
                "unique_id": item.unique_id,
                "subject": item.subject,
                "level": item.level,
                "problem": item.problem,
                "reference": item.reference,
                "prediction": prediction,
                "extracted": extracted,
                "correct": verify(parse_reference(item.reference), parsed),
            }
        )
    return records


def _breakdown(records: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[bool]] = defaultdict(list)
    for r in records:
        if r.get(key) is not None:
            groups[str(r[key])].append(r["correct"])
    return {k: {"n": len(v), "accuracy": sum(v) / len(v), "correct": sum(v)} for k, v in sorted(groups.items())}


def math_task(model: Any, tokenizer: Any, options: EvalOptions) -> EvalRun:
    """The ``math`` eval task (see the module docstring)."""
    from .generate import add_generation_stats, generate_for_task, generation_mode

    check_limit(options.limit, options.few_shot)
    items = load(options.data)
    evaluated = items if options.limit is None else items[: options.limit]
    if not evaluated:
        raise InputError("no items to evaluate", file=options.data)
    if options.few_shot:
        pool = load(options.few_shot_data) if options.few_shot_data else items[len(evaluated) :]
        if len(pool) < options.few_shot:
            raise UsageError(
                f"--few-shot {options.few_shot} needs {options.few_shot} worked examples; "
                f"{options.few_shot_data or 'the data file past the evaluated items'} has {len(pool)}",
                hint="pass --few-shot-data (e.g. math/hendrycks_math_train.jsonl), or lower --limit",
            )
        shots = pool[: options.few_shot]
    else:
        shots = []
    _, chat, stop = generation_mode(tokenizer, options, PLAIN_STOP)
    max_new = options.max_new_tokens or MAX_NEW_TOKENS
    prompts = [build_prompt(item.problem, shots, chat=chat) for item in evaluated]
    stats: dict[str, Any] = {}
    predictions = generate_for_task(
        model, tokenizer, prompts, options, stop=stop, max_new_tokens=max_new, description=TASK, stats=stats
    )
    records = grade(evaluated, predictions)
    generation = add_generation_stats(records, stats)
    n = len(records)
    correct = sum(r["correct"] for r in records)
    settings = {
        **options.to_dict(),
        "chat_template_used": chat,
        "stop": list(stop),
        "max_new_tokens": max_new,
        "few_shot_ids": [s.unique_id or s.index for s in shots],
        "model": model_name(model),
    }
    summary = {
        "task": TASK,
        "n": n,
        "accuracy": correct / n,
        "correct": correct,
        "metric": "exact_match",
        "extracted": sum(r["extracted"] is not None for r in records),
        "by_subject": _breakdown(records, "subject"),
        "by_level": _breakdown(records, "level"),
        "generation": generation,
        "settings": settings,
    }
    return {"summary": summary, "items": records}

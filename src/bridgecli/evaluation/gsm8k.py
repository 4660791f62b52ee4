"""GSM8K: grade-school maths word problems, greedy generation, exact match on the final number.

Data is a local JSONL (or .jsonl.gz) file in the GSM8K format: one ``{"question", "answer"}``
object per line, the answer ending with ``#### <number>``.

The prompt is the question (zero-shot by default). ``few_shot=k`` prepends k worked examples taken
from the start of ``few_shot_data`` (or, by default, from the items of the data file past the
evaluated ones): previous user/assistant turns with a chat template, ``Q:``/``A:`` blocks in plain
mode. Worked answers keep their reasoning and ``#### N`` line; calculator annotations
(``<<48/2=24>>``) are removed.

Grading follows the usual GSM8K graders: the number after ``####`` if the model wrote one, else
``\\boxed{N}``, else "the answer is N" / "answer: N", else the last number in the text; numbers are
normalised (no commas, ``$``, or trailing zeros after the decimal point) and compared exactly with
the reference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, UsageError
from .readers import field, iter_jsonl
from .tasks import EvalOptions, EvalRun, model_name

TASK = "gsm8k"
MAX_NEW_TOKENS = 256
PLAIN_STOP = ("\nQ:", "\n\n\n")

# A number: optional sign (not a hyphen between words or digits), optional $, digits with or
# without thousands separators, optional decimals.
_NUMBER = (
    r"(?:(?<![\w.])[-\u2212])?(?:\$\s?(?:[-\u2212](?=\d))?)?"
    r"(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?!\d)"
)
_NUMBER_RE = re.compile(_NUMBER)
_HASH_RE = re.compile(r"####\s*(?:\$\s*)?(" + _NUMBER + r")")
_BOXED_RE = re.compile(r"\\boxed\s*\{\s*(?:\\\$|\$)?\s*(" + _NUMBER + r")")
_ANSWER_RE = re.compile(r"answer\s*(?:is|:|=|is\s*:)\s*[*_\s]*(?:\\?\$\s*)?\**\s*(" + _NUMBER + r")", re.IGNORECASE)
_CALC_RE = re.compile(r"<<[^<>]*>>")


def normalize_number(text: str) -> str | None:
    """Canonical form of a number: ``"$1,000.50"`` -> ``"1000.5"``, ``"5.00"`` -> ``"5"``,
    ``"-0"`` -> ``"0"``. None when ``text`` is not a number."""
    s = text.strip().replace("\u2212", "-").replace(",", "").replace("$", "").replace(" ", "")
    s = s.rstrip(".")
    negative = s.startswith("-")
    if negative:
        s = s[1:]
    if s.startswith("$"):
        s = s[1:]
    m = re.fullmatch(r"(\d*)(?:\.(\d*))?", s)
    if not m or not (m.group(1) or m.group(2)):
        return None
    whole = m.group(1).lstrip("0") or "0"
    frac = (m.group(2) or "").rstrip("0")
    value = f"{whole}.{frac}" if frac else whole
    if value == "0":
        negative = False
    return f"-{value}" if negative else value


def extract_answer(text: str) -> str | None:
    """The model's final answer in ``text``, normalised, or None when it wrote no number."""
    for pattern, pick in ((_HASH_RE, 0), (_BOXED_RE, -1), (_ANSWER_RE, -1)):
        found = [m.group(1) for m in pattern.finditer(text)]
        if found:
            value = normalize_number(found[pick])
            if value is not None:
                return value
    for m in reversed(list(_NUMBER_RE.finditer(text))):
        value = normalize_number(m.group(0))
        if value is not None:
            return value
    return None


def reference_answer(answer: str) -> str | None:
    """The normalised number after the last ``####`` of a GSM8K reference answer."""
    _, sep, tail = answer.rpartition("####")
    if not sep:
        return None
    m = _NUMBER_RE.search(tail)
    return normalize_number(m.group(0)) if m else None


@dataclass(frozen=True)
class Item:
    index: int  # position in the file (0-based, blank lines not counted)
    line: int  # 1-based line number
    question: str
    answer: str  # the full reference solution
    reference: str  # its final number, normalised


def load(path: str | Path) -> list[Item]:
    """Read a GSM8K JSONL (or .jsonl.gz) file. Raises :class:`InputError` naming file and line."""
    items: list[Item] = []
    hint = "GSM8K records have 'question' and 'answer'"
    for n, obj in iter_jsonl(path, hint="pass a GSM8K JSONL file with --data"):
        question = field(obj, "question", str, file=str(path), line=n, hint=hint)
        answer = field(obj, "answer", str, file=str(path), line=n, hint=hint)
        reference = reference_answer(answer)
        if reference is None:
            raise InputError(
                "no final '#### <number>' in the reference answer", file=str(path), record=f"line {n}", field="answer"
            )
        items.append(Item(len(items), n, question, answer, reference))
    return items


def worked_answer(item: Item) -> str:
    """A reference solution as a few-shot demonstration: calculator annotations removed."""
    return _CALC_RE.sub("", item.answer).strip()


def few_shot_examples(items: list[Item], evaluated: int, k: int, pool_path: str | None) -> list[Item]:
    """The first ``k`` items of ``pool_path``, or of ``items`` past the first ``evaluated``."""
    if k <= 0:
        return []
    if pool_path is not None:
        pool, source = load(pool_path), pool_path
    else:
        pool, source = items[evaluated:], "the data file past the evaluated items"
    if len(pool) < k:
        raise UsageError(
            f"--few-shot {k} needs {k} worked examples; {source} has {len(pool)}",
            hint="pass a few-shot pool (e.g. the GSM8K train split) with --few-shot-data, or lower --limit",
        )
    return pool[:k]


def build_prompt(question: str, shots: list[Item], *, chat: bool) -> str | list[dict[str, str]]:
    """Chat turns (user question, assistant solution) or plain ``Q:``/``A:`` blocks."""
    if chat:
        from .generate import chat_turns

        return chat_turns([(shot.question, worked_answer(shot)) for shot in shots], question)
    return "\n\n".join([*(f"Q: {shot.question}\nA: {worked_answer(shot)}" for shot in shots), f"Q: {question}\nA:"])


def grade(items: list[Item], predictions: list[str]) -> list[dict[str, Any]]:
    records = []
    for item, prediction in zip(items, predictions, strict=True):
        extracted = extract_answer(prediction)
        records.append(
            {
                "index": item.index,
                "question": item.question,
                "reference": item.reference,
                "prediction": prediction,
                "extracted": extracted,
                "correct": extracted is not None and extracted == item.reference,
            }
        )
    return records


def summarize(records: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    correct = sum(r["correct"] for r in records)
    n = len(records)
    return {"task": TASK, "n": n, "accuracy": correct / n if n else 0.0, "correct": correct, "settings": settings}


def gsm8k_task(model: Any, tokenizer: Any, options: EvalOptions) -> EvalRun:
    """The ``gsm8k`` eval task (see the module docstring)."""
    from .generate import add_generation_stats, generate_for_task, generation_mode

    if options.limit is not None and options.limit < 1:
        raise UsageError(f"--limit must be at least 1 (got {options.limit})")
    if options.few_shot < 0:
        raise UsageError(f"--few-shot must be 0 or more (got {options.few_shot})")
    items = load(options.data)
    evaluated = items if options.limit is None else items[: options.limit]
    if not evaluated:
        raise InputError("no items to evaluate", file=options.data)
    shots = few_shot_examples(items, len(evaluated), options.few_shot, options.few_shot_data)
    _, chat, stop = generation_mode(tokenizer, options, PLAIN_STOP)
    prompts = [build_prompt(item.question, shots, chat=chat) for item in evaluated]
    stats: dict[str, Any] = {}
    max_new = options.max_new_tokens or MAX_NEW_TOKENS
    predictions = generate_for_task(
        model, tokenizer, prompts, options, stop=stop, max_new_tokens=max_new, description=TASK, stats=stats
    )
    records = grade(evaluated, predictions)
    generation = add_generation_stats(records, stats)
    settings = {
        **options.to_dict(),
        "chat_template_used": chat,
        "stop": list(stop),
        "few_shot_indices": [s.index for s in shots],
        "max_new_tokens": max_new,
        "model": model_name(model),
    }
    return {"summary": {**summarize(records, settings), "generation": generation}, "items": records}

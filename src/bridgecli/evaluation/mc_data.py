"""The data files of the multiple-choice tasks (:mod:`.multiple_choice`): ARC JSONL, HellaSwag (the
llama.cpp text rendering, or the original JSONL) and MMLU CSVs, each read into :class:`Item` records
with the task's question block and choices, and checked with one-line errors naming the file, the
line and the field."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..data.sources import open_text
from ..errors import InputError, UsageError
from .readers import iter_jsonl, require_file


@dataclass(frozen=True)
class Item:
    index: int  # position among the evaluated items' source (0-based; per subject for MMLU)
    id: str
    query: str  # the question block, ending where the continuation starts
    choices: list[str]  # continuations, each with its leading space
    gold: int
    source: str  # "file:line"
    subject: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _where(path: Path, line: int) -> dict[str, Any]:
    return {"file": str(path), "record": f"line {line}"}


# -- ARC --------------------------------------------------------------------------------------

ARC_HINT = "ARC records are {id, question: {stem, choices: [{text, label}]}, answerKey}"


def arc_query(stem: str) -> str:
    return f"Question: {stem}\nAnswer:"


def load_arc(path: str | Path) -> list[Item]:
    """An AI2 ARC JSONL file (ARC-Challenge-Test.jsonl, ARC-Easy-Test.jsonl)."""
    p = require_file(path, hint="pass an ARC JSONL file (e.g. data/arc/ARC-Challenge-Test.jsonl)")
    items: list[Item] = []
    for n, obj in iter_jsonl(p, hint=ARC_HINT):
        where = _where(p, n)
        question = obj.get("question")
        if not isinstance(question, dict):
            raise InputError("missing or not an object", field="question", hint=ARC_HINT, **where)
        stem, choices = question.get("stem"), question.get("choices")
        if not isinstance(stem, str):
            raise InputError("missing or not a string", field="question.stem", hint=ARC_HINT, **where)
        if not isinstance(choices, list) or len(choices) < 2:
            raise InputError("expected a list of at least 2 choices", field="question.choices", **where)
        labels, texts = [], []
        for k, choice in enumerate(choices):
            if (
                not isinstance(choice, dict)
                or not isinstance(choice.get("text"), str)
                or not isinstance(choice.get("label"), str)
            ):
                raise InputError("expected {text, label} strings", field=f"question.choices[{k}]", **where)
            labels.append(choice["label"])
            texts.append(choice["text"])
        key = obj.get("answerKey")
        if not isinstance(key, str) or key not in labels:
            raise InputError(f"{key!r} is not one of the choice labels {labels}", field="answerKey", **where)
        items.append(
            Item(
                len(items),
                str(obj.get("id", len(items))),
                arc_query(stem),
                [" " + t for t in texts],
                labels.index(key),
                f"{p}:{n}",
                extra={"labels": labels},
            )
        )
    return items


# -- HellaSwag --------------------------------------------------------------------------------

HELLASWAG_HINT = "6 lines per item: 'activity label: context', the label 0-3, then 4 endings"


def hellaswag_preprocess(text: str) -> str:
    """lm-evaluation-harness's HellaSwag cleanup: WikiHow markers and bracketed notes removed."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def hellaswag_blocks(p: Path) -> list[tuple[int, str, str, list[str]]]:
    """The items of the llama.cpp text rendering as they stand: ``(first line number, context line,
    label line, endings)``, 6 lines each (trailing blank lines ignored)."""
    try:
        with open_text(p) as fh:
            lines = [line.rstrip("\r\n") for line in fh]
    except (OSError, UnicodeDecodeError, EOFError) as err:
        raise InputError(f"cannot read: {err}", file=str(p)) from None
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) % 6:
        raise InputError(
            f"{len(lines)} lines is not a multiple of 6 (the last item is incomplete)",
            file=str(p),
            record=f"line {len(lines) - len(lines) % 6 + 1}",
            hint=HELLASWAG_HINT,
        )
    blocks = []
    for start in range(0, len(lines), 6):
        ctx, label, *endings = lines[start : start + 6]
        blocks.append((start + 1, ctx, label, endings))
    return blocks


def load_hellaswag(path: str | Path) -> list[Item]:
    """HellaSwag in the llama.cpp text rendering (``hellaswag_val_full.txt[.bz2]``): 6 lines per item.

    A ``.jsonl`` file in the original rowanz/hellaswag schema (ctx_a, ctx_b, activity_label,
    endings, label) is read too."""
    p = require_file(path, hint="pass HellaSwag data (e.g. data/hellaswag/hellaswag_val_full.txt.bz2)")
    if ".jsonl" in p.suffixes:
        return _load_hellaswag_jsonl(p)
    items: list[Item] = []
    for line, ctx, label, endings in hellaswag_blocks(p):
        if not ctx.strip():
            raise InputError("empty context", field="context", hint=HELLASWAG_HINT, **_where(p, line))
        if label.strip() not in {"0", "1", "2", "3"}:
            raise InputError(
                f"expected a label 0-3, got {label!r}", field="label", hint=HELLASWAG_HINT, **_where(p, line + 1)
            )
        items.append(
            Item(
                len(items),
                str(len(items)),
                hellaswag_preprocess(ctx),
                [" " + hellaswag_preprocess(e) for e in endings],
                int(label),
                f"{p}:{line}",
            )
        )
    return items


def _load_hellaswag_jsonl(p: Path) -> list[Item]:
    items: list[Item] = []
    hint = "HellaSwag JSONL records have ctx_a, ctx_b, activity_label, endings, label"
    for n, obj in iter_jsonl(p, hint=hint):
        where = _where(p, n)
        for key in ("ctx_a", "ctx_b", "activity_label"):
            if not isinstance(obj.get(key), str):
                raise InputError("missing or not a string", field=key, hint=hint, **where)
        endings = obj.get("endings")
        if not isinstance(endings, list) or len(endings) < 2 or not all(isinstance(e, str) for e in endings):
            raise InputError("expected a list of ending strings", field="endings", **where)
        try:
            gold = int(obj["label"])
        except (KeyError, TypeError, ValueError):
            raise InputError(f"expected an integer label, got {obj.get('label')!r}", field="label", **where) from None
        if not 0 <= gold < len(endings):
            raise InputError(f"label {gold} out of range", field="label", **where)
        ctx = obj["ctx_a"] + " " + obj["ctx_b"].capitalize()
        query = hellaswag_preprocess(obj["activity_label"] + ": " + ctx)
        items.append(
            Item(
                len(items),
                str(obj.get("ind", len(items))),
                query,
                [" " + hellaswag_preprocess(e) for e in endings],
                gold,
                f"{p}:{n}",
            )
        )
    return items


# -- MMLU -------------------------------------------------------------------------------------

MMLU_HEADER = ["question", "choice0", "choice1", "choice2", "choice3", "answer"]
MMLU_HINT = (
    "MMLU CSV rows are question, 4 choices, answer (0-3 or A-D), with or without the header "
    "question,choice0,choice1,choice2,choice3,answer"
)
LETTERS = "ABCD"


def mmlu_subject(path: Path) -> str:
    name = path.name[: -len(".csv")] if path.name.endswith(".csv") else path.stem
    for suffix in ("_test", "_dev", "_val"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def mmlu_shots(devs: dict[str, Path], subject: str, few_shot: int) -> list[Item]:
    """The dev rows of ``subject`` that few-shot prompts draw on (both engines): a one-line error when the
    subject has no dev split or fewer than ``few_shot`` rows."""
    if subject not in devs:
        raise UsageError(
            f"--few-shot {few_shot}: no dev split for MMLU subject '{subject}'",
            hint="put <subject>_dev.csv files in a dev/ folder beside test/, or pass --few-shot-data",
        )
    shots = load_mmlu_csv(devs[subject])
    if len(shots) < few_shot:
        raise UsageError(f"--few-shot {few_shot}: {devs[subject]} has {len(shots)} rows")
    return shots


def mmlu_description(subject: str) -> str:
    return f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"


def mmlu_query(question: str, choices: Sequence[str]) -> str:
    lines = [question.strip()] + [f"{LETTERS[k]}. {c}" for k, c in enumerate(choices)] + ["Answer:"]
    return "\n".join(lines)


def load_mmlu_csv(path: str | Path) -> list[Item]:
    """One subject's MMLU CSV: the converted layout of an MMLU data folder (header, answers 0-3)
    or the original hendrycks layout (no header, answers A-D)."""
    p = require_file(path, hint="pass an MMLU folder (with test/ and dev/) or one subject's CSV")
    subject = mmlu_subject(p)
    items: list[Item] = []
    try:
        with open_text(p) as fh:
            reader = csv.reader(fh)
            first = True
            for row in reader:
                line = reader.line_num
                if first:
                    first = False
                    if [c.strip().lower() for c in row] == MMLU_HEADER:
                        continue
                if not row or all(not c.strip() for c in row):
                    continue
                where = _where(p, line)
                if len(row) != 6:
                    raise InputError(f"expected 6 columns, got {len(row)}", hint=MMLU_HINT, **where)
                answer = row[5].strip()
                if answer in {"0", "1", "2", "3"}:
                    gold = int(answer)
                elif answer.upper() in {"A", "B", "C", "D"}:
                    gold = LETTERS.index(answer.upper())
                else:
                    raise InputError(f"expected 0-3 or A-D, got {answer!r}", field="answer", hint=MMLU_HINT, **where)
                items.append(
                    Item(
                        len(items),
                        f"{subject}/{len(items)}",
                        mmlu_query(row[0], row[1:5]),
                        [f" {c}" for c in LETTERS],
                        gold,
                        f"{p}:{line}",
                        subject=subject,
                        extra={"question": row[0], "options": row[1:5]},
                    )
                )
    except csv.Error as err:
        raise InputError(f"not valid CSV: {err}", file=str(p)) from None
    except (OSError, UnicodeDecodeError, EOFError) as err:
        raise InputError(f"cannot read: {err}", file=str(p)) from None
    return items


def mmlu_files(path: str | Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """``(test CSV per subject, dev CSV per subject)`` for an MMLU folder, a test/ folder or one CSV.

    A folder holding ``test/`` uses it (and ``dev/`` beside it); a folder of CSVs is the test split
    (``../dev`` is used when it exists); a single CSV is one subject, its dev split looked up in
    ``../dev/<subject>_dev.csv``."""
    p = Path(path)
    if not p.exists():
        raise InputError(
            "no such file or folder", file=str(p), hint="pass an MMLU folder with test/ and dev/ (e.g. data/mmlu)"
        )
    if p.is_file():
        tests = {mmlu_subject(p): p}
        dev_dir = p.parent.parent / "dev"
    else:
        test_dir = p / "test" if (p / "test").is_dir() else p
        dev_dir = p / "dev" if (p / "test").is_dir() else p.parent / "dev"
        tests = {mmlu_subject(f): f for f in sorted(test_dir.glob("*.csv"))}
        if not tests:
            raise InputError("no .csv files", file=str(test_dir), hint=MMLU_HINT)
    devs = {mmlu_subject(f): f for f in sorted(dev_dir.glob("*.csv"))} if dev_dir.is_dir() else {}
    return tests, devs

"""The local data files of ``bridge eval``'s multiple-choice tasks as lm-evaluation-harness expects
them (:mod:`.lm_eval_engine`): records in the layout of the Hugging Face dataset each lm-eval task
reads (``allenai/ai2_arc``, ``Rowan/hellaswag``, ``cais/mmlu``), read by the same loaders as
``bridge eval`` (so bad data fails with the same one-line errors), and handed over as lm-eval's
``custom_dataset``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import mc_data as mc
from .readers import iter_jsonl


def arc_docs(path: str | Path) -> list[dict[str, Any]]:
    """An AI2 ARC JSONL file as ``allenai/ai2_arc`` rows: ``{id, question, choices: {text, label}, answerKey}``."""
    items = mc.load_arc(path)  # validates: one-line errors naming file, line and field
    docs = []
    for item, (_, obj) in zip(items, iter_jsonl(path, hint=mc.ARC_HINT), strict=True):
        q = obj["question"]
        docs.append(
            {
                "id": item.id,
                "question": q["stem"],
                "choices": {"text": [c["text"] for c in q["choices"]], "label": [c["label"] for c in q["choices"]]},
                "answerKey": obj["answerKey"],
            }
        )
    return docs


def hellaswag_docs(path: str | Path) -> list[dict[str, Any]]:
    """HellaSwag as ``Rowan/hellaswag`` rows (``activity_label``, ``ctx_a``, ``ctx_b``, ``endings``, ``label``),
    which lm-eval's own ``process_docs`` turns into prompts.

    The llama.cpp text rendering holds ``activity_label: ctx`` on one line, ``ctx_b`` already
    joined to ``ctx_a`` and not capitalised: the label is the text before the first ``": "``, ``ctx_a``
    the rest, ``ctx_b`` empty, so lm-eval's ``activity_label + ": " + ctx_a + " " + ctx_b``
    (stripped) is the line as written, as ``bridge eval`` reads it."""
    mc.load_hellaswag(path)  # validates
    p = Path(path)
    if ".jsonl" in p.suffixes:
        return [
            {
                "id": str(obj.get("ind", k)),
                "activity_label": obj["activity_label"],
                "ctx_a": obj["ctx_a"],
                "ctx_b": obj["ctx_b"],
                "endings": list(obj["endings"]),
                "label": str(int(obj["label"])),
            }
            for k, (_, obj) in enumerate(iter_jsonl(p, hint="HellaSwag JSONL"))
        ]
    docs: list[dict[str, Any]] = []
    for _, ctx, label, endings in mc.hellaswag_blocks(p):
        activity, sep, rest = ctx.partition(": ")
        if not sep:  # no label: lm-eval's ": " join would add one; keep the line whole instead
            activity, rest = "", ctx
        docs.append(
            {
                "id": str(len(docs)),
                "activity_label": activity,
                "ctx_a": rest,
                "ctx_b": "",
                "endings": endings,
                "label": label.strip(),
            }
        )
    return docs


def mmlu_doc(item: mc.Item) -> dict[str, Any]:
    return {
        "id": item.id,
        "question": item.extra["question"],
        "subject": item.subject,
        "choices": list(item.extra["options"]),
        "answer": item.gold,
    }


def mmlu_docs(path: str | Path) -> list[dict[str, Any]]:
    """One subject's MMLU CSV as ``cais/mmlu`` rows: ``{question, subject, choices, answer}``."""
    return [mmlu_doc(item) for item in mc.load_mmlu_csv(path)]


def dataset(test: list[dict[str, Any]], fewshot: list[dict[str, Any]] | None, **_metadata: Any):
    """lm-eval's ``custom_dataset``: the documents as a ``datasets.DatasetDict`` (it passes the task's
    metadata as keyword arguments, which are not needed here)."""
    import datasets

    splits = {"test": datasets.Dataset.from_list(test)}
    if fewshot is not None:
        splits["fewshot"] = datasets.Dataset.from_list(fewshot)
    return datasets.DatasetDict(splits)

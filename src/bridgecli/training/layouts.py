"""The column layouts of ``bridge compact --columns``: one registered :class:`Layout` per trainer.

A layout says which columns a row has and of which type (for Parquet and ``save_to_disk``), how a
training row becomes a record, and how its trainer reads the record back (``read``: the token ids and
the labels, -100 where no loss is taken), which the tests check on every format for every layout.
Every entry belongs to the token at the same position, unshifted: the trainer shifts. A new trainer
is one :func:`register` call here and one test that its trainer loads the rows
(tests/test_compact_formats.py).

Torch-free: the command line builds ``--columns``' choices and help from :data:`LAYOUTS`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .rows import IGNORE, Row

#: the column a weighted row adds (``select --method importance``): one float per token, which
#: ``bridge train`` multiplies into each supervised token's loss
WEIGHTS_COLUMN = "loss_weights"
#: Arrow types of the columns, by the names a layout uses
ARROW_TYPES = ("string", "int64", "int8", "bool")


@dataclass(frozen=True)
class Layout:
    name: str
    #: the columns and their Arrow types (see :data:`ARROW_TYPES`; lists per token but ``string``)
    columns: dict[str, str]
    #: ``(row, tokenizer fingerprint) -> record`` with exactly ``columns``
    record: Callable[[Row, str], dict[str, Any]]
    #: how its trainer reads a record: ``(input_ids, labels)``
    read: Callable[[dict[str, Any]], tuple[list[int], list[int]]]
    #: what ``--help`` says of it after its name
    summary: str
    #: whether its rows may carry :data:`WEIGHTS_COLUMN` (a weighted selection); only JSONL rows do,
    #: since Parquet and save_to_disk have one schema for every row
    weights: bool = False


#: every layout, by name, in the order ``--help`` lists them; the first is the default
LAYOUTS: dict[str, Layout] = {}


def register(layout: Layout) -> Layout:
    if layout.name in LAYOUTS:
        raise ValueError(f"a column layout named {layout.name!r} is already registered")
    unknown = sorted(set(layout.columns.values()) - set(ARROW_TYPES))
    if unknown:
        raise ValueError(f"column layout {layout.name!r}: unknown column types {unknown}")
    LAYOUTS[layout.name] = layout
    return layout


def record_of(row: Row, name: str, tokenizer_fingerprint: str = "") -> dict[str, Any]:
    """The record of ``row`` in layout ``name``, with :data:`WEIGHTS_COLUMN` when the row is weighted
    (only a layout that carries weights is given one: ``bridge compact`` refuses the others first)."""
    layout = LAYOUTS[name]
    record = layout.record(row, tokenizer_fingerprint)
    if row.weights is not None:
        assert layout.weights, f"column layout {name!r} carries no loss weights"
        record[WEIGHTS_COLUMN] = row.weights
    return record


def help_text() -> str:
    """``--columns``' help: each layout's name and columns."""
    each = "; ".join(f"{layout.name}: {layout.summary}" for layout in LAYOUTS.values())
    return f"Columns for a trainer: {', '.join(LAYOUTS)} ({each})."


def _ids_labels(record: dict[str, Any]) -> tuple[list[int], list[int]]:
    return list(record["input_ids"]), list(record["labels"])


# TRL's SFTTrainer and `bridge train`: the labels as given. The rows name their tokenizer, so that
# `bridge train` checks it even without the side file (TRL passes over the columns it does not use).
register(
    Layout(
        "trl",
        {"id": "string", "input_ids": "int64", "labels": "int64", "tokenizer_fingerprint": "string"},
        lambda row, fingerprint: {
            "id": row.id,
            "input_ids": row.input_ids,
            "labels": row.labels,
            "tokenizer_fingerprint": fingerprint,
        },
        _ids_labels,
        "id, input_ids, labels",
        weights=True,
    )
)

# axolotl (a pre-tokenised dataset is one with exactly these three columns) and LLaMA-Factory.
register(
    Layout(
        "axolotl",
        {"input_ids": "int64", "attention_mask": "int8", "labels": "int64"},
        lambda row, fingerprint: {
            "input_ids": row.input_ids,
            "attention_mask": [1] * len(row.input_ids),
            "labels": row.labels,
        },
        _ids_labels,
        "input_ids, attention_mask, labels",
    )
)

# torchtune: `mask` is True where no loss is taken; its SFTTransform sets
# labels = np.where(mask, CROSS_ENTROPY_IGNORE_IDX, tokens).
register(
    Layout(
        "torchtune",
        {"tokens": "int64", "mask": "bool"},
        lambda row, fingerprint: {"tokens": row.input_ids, "mask": [y == IGNORE for y in row.labels]},
        lambda record: (
            list(record["tokens"]),
            [IGNORE if masked else token for token, masked in zip(record["tokens"], record["mask"])],
        ),
        "tokens, mask (True = no loss)",
    )
)

# A 0/1 loss mask (SkyRL and others): 1 where the token is a target.
register(
    Layout(
        "loss-mask",
        {"input_ids": "int64", "loss_mask": "int8"},
        lambda row, fingerprint: {"input_ids": row.input_ids, "loss_mask": [int(y != IGNORE) for y in row.labels]},
        lambda record: (
            list(record["input_ids"]),
            [token if target else IGNORE for token, target in zip(record["input_ids"], record["loss_mask"])],
        ),
        "input_ids, loss_mask (1 = loss)",
    )
)

#: ``bridge compact --columns`` without the flag
DEFAULT_LAYOUT = next(iter(LAYOUTS))

__all__ = ["ARROW_TYPES", "DEFAULT_LAYOUT", "LAYOUTS", "Layout", "WEIGHTS_COLUMN", "help_text", "record_of", "register"]

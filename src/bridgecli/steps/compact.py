"""``bridge compact``: the training rows BRIDGE executes (compacted prompt + full response).

Rows go out as JSONL (stdout or a file), Parquet, or a ``datasets`` ``save_to_disk`` folder
(``hf``), with the columns a trainer expects (``--columns``: a column layout registered in
:mod:`bridgecli.training.layouts`; token-aligned, unshifted: entry ``i`` belongs to token ``i``, and
the trainer shifts).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import msgspec
import numpy as np

from ..artifacts.rows_meta import RowsMeta, StepParams, rows_meta_path, write_rows_meta

from ..display import printable
from ..errors import EmptyResultError, UsageError
from ..format.reader import open_reader
from ..format.records import Example
from ..format.spec import PROMPT, RESPONSE
from ..optionspec import check, recorded
from ..io import atomic_dir, atomic_path, check_output, is_stdio
from ..runtime.stream_output import StreamOutput
from ..progress import note
from ..training.layouts import DEFAULT_LAYOUT, LAYOUTS, record_of
from ..training.rows import Row, compact_row, weighted_row
from ..training.trim import tail_cut, trim_row
from .common import now, require_stage, selection_of
from .options import FORMATS, CompactOptions  # noqa: F401  (FORMATS: re-exported)


#: the layouts whose rows may carry loss weights, as the message that refuses the others names them
WEIGHTED = " or ".join(name for name, layout in LAYOUTS.items() if layout.weights)


@dataclass
class CompactStats:
    rows: int = 0
    dropped: list[str] = field(default_factory=list)
    #: why each dropped row has no supervised token: reason -> count (see :func:`drop_reason`)
    reasons: dict[str, int] = field(default_factory=dict)
    read: int = 0
    #: the tokens of every example read (those left without a row too)
    tokens_read: int = 0
    #: the tokens of the examples that have a row, before compaction
    tokens_before: int = 0
    tokens_after: int = 0
    supervised: int = 0
    response_tokens: int = 0
    #: rows with per-token loss weights (a sampled selection)
    weighted: int = 0
    #: ``--trim-tail``: rows cut after their last supervised response token, and the tokens cut from them
    trimmed_rows: int = 0
    trimmed: int = 0
    #: the longest row training takes (the model's limit; None: not known here) and what it is
    limit: int | None = None
    limit_source: str = ""
    #: rows longer than ``limit``, and the longest row written: (length, id)
    too_long: int = 0
    longest: tuple[int, str] = (0, "")


def supervision_of(example: Example) -> list[int]:
    """The final supervision set: the closure's when present, else the token-level selection."""
    if example.closure is not None:
        return example.closure.supervise
    return selection_of(example).response_keep


def columns_of(row: Row, preset: str, tokenizer_fingerprint: str = "") -> dict:
    """One output record of ``row`` in the column layout ``preset`` (:mod:`bridgecli.training.layouts`);
    a weighted row (``select --method importance``) adds ``loss_weights``, one per token, which
    ``bridge train`` applies."""
    if preset not in LAYOUTS:
        raise UsageError(f"--columns must be one of {', '.join(LAYOUTS)}, got {preset!r}")
    return record_of(row, preset, tokenizer_fingerprint)


class _TableWriter:
    """Rows to a Parquet file in batches (bounded memory), with the layout's column types."""

    BATCH = 1024

    def __init__(self, path: Path, preset: str):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._pa = pa
        types = {
            "string": pa.string(),
            "int64": pa.list_(pa.int64()),
            "int8": pa.list_(pa.int8()),
            "bool": pa.list_(pa.bool_()),
        }
        self.schema = pa.schema([(name, types[kind]) for name, kind in LAYOUTS[preset].columns.items()])
        self._writer = pq.ParquetWriter(str(path), self.schema)
        self._rows: list[dict] = []

    def write(self, record: dict) -> None:
        self._rows.append(record)
        if len(self._rows) >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        if self._rows:
            self._writer.write_table(self._pa.Table.from_pylist(self._rows, schema=self.schema))
            self._rows = []

    def close(self) -> None:
        self.flush()
        self._writer.close()


@contextmanager
def _row_sink(out: str | None, fmt: str, preset: str, *, lines: bool = False) -> Iterator[Callable[[dict], None]]:
    """A function taking one record, writing it in ``fmt`` to ``out``; the file (or folder) appears
    whole when the block ends and not at all when it fails. With ``lines`` (jsonl only) it takes the
    record's line, already encoded by :func:`_jsonl`."""
    if fmt == "jsonl":
        with StreamOutput(out, binary=False).text() as fh:
            yield fh.write if lines else (lambda record: fh.write(_jsonl(record)))
        return
    assert out is not None, "run_compact refuses parquet and hf to stdout before reading anything"
    if fmt == "parquet":
        with atomic_path(out) as tmp:
            writer = _TableWriter(tmp, preset)
            try:
                yield writer.write
            finally:
                writer.close()
        return
    import datasets

    with atomic_dir(out) as folder, _work_dir(folder.parent) as work:
        rows = Path(work) / "rows.parquet"
        writer = _TableWriter(rows, preset)
        try:
            yield writer.write
        finally:
            writer.close()
        with _quiet_datasets(datasets):
            table = datasets.Dataset.from_parquet(str(rows), cache_dir=str(Path(work) / "cache"))
            table.save_to_disk(str(folder))


#: the scratch folders of ``--format hf`` (rows.parquet and the datasets cache), next to the output
WORK_PREFIX = ".bridge-compact."


@contextmanager
def _work_dir(parent: Path) -> Iterator[Path]:
    """A scratch folder in ``parent`` for the time of the block, locked while it exists (like the io
    module's temporary outputs), and removed after. The scratch folders that killed runs left there
    (SIGKILL runs no cleanup) are swept first: only those that no running process holds and that
    are older than :data:`bridgecli.io.STALE_AFTER`, so a live run's is never touched."""
    from ..io import _hold, sweep_stale

    work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=parent))
    held = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _hold(held)
        sweep_stale(parent, re.escape(WORK_PREFIX) + r"[a-z0-9_]{8}")
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.close(held)


def _jsonl(record: dict, *, row: bool = False) -> str:
    """``json.dumps(record) + "\\n"``, character for character; lists of ints (or of bools) are encoded by
    msgspec, whose output differs from json's only in the space json puts after each comma. ``row``: the
    record's lists come from :func:`columns_of` on a row of a validated stream, so hold ints (< 2^31) or
    bools only, and their types are not checked again."""
    parts = []
    for key, value in record.items():
        if type(value) is list and (
            row or (value and (_INTS >= set(map(type, value)) or _BOOLS >= set(map(type, value))))
        ):
            try:
                parts.append(f"{_json_key(key)}: {_json_list(value).decode().replace(',', ', ')}")
                continue
            except (OverflowError, TypeError, msgspec.EncodeError):  # ints past 64 bits: json's way
                pass
        parts.append(f"{_json_key(key)}: {json.dumps(value)}")
    return "{" + ", ".join(parts) + "}\n"


_INTS, _BOOLS = {int}, {bool}


@functools.lru_cache(maxsize=256)
def _json_key(key) -> str:
    """``json.dumps(key)``: a preset's few column names, encoded once."""
    return json.dumps(key)


_json_list = msgspec.json.Encoder().encode


@contextmanager
def _quiet_datasets(datasets):
    """No progress bars from ``datasets`` while it converts and saves (stderr stays ours)."""
    was = datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            datasets.utils.logging.enable_progress_bar()


#: why a row keeps no supervised response token, worded for the warning compact prints
REASONS = {
    "no-response": "an empty response",
    "left-out": "the selection left the whole example out (a selection of whole examples)",
    "selection": "the selection supervises no response token (b_r = 0: is `bridge select --rho-r` 0 or too small?)",
    "too-long": "every structural unit is longer than the budget b_r (close keeps whole units only: a finer "
    "`bridge close --segmenter`, e.g. step or sentence, or a larger `bridge select --rho-r` keeps them)",
    "no-gain": "no unit that fits b_r has a positive score (close never chooses a unit with q(u) <= 0)",
}


def drop_reason(example: Example, whole_examples: bool = False) -> str:
    """Why ``example`` keeps no supervised response token: a key of :data:`REASONS`. ``whole_examples``:
    the stream's selection keeps or leaves out whole examples (:func:`selects_whole_examples`)."""
    if len(example.tokens.response_positions()) == 0:
        return "no-response"
    sel = selection_of(example)
    if whole_examples and not sel.prompt_keep and not sel.response_keep:
        return "left-out"
    if not sel.response_keep or sel.b_r == 0:
        return "selection"
    closure = example.closure
    if closure is not None and closure.units:
        sizes = [e - s for s, e in zip(closure.units[::2], closure.units[1::2])]
        if min(sizes) > sel.b_r:
            return "too-long"
    return "no-gain"


def selects_whole_examples(header) -> bool:
    """Whether the stream's (last) select step chose whole examples: its record says so
    (``budgets.unit == "example"``, what ``select --method example-importance`` and ``rho-loss`` write)."""
    steps = [s for s in header.steps if s.step == "select"]
    budgets = steps[-1].params.get("budgets") if steps else None
    return isinstance(budgets, dict) and budgets.get("unit") == "example"


def explain_drops(stats: "CompactStats") -> str:
    return "; ".join(f"{n} with {REASONS[r]}" for r, n in sorted(stats.reasons.items(), key=lambda kv: -kv[1]))


def render_text(example: Example, row: Row, supervise: list[int], end: int | None = None) -> str:
    """A human view: the executed prompt, then the response with supervised runs in [[ ]] (up to
    position ``end`` when the row's tail was cut there, ``--trim-tail``). Control
    characters of the data are shown escaped (:func:`~bridgecli.display.printable`): the id on its
    ``###`` line wholly (a newline in an id cannot start a line of its own), the text all but its line
    breaks and tabs."""
    kinds = np.frombuffer(example.tokens.kinds, dtype=np.uint8)
    spans = example.tokens.spans()
    keep = set(selection_of(example).prompt_keep)
    sup = set(supervise)
    prompt_parts, resp_parts, open_ = [], [], False
    for pos, kind in enumerate(kinds):
        if end is not None and pos > end:
            break
        s, e = spans[pos]
        piece = example.text[s:e]
        if kind == RESPONSE:
            if pos in sup and not open_:
                resp_parts.append("[[")
                open_ = True
            elif pos not in sup and open_:
                resp_parts.append("]]")
                open_ = False
            resp_parts.append(piece)
        elif kind == PROMPT:
            if pos in keep:
                prompt_parts.append(piece)
        elif not resp_parts:
            prompt_parts.append(piece)
    if open_:
        resp_parts.append("]]")
    if end is not None:
        resp_parts.append(f" [tail cut: {len(kinds) - 1 - end} tokens not executed]")
    n_p = int((kinds == PROMPT).sum())
    n_r = int((kinds == RESPONSE).sum())
    head = (
        f"### {printable(example.id)}  prompt kept {len(keep)}/{n_p}, supervised {len(sup)}/{n_r}, "
        f"executed {len(row.input_ids)}/{len(kinds)} tokens"
    )
    prompt_text, resp_text = printable("".join(prompt_parts), lines=True), printable("".join(resp_parts), lines=True)
    return f"{head}\n{prompt_text}\n--- response ---\n{resp_text}\n"


def row_limit(header) -> tuple[int, str] | None:
    """(the longest row the stream's model trains on, what that number is) from the model's files
    (:func:`~bridgecli.training.limits.model_limit_of`, no model loads), else the ``--max-length``
    that ``score`` recorded; None when neither is known here."""
    from ..training.limits import model_limit_of

    found = model_limit_of(header.model.source)
    if found is not None:
        return found[0], f"the model's limit ({found[1]} of {header.model.source})"
    for step in header.steps:
        value = step.params.get("max_length") if step.step == "score" else None
        if type(value) is int and value > 0:
            return value, "the `bridge score --max-length` of the stream"
    return None


def long_rows_warning(stats: CompactStats) -> str | None:
    """One line about the rows longer than ``stats.limit``, or None when there are none."""
    if not stats.too_long or stats.limit is None:
        return None
    length, id_ = stats.longest
    return (
        f"warning: {stats.too_long} of {stats.rows} rows are longer than {stats.limit:,} tokens, "
        f"{stats.limit_source} (the longest, {id_}, has {length:,}): `bridge train` refuses them, "
        f"or clips them with `bridge train --clip-long-rows`"
    )


def run_compact(opts: CompactOptions) -> CompactStats:
    check(opts)
    _check_format(opts)
    _check_outputs(opts)
    stats = CompactStats()
    with open_reader(opts.inp) as reader:
        header = _open_stream(reader, stats)
        one = functools.partial(
            _compact_one,
            opts=opts,
            file=reader.name,
            fingerprint=header.model.tokenizer_fingerprint or "",
            whole_examples=selects_whole_examples(header),
        )
        with contextlib.ExitStack() as stack:
            sink = _open_sink(stack, opts)
            _tally(stats, _results(reader, one, opts.workers), sink)
            if stats.rows == 0 and not opts.allow_empty:  # raised inside: no output file is left
                raise _empty_error(stats, reader.name)
    _report(stats, opts.format)
    if opts.out is not None and not is_stdio(opts.out) and opts.format != "text":
        _write_meta(opts.out, opts, header, stats)
    return stats


def _check_format(opts: CompactOptions) -> None:
    """Refuse what ``--format`` cannot do, before anything is read."""
    if opts.format == "text" and opts.columns != DEFAULT_LAYOUT:
        raise UsageError("--columns applies to jsonl, parquet and hf; --format text is a human view")
    if opts.format in ("parquet", "hf") and is_stdio(opts.out):
        raise UsageError(f"--format {opts.format} needs a path: pass -o PATH (stdout takes jsonl or text)")


def _check_outputs(opts: CompactOptions) -> None:
    """What the rows and their side file may replace (:func:`bridgecli.io.check_output`), before
    anything is read: ``--format hf`` replaces a folder only when it holds rows it wrote."""
    hf = opts.format == "hf"
    check_output(opts.out, inputs=(opts.inp,), folder=hf, ours=_compacted_folder if hf else None)
    if opts.out is not None and not is_stdio(opts.out) and opts.format != "text":
        check_output(rows_meta_path(opts.out), inputs=(opts.inp,))


def _compacted_folder(folder: Path) -> bool:
    """Whether ``folder`` holds rows of ``compact --format hf``: a saved dataset and its side file."""
    return (
        (folder / "state.json").is_file()
        and (folder / "dataset_info.json").is_file()
        and (rows_meta_path(folder).is_file())
    )


def _open_stream(reader, stats: CompactStats):
    """The stream's header, once it is known to hold a selection; the row limit noted in ``stats``."""
    require_stage(reader.header, "selection", reader.name, "run `bridge select` (and `bridge close`) first")
    header = reader.header
    if header.stage == "selection":
        note("no closure step in this stream: supervising the token-level selection")
    limit = row_limit(header)
    if limit is not None:
        stats.limit, stats.limit_source = limit
    return header


def _compact_one(
    ex: Example, *, opts: CompactOptions, file: str, fingerprint: str, whole_examples: bool = False
) -> tuple:
    """(id, drop reason or None, tokens before, response tokens, tokens after, supervised, output,
    weighted, tokens cut by --trim-tail) of one example; jsonl lines are encoded here (in the workers
    with --workers)."""
    supervise = supervision_of(ex)
    sel = selection_of(ex)
    if not supervise:
        return ex.id, drop_reason(ex, whole_examples), len(ex.tokens.input_ids), 0, 0, 0, None, False, 0
    row = compact_row(ex.id, ex.tokens, sel.prompt_keep, supervise)
    if sel.response_weights is not None:
        if opts.format not in ("jsonl", "text") or not LAYOUTS[opts.columns].weights:
            raise UsageError(
                f"this selection carries per-token loss weights ('{sel.method}'), which only "
                f"--format jsonl --columns {WEIGHTED} rows hold (bridge train applies them)",
                file=file,
                record=ex.index,
            )
        row = weighted_row(row, ex.tokens, sel.prompt_keep, loss_weights(ex))
    end = tail_cut(ex.tokens, supervise) if opts.trim_tail else None
    cut = 0
    if end is not None:
        untrimmed = len(row.input_ids)
        row = trim_row(row, ex.tokens, sel.prompt_keep, end)
        cut = untrimmed - len(row.input_ids)
    output: str | dict
    if opts.format == "text":
        output = render_text(ex, row, supervise, end) + "\n"
    else:
        columns = columns_of(row, opts.columns, fingerprint)
        output = _jsonl(columns, row=True) if opts.format == "jsonl" else columns
    return (
        ex.id,
        None,
        len(ex.tokens.input_ids),
        ex.tokens.kinds.count(RESPONSE),
        len(row.input_ids),
        len(supervise),
        output,
        row.weights is not None,
        cut,
    )


def loss_weights(example: Example) -> dict[int, float]:
    """The loss weight of each supervised position of a weighted selection (6 significant digits).

    The drawn response tokens carry their ``response_weights``. The EOS weighs 1, except where the
    selection supervises the whole response with one weight (an example-level draw,
    ``select --method example-importance``): the EOS is then in the row exactly when the response is,
    drawn with the same probability, and carries the same weight, so that the weighted loss stays an
    unbiased estimate of full SFT's, the EOS included."""
    sel = selection_of(example)
    assert sel.response_weights is not None
    w = sel.response_weights.numpy()
    weights = dict(zip(sel.response_keep, (float(f"{x:.6g}") for x in w)))
    whole = len(sel.response_keep) == len(example.tokens.response_positions())
    if whole and len(w) and float(w.min()) == float(w.max()):
        for e in example.tokens.eos_positions():
            weights[int(e)] = weights[sel.response_keep[0]]
    return weights


def _open_sink(stack: contextlib.ExitStack, opts: CompactOptions) -> Callable:
    """The function taking each output of :func:`_compact_one`, its file (or folder) held by ``stack``."""
    if opts.format == "text":
        return stack.enter_context(StreamOutput(opts.out, binary=False).text()).write
    return stack.enter_context(_row_sink(opts.out, opts.format, opts.columns, lines=opts.format == "jsonl"))


def _results(reader, one: Callable[[Example], tuple], workers: int) -> Iterator[tuple]:
    """``one`` of each example of ``reader``, in order (on ``workers`` processes when more than one)."""
    if workers > 1:
        from ..runtime.workers import run_pool, validator_of

        return (r for _, batch in run_pool(reader, validator_of(reader), one, list, workers) for r in batch)
    return (one(ex) for ex in reader)


def _tally(stats: CompactStats, results: Iterator[tuple], sink: Callable) -> None:
    """Count each result in ``stats`` and write the output of each row kept to ``sink``."""
    for id_, reason, before, response, after, supervised, output, weighted, cut in results:
        stats.read += 1
        stats.tokens_read += before
        stats.weighted += weighted
        if reason is not None:
            stats.dropped.append(id_)
            stats.reasons[reason] = stats.reasons.get(reason, 0) + 1
            continue
        stats.rows += 1
        stats.tokens_before += before
        stats.response_tokens += response
        stats.tokens_after += after
        stats.supervised += supervised
        stats.trimmed += cut
        stats.trimmed_rows += cut > 0
        if after > stats.longest[0]:
            stats.longest = (after, id_)
        if stats.limit is not None and after > stats.limit:
            stats.too_long += 1
        sink(output)


def _empty_error(stats: CompactStats, file: str) -> EmptyResultError:
    """The error of a run that has no training row to write."""
    what = (
        f"all {stats.read} rows have no supervised response token: {explain_drops(stats)}"
        if stats.read
        else "the stream holds no example"
    )
    return EmptyResultError(
        f"no training row to write; {what}",
        file=file,
        hint="pass --allow-empty to write an empty file anyway",
    )


def _report(stats: CompactStats, fmt: str) -> None:
    """The notes after the run: dropped rows, weighted rows, rows too long to train on, the totals."""
    left = stats.reasons.get("left-out", 0)
    if left:
        note(f"{left} of {stats.read} examples left out by the selection: no row for them")
    if len(stats.dropped) > left:
        others = [r for r in stats.reasons if r != "left-out"]
        shown = ", ".join(stats.dropped[:5]) + (" ..." if len(stats.dropped) > 5 else "")
        most = (len(stats.dropped) - left) * 2 > stats.read - left
        why = "; ".join(
            f"{stats.reasons[r]} with {REASONS[r]}" for r in sorted(others, key=lambda r: -stats.reasons[r])
        )
        note(
            ("warning: " if most else "")
            + f"dropped {len(stats.dropped) - left} of {stats.read - left} rows with no supervised response token "
            f"({shown}): {why}"
        )
    if stats.weighted and fmt != "text":
        note(
            f"{stats.weighted} rows carry loss_weights (an importance-sampled selection): bridge train applies "
            "them; TRL, axolotl and torchtune ignore the column"
        )
    warning = long_rows_warning(stats)
    if warning is not None:
        note(warning)
    if stats.trimmed_rows:
        note(
            f"--trim-tail cut {stats.trimmed} executed tokens from {stats.trimmed_rows} rows "
            f"({stats.trimmed / (stats.tokens_after + stats.trimmed):.1%} of what they would execute)"
        )
    if stats.tokens_before:
        stream = (
            f"; {stats.tokens_after / stats.tokens_read:.1%} of the {stats.tokens_read} tokens of all {stats.read} examples"
            if stats.tokens_read != stats.tokens_before
            else ""
        )
        note(
            f"wrote {stats.rows} rows: {stats.tokens_after} executed tokens of {stats.tokens_before} "
            f"({stats.tokens_after / stats.tokens_before:.1%}{stream}), {stats.supervised} supervised of "
            f"{stats.response_tokens} response tokens"
        )


def _write_meta(out: str, opts: CompactOptions, header, stats: CompactStats) -> None:
    """The rows' sidecar (:mod:`bridgecli.artifacts.rows_meta`) next to the rows written to ``out``."""
    write_rows_meta(
        out,
        RowsMeta(
            created=now(),
            format=opts.format,
            columns=list(LAYOUTS[opts.columns].columns),
            model=header.model.source,
            model_fingerprint=header.model.fingerprint,
            tokenizer_fingerprint=header.model.tokenizer_fingerprint,
            steps=[*(StepParams(s.step, s.params) for s in header.steps), StepParams("compact", recorded(opts))],
            rows=stats.rows,
            dropped=stats.dropped,
            tokens_executed=stats.tokens_after,
            tokens_original=stats.tokens_before,
            supervised=stats.supervised,
            examples_read=stats.read,
            tokens_read=stats.tokens_read,
            trim_tail=opts.trim_tail,
            tokens_trimmed=stats.trimmed,
        ),
    )

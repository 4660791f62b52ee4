"""Pieces every step shares: timestamps, header updates, stage checks, stream-to-stream maps (on one
process, or on a pool: :mod:`bridgecli.runtime.workers`)."""

from __future__ import annotations

import contextlib
import datetime as _dt
from typing import TYPE_CHECKING, Callable, Iterator, TypedDict

import msgspec

from .. import PRODUCER
from ..errors import BridgeError, FormatError
from ..format.reader import frame_records, open_reader
from ..format.records import Example, Header, Selection, Step
from ..format.spec import RECORDS_PER_FRAME, STAGES
from ..format.writer import StreamWriter, compress_frame, encode_record
from ..optionspec import key_values, number_list  # noqa: F401  (re-exported: the steps' text parsers)
from ..progress import progress_bar
from ..runtime.stream_output import StreamOutput

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11


def plugin_spec(spec: str, flag: str) -> tuple[str, dict[str, str]]:
    """``NAME`` or ``NAME:KEY=VALUE,KEY=VALUE`` -> (NAME, options)."""
    name, _, rest = spec.partition(":")
    return name.strip(), key_values([x for x in rest.split(",") if x.strip()], flag)


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def step_record(name: str, params: dict) -> Step:
    return Step(step=name, producer=PRODUCER, time=now(), params=params)


def require_stage(header: Header, needed: str, name: str, hint: str) -> None:
    if STAGES.index(header.stage) < STAGES.index(needed):
        raise FormatError(
            f"this stream is at stage '{header.stage}', but this step needs '{needed}'", file=name, hint=hint
        )


def next_header(header: Header, stage: str, step: Step) -> Header:
    return msgspec.structs.replace(header, stage=stage, producer=PRODUCER, created=now(), steps=[*header.steps, step])


@contextlib.contextmanager
def naming(file: str, record: int | None = None) -> Iterator[None]:
    """Errors raised inside that do not say which file (and record) they concern get ``file`` (and
    ``record``), so the one-line message always points at the input."""
    try:
        yield
    except BridgeError as err:
        if err.file is not None:
            raise
        raise type(err)(
            err.message,
            file=file,
            record=err.record if err.record is not None else record,
            field=err.field,
            hint=err.hint,
        ) from None


class _MapArgs(TypedDict):
    step: Step
    stage: str
    needs: str
    hint: str
    fn: Callable[[Example, Header], Example | None]
    label: str


class MapArgs(_MapArgs, total=False):
    """The keyword arguments :func:`map_stream` and :func:`map_stream_parallel` share: the ``step`` to
    record, the ``stage`` it writes, the stage it ``needs`` (and the ``hint`` when the input is not there
    yet), ``fn`` applied to every example (None drops it), the progress bar's ``label`` and ``display``, the
    name of the input in errors (default: the reader's name; a caller that copied stdin to a temporary file
    passes the original's)."""

    display: str | None


def _next_stage(reader, args: MapArgs) -> Header:
    """The header the map writes, once ``reader``'s stream is checked to be at the stage it needs."""
    require_stage(reader.header, args["needs"], reader.name, args["hint"])
    return next_header(reader.header, args["stage"], args["step"])


@contextlib.contextmanager
def _writing(output: StreamOutput, header: Header) -> Iterator[StreamWriter]:
    """The writer of ``output`` (a map's: never None)."""
    with output.writing(header) as writer:
        assert writer is not None
        yield writer


def map_stream(inp, out, **args: Unpack[MapArgs]) -> int:
    """Read a stream, apply ``fn`` to every example (None drops it), write the next stage to ``out``
    (:class:`~bridgecli.runtime.stream_output.StreamOutput`). Returns the number of examples written."""
    fn = args["fn"]
    output = StreamOutput(out, inputs=(inp,))
    with open_reader(inp) as reader:
        header = _next_stage(reader, args)
        where = args.get("display") or reader.name
        with _writing(output, header) as writer, progress_bar() as bar:
            # timed from the first example: in a pipe, waiting for the step upstream is not this step's time
            task = bar.add_task(args["label"], total=None, unit="ex", start=False)
            for ex in reader:
                bar.start_task(task)  # no-op once started
                with naming(where, ex.index):
                    new = fn(ex, reader.header)
                if new is not None:
                    writer.write(new)
                bar.update(task, advance=1)
            return writer.count


def _pack_stream(results: list) -> tuple:
    """A batch's output records: (count, tally, one zstd frame) when they fill a frame, else (count, tally,
    the encoded records)."""
    records = [r for r, _ in results if r is not None]
    tally = sum(t for _, t in results)
    if len(records) == RECORDS_PER_FRAME:
        return len(records), tally, compress_frame(records), True
    return len(records), tally, records, False


def map_stream_parallel(
    inp, out, *, workers: int, tally: Callable[[Example], int] | None = None, **args: Unpack[MapArgs]
) -> tuple[int, int]:
    """:func:`map_stream` on ``workers`` processes (:mod:`bridgecli.runtime.workers`: the same bytes).
    Returns the number of examples written and the sum of ``tally(new example)`` over them."""
    from ..runtime.pool import cap_workers
    from ..runtime.workers import run_pool, start_pool, validator_of

    workers = cap_workers(workers)
    fn = args["fn"]
    output = StreamOutput(out, inputs=(inp,))
    with open_reader(inp) as reader:
        header = _next_stage(reader, args)
        source = reader.header
        where = args.get("display") or reader.name

        def work(ex: Example):
            with naming(where, ex.index):
                new = fn(ex, source)
            if new is None:
                return None, 0
            return encode_record(new), (tally(new) if tally else 0)

        total = 0
        with (
            start_pool(reader, validator_of(reader), work, _pack_stream, workers) as pool,
            _writing(output, header) as writer,
            progress_bar() as bar,
        ):
            task = bar.add_task(args["label"], total=None, unit="ex", start=False)
            for n, (count, t, data, is_frame) in run_pool(
                reader, validator_of(reader), work, _pack_stream, workers, pool
            ):
                bar.start_task(task)
                total += t
                if is_frame and not writer.write_frame(data, count):
                    data = frame_records(data)
                    is_frame = False
                if not is_frame:
                    for record in data:
                        writer.write_encoded(record)
                bar.update(task, advance=n)
            return writer.count, total


def selection_of(example: Example) -> Selection:
    """``example``'s selection, in a stream past ``select`` (the steps check the stream's stage first)."""
    assert example.selection is not None, f"example {example.id} has no selection"
    return example.selection

"""``bridge show``: one example's selection, in the terminal and optionally as an HTML page."""

from __future__ import annotations

from pathlib import Path

from ..analysis.render import ExampleView, build_view, render_html, render_plain, render_terminal
from ..errors import UsageError
from ..format.reader import open_reader
from ..format.records import Example, Header
from ..io import atomic_path, check_output
from .options import ShowOptions

__all__ = ["ExampleView", "ShowOptions", "find_example", "render_plain", "render_terminal", "run_show"]


def find_example(path: str | None, index: int | None = None, id: str | None = None) -> tuple[Header, Example]:
    """The example whose ``index`` (its position in the input data) or ``id`` matches; the first one
    when neither is given. The rest of the stream is read too (not decoded): a stream that is cut short,
    or has anything after its end record, is refused as every step refuses it."""
    seen: list[int | str] = []
    with open_reader(path) as reader:
        for ex in reader:
            if (
                (index is None and id is None)
                or (index is not None and ex.index == index)
                or (id is not None and ex.id == id)
            ):
                reader.check_rest()  # a stream every other step refuses is refused here too
                return reader.header, ex
            if len(seen) < 8:
                seen.append(ex.index if id is None else ex.id)
        name = reader.name
    if not seen:
        raise UsageError(f"{name}: the stream holds no examples")
    want = f"index {index}" if index is not None else f"id {id!r}"
    shown = ", ".join(map(str, seen)) + (" ..." if len(seen) == 8 else "")
    raise UsageError(
        f"{name}: no example with {want} (first ones: {shown})",
        hint="--index is the example's position in the input data, as `bridge inspect --json` counts",
    )


def run_show(opts: ShowOptions) -> ExampleView:
    if opts.index is not None and opts.id is not None:
        raise UsageError("pass --index or --id, not both")
    if opts.html:
        check_output(opts.html, inputs=(opts.inp,), stdout=False)  # the view goes there
    header, ex = find_example(opts.inp, opts.index, opts.id)
    view = build_view(ex, header)
    if opts.html:
        page = render_html(view, title=f"bridge show {ex.id}")
        with atomic_path(opts.html) as tmp:
            Path(tmp).write_text(page, encoding="utf-8")
    return view

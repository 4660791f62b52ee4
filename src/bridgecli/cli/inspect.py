from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from ..display import markup, printable
from ..steps.inspect import summarize
from ..steps.options import InspectOptions
from .build import command


def _fmt(v) -> str:
    """A value of the summary as a table cell: the stream's strings are data, shown with no markup and
    no control character (bridgecli.display)."""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return markup(json.dumps(v))
    return markup(v)


@command(InspectOptions)
def inspect(opts: InspectOptions) -> None:
    """Header and summary of a bridge stream, human readable."""
    if opts.stats or opts.png:
        from ..analysis.stats import run_stats

        run_stats(opts.inp, as_json=opts.as_json, png=opts.png)
        return
    info = summarize(opts.inp)
    if opts.as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    console = Console(emoji=False)  # :name: in the data stays as it is
    t = Table(title=markup(f"{info['file']}  (format {info['format']}, stage {info['stage']})"), show_header=False)
    t.add_column(style="bold")
    t.add_column()
    for key in (
        "producer",
        "created",
        "source",
        "examples",
        "tokens",
        "eligible_prompt_tokens",
        "eligible_response_tokens",
    ):
        t.add_row(key, _fmt(info[key]))
    for key, val in info["model"].items():
        t.add_row(f"model.{markup(key)}", _fmt(val))
    for section in ("scores", "selection", "closure", "rows"):
        for key, val in (info.get(section) or {}).items():
            t.add_row(f"{section}.{markup(key)}", _fmt(val))
    console.print(t)
    steps = Table(title="steps", show_lines=True)
    steps.add_column("step", style="bold")
    steps.add_column("by / at")
    steps.add_column("parameters")
    for s in info["steps"]:
        params = "\n".join(f"{markup(k)} = {_short(v)}" for k, v in s["params"].items())
        steps.add_row(_fmt(s["step"]), f"{_fmt(s['producer'])}\n{_fmt(s['time'])}", params)
    console.print(steps)


def _short(v, width: int = 48) -> str:
    """:func:`_fmt`, cut to ``width`` characters (before markup is escaped, so no escape is cut)."""
    text = printable(f"{v:.4g}" if isinstance(v, float) else json.dumps(v) if isinstance(v, (dict, list)) else v)
    return markup(text if len(text) <= width else text[: width - 1] + "…")

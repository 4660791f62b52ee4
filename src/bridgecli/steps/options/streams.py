"""The options of the commands that read or join streams: show, inspect, merge (see
:mod:`bridgecli.steps.options`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...optionspec import option, stream_input, stream_output
from ...optionspec import workers as workers_option

# ---------------------------------------------------------------------------------------------- show


@dataclass
class ShowOptions:
    inp: str | None = stream_input()
    index: int | None = option(None, "The example whose index (position in the input data) is K.", metavar="K")
    id: str | None = option(None, "The example with this id.", "--id")
    html: str | None = option(None, "Also write a self-contained HTML page (scores on hover).", metavar="OUT.html")


# ------------------------------------------------------------------------------------------------ inspect


@dataclass
class InspectOptions:
    inp: str | None = stream_input()
    as_json: bool = option(False, "Print the summary as JSON.", "--json")
    stats: bool = option(
        False,
        "Distributions instead: kept ratios per side, U_sur gain over rounds, closure unit sizes, and retention "
        "per token class (answer, digits, math, words, space/punct).",
        "--stats",
    )
    png: str | None = option(None, "With --stats: also draw their histograms into this PNG.")


# -------------------------------------------------------------------------------------------------- merge


@dataclass
class MergeOptions:
    shards: list[str] = option(help="Shard streams of one run (e.g. OUT.shard-00000-of-00002 ...).", argument=True)
    out: str | None = stream_output()
    workers: int = workers_option(
        "Processes compressing the merged stream (1: this process). Output is identical for any number; about one "
        "per core (more than the CPUs this process may use is lowered to that)."
    )

"""The subcommands, in pipeline order."""

from . import analyze
from .close import close
from .compact import compact
from .eval import compare, evaluate
from .inspect import inspect
from .merge import merge
from .plugins import plugins
from .reference import reference
from .score import score
from .select import select
from .show import show
from .train import train
from .warmup import warmup

COMMANDS = [
    ("warmup", warmup),
    ("score", score),
    ("merge", merge),
    ("reference", reference),
    ("select", select),
    ("close", close),
    ("compact", compact),
    ("train", train),
    ("eval", evaluate),
    ("compare", compare),
    ("inspect", inspect),
    ("show", show),
    ("plugins", plugins),
]

# Command groups: (name, build) where build(reporting) returns a Typer sub-app whose commands are
# wrapped by ``reporting`` like the ones above.
GROUPS = [
    ("analyze", analyze.build),
]

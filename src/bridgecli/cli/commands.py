"""The subcommands, in pipeline order."""

from .close import close
from .compact import compact
from .eval import eval
from .inspect import inspect
from .merge import merge
from .plugins import plugins
from .reference import reference
from .score import score
from .select import select
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
    ("eval", eval),
    ("inspect", inspect),
    ("plugins", plugins),
]

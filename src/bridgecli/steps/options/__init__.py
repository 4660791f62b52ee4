"""Every step's options type, torch-free: each field is declared once with
:func:`~bridgecli.optionspec.option` (default, help, flags, range), and a field holding another
options type with :func:`~bridgecli.optionspec.group`. Each command is built from its type alone
(``cli/build.py``): adding a flag is adding a field. Each ``run_*`` checks its options with
:func:`~bridgecli.optionspec.check` before reading anything, so a Python caller gets the same one-line
errors as the command line.

The types live in four modules by the commands they serve: :mod:`.pipeline` (warmup, score, reference,
select, close, compact, train), :mod:`.streams` (show, inspect, merge), :mod:`.evaluation` (eval,
compare) and :mod:`.analysis` (analyze fidelity, shift, robustness, decompose); every name is importable from here.
The step modules re-export their type (``from bridgecli.steps.score import ScoreOptions`` works)."""

from .analysis import (
    SCORE_KINDS,
    PERTURB_HELP,
    NEUTRAL_HELP,
    ANALYZE_OUT_HELP,
    Source,
    FidelityOptions,
    ShiftOptions,
    RobustnessOptions,
    DecomposeOptions,
)
from .evaluation import CompareOptions, EvalCommand, EvalRunOptions
from .pipeline import (
    FORMATS,
    TOKENIZER_CHECKS,
    FROM_HELP,
    WARMUP_SFT_DEFAULTS,
    WARMUP_SFT_HELP,
    WarmupOptions,
    ScoreOptions,
    ReferenceOptions,
    SelectOptions,
    CloseOptions,
    CompactOptions,
    TrainOptions,
)
from .streams import InspectOptions, MergeOptions, ShowOptions

__all__ = [
    "FORMATS",
    "TOKENIZER_CHECKS",
    "FROM_HELP",
    "WARMUP_SFT_DEFAULTS",
    "WARMUP_SFT_HELP",
    "WarmupOptions",
    "ScoreOptions",
    "ReferenceOptions",
    "SelectOptions",
    "CloseOptions",
    "CompactOptions",
    "TrainOptions",
    "ShowOptions",
    "InspectOptions",
    "MergeOptions",
    "EvalRunOptions",
    "EvalCommand",
    "CompareOptions",
    "SCORE_KINDS",
    "PERTURB_HELP",
    "NEUTRAL_HELP",
    "ANALYZE_OUT_HELP",
    "Source",
    "FidelityOptions",
    "ShiftOptions",
    "RobustnessOptions",
    "DecomposeOptions",
]

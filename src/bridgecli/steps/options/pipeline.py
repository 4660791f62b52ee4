"""The options of the pipeline's steps: warmup, score, reference, select, close, compact, train (see
:mod:`bridgecli.steps.options`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...data.examples import DataOptions
from ...modeling.loading import DTYPES
from ...optionspec import (
    ALLOW_EMPTY_HELP,
    DEVICE_HELP,
    FRACTION,
    KEY_VALUES,
    MAX_LAYERS,
    MAX_ROUNDS,
    MODEL_HELP,
    ONCE,
    RETENTION,
    count,
    group,
    internal,
    number,
    option,
    stream_input,
    stream_output,
    workers as workers_option,
)
from ..presets import DEFAULT_METHOD, DEFAULT_RHO_P, PRESETS
from ..presets import help_text as presets_help
from ...artifacts.train_run import DEFAULT_TRAIN_DIR
from ...artifacts.warmup_run import DEFAULT_WARMUP_DIR
from ...training.config import CHECKPOINT_PANEL, LR_FULL, SFTConfig
from ...training.layouts import DEFAULT_LAYOUT, LAYOUTS
from ...training.layouts import help_text as layouts_help

#: ``bridge compact --format``
FORMATS = ("jsonl", "parquet", "hf", "text")
TOKENIZER_CHECKS = ("strict", "vocab")
FROM_HELP = "Warmup run folder (default: runs/warmup)."

# ------------------------------------------------------------------------------------------------- warmup


#: warmup's SFT defaults: one epoch, one micro-batch per step (the learning rate: full fine-tuning's)
WARMUP_SFT_DEFAULTS: dict[str, Any] = {"epochs": 1.0, "grad_accum": 1, "lr": LR_FULL}
#: where warmup words an SFT setting its own way (the rest is `bridge train`'s help)
WARMUP_SFT_HELP = {
    "epochs": "Warmup epochs over the warm split.",
    "lr": "Peak learning rate.",
    "batch_size": "Rows per forward pass.",
    "grad_accum": "Micro-batches per optimizer step.",
}


@dataclass
class WarmupOptions:
    data: str = option(
        help="Warm split (JSONL/JSON/Parquet/save_to_disk), or the full data with --warm-fraction.", argument=True
    )
    val: str | None = option(None, "Validation data D_val for g_target.")
    out: str | Path = option(DEFAULT_WARMUP_DIR, "Run folder (the default of `bridge score --from`).", "--output", "-o")
    overwrite: bool = option(
        False, "Replace the finished warmup run in OUT (it is kept until the new one is written).", "--overwrite"
    )
    model: str | None = option(None, MODEL_HELP, "--model")
    warm_fraction: float | None = option(
        None, "Warm up on this fraction of DATA; its ids are recorded so `score` leaves them out.", range=FRACTION
    )
    val_fraction: float | None = option(None, "Without --val: hold out this fraction of DATA as D_val.", range=FRACTION)
    direction_layers: int = option(4, "Final blocks whose parameters define v.", range=count(1, MAX_LAYERS))
    lam: float = option(0.2, "Weight of the anchor direction in v.", "--lambda", range=number(0, 1e6))
    sft: SFTConfig = group(
        SFTConfig,
        # max_grad_norm: what a run of NaN gradients (training/guard.py) tells warmup to lower, with --lr
        only=("epochs", "lr", "batch_size", "grad_accum", "max_steps", "seed", "max_grad_norm"),
        defaults=WARMUP_SFT_DEFAULTS,
        help=WARMUP_SFT_HELP,
    )
    device: str = option("auto", DEVICE_HELP)
    data_opts: DataOptions = group(DataOptions)


# -------------------------------------------------------------------------------------------------- score


@dataclass
class ScoreOptions:
    data: str = option(help="Data to score (JSONL/JSON/Parquet/save_to_disk folder).", argument=True)
    out: str | None = stream_output()
    run: str | Path | None = option(None, FROM_HELP, "--from")
    scorer: str = option("bridge", "Scorer plugin (`bridge plugins` lists them).")
    #: what the stream's header names as the data (default ``data``; ``<stdin>`` for data on stdin,
    #: which is scored from a temporary copy): recorded as ``data``
    source: str | None = internal(None, record=False)
    #: --scorer-option KEY=VALUE, passed to the scorer
    scorer_options: dict = option(
        None,
        "KEY=VALUE passed to the scorer (repeatable), e.g. debias=common (bridge, atp: a_j less its common "
        "direction, from the warm-up run) or chunks=4 (atp).",
        "--scorer-option",
        factory=dict,
        parse=KEY_VALUES,
    )
    #: at most this many rows per scoring pass
    batch_size: int = option(
        256, "At most this many examples per scoring pass (--max-tokens usually binds first).", range=count()
    )
    #: padded tokens per pass (default: 32768 on CUDA, atp's from free memory, 4096 on CPU)
    max_tokens: int | None = option(
        None,
        "Padded tokens per scoring pass (length-bucketed); default 32768 on a GPU (--scorer atp: what its"
        " reverse pass fits in the free GPU memory, at most 32768), 4096 on CPU.",
        range=count(),
    )
    #: examples per bucketing window and per committed frame
    window: int = option(256, "Examples per bucketing window and per committed (resumable) frame.", range=count())
    #: not recorded: a resumed run's header is the interrupted run's
    resume: bool = option(False, "Continue an interrupted run into the same -o FILE.", "--resume", record=False)
    attention_layers: int = option(4, "Final blocks whose attention rows give A and c.", range=count(1, MAX_LAYERS))
    device: str = option("auto", DEVICE_HELP)
    #: bfloat16 on CUDA, float32 on CPU
    dtype: str = option(
        "auto",
        f"Scoring dtype: auto (bfloat16 on a GPU, float32 on CPU), {', '.join(DTYPES)}. "
        "See docs/benchmarks.md for the speed/accuracy trade-off.",
        choices=("auto", *DTYPES),
    )
    #: float32 on CUDA: TensorFloat-32 matmuls
    tf32: bool = option(True, "float32 on a GPU: TensorFloat-32 matmuls.", "--tf32/--no-tf32")
    data_opts: DataOptions = group(DataOptions)
    #: an input with no example, or nothing scored: an error unless set
    allow_empty: bool = option(False, ALLOW_EMPTY_HELP, "--allow-empty", record=False)


# ---------------------------------------------------------------------------------------------- reference


@dataclass
class ReferenceOptions:
    inp: str | None = stream_input()
    out: str | None = stream_output()
    #: None: the stream's base model
    model: str | None = option(
        None,
        "Reference model: HF folder, .gguf file, HF id, or a `bridge warmup` run folder "
        "(its checkpoint). Default: the stream's base model.",
        "--model",
    )
    #: default: base / warmup / ref
    name: str | None = option(
        None, "Name to store it under (default: base, warmup for a run folder, ref otherwise).", "--as"
    )
    attention: bool = option(
        True, "Also store last-layer attention mass and attention received.", "--attention/--no-attention"
    )
    grad_norms: bool = option(
        False, "Also store ||dL/d embedding|| per token (one backward pass).", "--grad-norms/--no-grad-norms"
    )
    tokenizer_check: str = option(
        "strict",
        "strict: tokenizer fingerprints must match; vocab: identical vocabularies suffice.",
        choices=TOKENIZER_CHECKS,
    )
    batch_size: int = option(8, "Examples per forward pass.", range=count())
    device: str = option("auto", DEVICE_HELP)
    dtype: str = option("float32", f"Model dtype: {', '.join(DTYPES)}.", choices=DTYPES)


# ------------------------------------------------------------------------------------------------- select


@dataclass
class SelectOptions:
    inp: str | None = stream_input()
    out: str | None = stream_output()
    #: None: the --preset's, else bridge (``presets.expand``)
    method: str | None = option(
        None,
        (
            "Selector: bridge, one-pass, independent, a compared method (random, rho1, tokencleaning, sstoken, "
            "llmlingua1, llmlingua2, llm+tc, tokenseek-approx; docs/compared-methods.md), a selection of whole "
            "examples (example-importance, rho-loss; docs/method.md) or a plugin's. Not given: the --preset's, "
            "else the default."
        ),
        fallback=DEFAULT_METHOD,
    )
    #: a named setting of method, rho_p and options (steps/presets.py); what is given wins
    preset: str | None = option(None, presets_help(), "--preset", choices=tuple(PRESETS), metavar="NAME", parse=ONCE)
    #: None: the --preset's, else 0.75
    rho_p: float | None = option(
        None,
        (
            "Prompt retention ratio: b_p = ceil(rho_p * eligible). Dropped prompt tokens leave the training "
            "input; 1 keeps every one (docs/results.md measures what cutting prompts costs). Not given: the "
            "--preset's, else the default."
        ),
        "--rho-p",
        range=RETENTION,
        fallback=DEFAULT_RHO_P,
    )
    rho_r: float = option(
        0.75,
        (
            "Response retention ratio: b_r = ceil(rho_r * eligible), an upper bound on supervision. After "
            "`bridge close` the supervised share can end well below rho_r (see below). For the selections of "
            "whole examples, the share of examples kept: ceil(rho_r * examples with a response)."
        ),
        "--rho-r",
        range=RETENTION,
    )
    rounds: int = option(4, "Alternating rounds T.", "--rounds", "-T", range=count(1, MAX_ROUNDS))
    #: --option key=value, passed to the selector (over the preset's, key by key)
    options: dict = option(
        None,
        "KEY=VALUE passed to the selector (repeatable), e.g. seed=42, ranking=sample.",
        "--option",
        factory=dict,
        parse=KEY_VALUES,
    )
    #: presets or regexes: prompt tokens always kept
    protect_prompt: list[str] = option(
        help=(
            "Prompt tokens overlapping a match are always kept (repeatable). A Python regex (^ and $ match at "
            "line ends) or a preset: 'digits' (\\d+), 'answer' (the last '#### N' line and the last "
            "\\boxed{...}). They count against b_p; the rest is filled by the method's ranking."
        ),
        factory=list,
        metavar="REGEX",
    )
    #: ... response tokens always supervised
    protect_response: list[str] = option(
        help=(
            "Response tokens overlapping a match are always supervised, by select and by close (repeatable), "
            "e.g. 'answer' or '####.*$'. Same presets; they count against b_r."
        ),
        factory=list,
        metavar="REGEX",
    )
    #: example | global | global-sides (steps/global_budget.py)
    budget: str = option(
        "example",
        (
            "example: b_p, b_r per example. global: the stream-wide total B = sum of the per-example budgets "
            "(rho_p m + rho_r n, each rounded up) goes to the tokens with the largest marginal gain in U_sur "
            "at their example's own solution, prompt and response in one pool; global-sides: one pool per "
            "side. Reads the input twice (stdin is copied to a temporary file). Surrogate selectors only; "
            "docs/method.md, Global budget."
        ),
        "--budget",
        metavar="example|global|global-sides",
    )
    #: processes for the per-example work (runtime/workers.py)
    workers: int = workers_option()


# -------------------------------------------------------------------------------------------------- close


@dataclass
class CloseOptions:
    inp: str | None = stream_input()
    out: str | None = stream_output()
    segmenter: str = option("sentence", "Segmenter: sentence, math, step, list, code, or a plugin's.")
    alpha: float = option(0.0, "Length normalisation: q(u) = |u|^-alpha * sum of scores.", range=number(0, 1))
    fill: bool = option(
        False,
        "Spend b_r exactly: after the knapsack, add the best remaining units that fit (by q), then single "
        "tokens (by score), until min(b_r, n) tokens are supervised.",
        "--fill/--no-fill",
    )
    #: processes for the per-example work (runtime/workers.py)
    workers: int = workers_option()


# ------------------------------------------------------------------------------------------------ compact


@dataclass
class CompactOptions:
    inp: str | None = stream_input()
    out: str | None = option(
        "-",
        "Training rows: a JSONL or Parquet file, an hf folder, or text ('-' for stdout: jsonl or text).",
        "--output",
        "-o",
    )
    format: str = option(
        "jsonl",
        f"{', '.join(FORMATS)}: JSONL rows, a Parquet file, a datasets save_to_disk folder, or a human view.",
        choices=FORMATS,
    )
    #: a trainer's column layout (bridgecli/training/layouts.py)
    columns: str = option(DEFAULT_LAYOUT, layouts_help(), choices=tuple(LAYOUTS))
    #: cut each row after its last supervised response token (training/trim.py)
    trim_tail: bool = option(
        False,
        (
            "Cut each row after its last supervised response token: the rest of the response and the EOS are "
            "then neither executed nor supervised. A row whose last response token is supervised stays whole. "
            "Saves executed tokens where the tail is unsupervised; the summary reports how many."
        ),
        "--trim-tail",
    )
    #: writing 0 rows: an error unless set
    allow_empty: bool = option(False, ALLOW_EMPTY_HELP, "--allow-empty", record=False)
    #: processes for the per-example work (runtime/workers.py)
    workers: int = workers_option()


# -------------------------------------------------------------------------------------------------- train


@dataclass
class TrainOptions:
    data: str = option(help="JSONL rows with input_ids and labels (what `bridge compact` writes).", argument=True)
    out: str | Path = option(
        DEFAULT_TRAIN_DIR, "Run folder: the trained HF model, metrics.jsonl, checkpoints/.", "--output", "-o"
    )
    model: str | None = option(None, MODEL_HELP, "--model")
    sft: SFTConfig = group(SFTConfig)
    device: str = option("auto", DEVICE_HELP)
    resume: bool = option(
        False,
        "Continue from the latest complete checkpoint in OUT (start fresh when there is none; when OUT holds "
        "this run finished, nothing is trained).",
        "--resume",
        panel=CHECKPOINT_PANEL,
    )
    overwrite: bool = option(
        False,
        "Start over in an OUT that holds a finished run or checkpoints of another: the new run trains beside "
        "it and replaces it once written.",
        "--overwrite",
        panel=CHECKPOINT_PANEL,
    )
    live: bool | None = None  # None: when stderr is a terminal
    #: no row to train on: exit 0 without writing a model, instead of an error
    allow_empty: bool = option(False, ALLOW_EMPTY_HELP, "--allow-empty")
    #: the longest row (None: the model's limit, training/limits.py)
    max_length: int | None = option(
        None,
        "Longest row in tokens (default and upper bound: the model's limit, max_position_embeddings, or its "
        "tokenizer's model_max_length). A longer row is refused before the first step, naming it, unless "
        "--clip-long-rows.",
        "--max-length",
        range=count(),
    )
    clip_long_rows: bool = option(
        False,
        "Cut rows longer than --max-length to their first N tokens instead of refusing them. The labels past N "
        "go with them (supervised tokens there and the EOS are not trained); a row left with no supervised "
        "label is dropped, and the counts are reported.",
        "--clip-long-rows",
    )

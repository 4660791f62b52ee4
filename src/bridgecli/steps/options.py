"""Every step's options type, in one torch-free module: each field is declared once with
:func:`~bridgecli.optionspec.option` (default, help, flags, range). The command line builds its flags
from these (``cli/``), and each ``run_*`` checks its options with :func:`~bridgecli.optionspec.check`
before reading anything, so a Python caller gets the same one-line errors as the command line.

The step modules re-export their type (``from bridgecli.steps.score import ScoreOptions`` works)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..analysis.shift import LEVELS as SHIFT_LEVELS
from ..analysis.shift import SUBSETS as SHIFT_SUBSETS
from ..data.examples import DataOptions
from ..modeling.loading import DTYPES
from ..optionspec import (
    ALLOW_EMPTY_HELP,
    DEVICE_HELP,
    FRACTION,
    MAX_LAYERS,
    MAX_ROUNDS,
    MODEL_HELP,
    RETENTION,
    SEED,
    WORKERS_HELP,
    count,
    number,
    option,
)
from ..artifacts.train_run import DEFAULT_TRAIN_DIR
from ..artifacts.warmup_run import DEFAULT_WARMUP_DIR
from ..training.config import SFTConfig

#: ``bridge compact --format`` and ``--columns`` (column -> arrow type name)
FORMATS = ("jsonl", "parquet", "hf", "text")
PRESETS = {
    "trl": {"id": "string", "input_ids": "int64", "labels": "int64", "tokenizer_fingerprint": "string"},
    "axolotl": {"input_ids": "int64", "attention_mask": "int8", "labels": "int64"},
    "torchtune": {"tokens": "int64", "mask": "bool"},
    "loss-mask": {"input_ids": "int64", "loss_mask": "int8"},
}
TOKENIZER_CHECKS = ("strict", "vocab")
FROM_HELP = "Warmup run folder (default: runs/warmup)."

# ------------------------------------------------------------------------------------------------- warmup


#: warmup's SFT defaults: one epoch, one micro-batch per step
WARMUP_SFT = SFTConfig(epochs=1.0, grad_accum=1)
#: where warmup words an SFT setting its own way (the rest is `bridge train`'s help)
WARMUP_SFT_HELP = {
    "epochs": "Warmup epochs over the warm split.",
    "lr": "Peak learning rate.",
    "batch_size": "Rows per forward pass.",
    "grad_accum": "Micro-batches per optimizer step.",
}


@dataclass
class WarmupOptions:
    data: str = option(help="Warm split (JSONL/JSON/Parquet/save_to_disk), or the full data with --warm-fraction.")
    val: str | None = option(None, "Validation data D_val for g_target.")
    out: str | Path = option(DEFAULT_WARMUP_DIR, "Run folder (score's default --from).", "--output", "-o")
    model: str | None = option(None, MODEL_HELP, "--model")
    warm_fraction: float | None = option(
        None, "Warm up on this fraction of DATA; its ids are recorded so `score` leaves them out.", range=FRACTION
    )
    val_fraction: float | None = option(None, "Without --val: hold out this fraction of DATA as D_val.", range=FRACTION)
    direction_layers: int = option(4, "Final blocks whose parameters define v.", range=count(1, MAX_LAYERS))
    lam: float = option(0.2, "Weight of the anchor direction in v.", "--lambda", range=number(0, 1e6))
    device: str = option("auto", DEVICE_HELP)
    sft: SFTConfig = field(
        default_factory=lambda: SFTConfig(epochs=WARMUP_SFT.epochs, grad_accum=WARMUP_SFT.grad_accum)
    )
    data_opts: DataOptions = field(default_factory=DataOptions)


# -------------------------------------------------------------------------------------------------- score


@dataclass
class ScoreOptions:
    data: str = option(help="Data to score (JSONL/JSON/Parquet/save_to_disk folder).")
    out: str | None = None
    run: str | Path | None = option(None, FROM_HELP, "--from")
    scorer: str = option("bridge", "Scorer plugin (`bridge plugins` lists them).")
    #: what the stream's header names as the data (default ``data``; ``<stdin>`` for data on stdin,
    #: which is scored from a temporary copy)
    source: str | None = None
    #: --scorer-option KEY=VALUE, passed to the scorer
    scorer_options: dict = option(
        help="KEY=VALUE passed to the scorer (repeatable), e.g. chunks=4 for atp.", factory=dict
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
    resume: bool = option(False, "Continue an interrupted run into the same -o FILE.", "--resume")
    #: an input with no example, or nothing scored: an error unless set
    allow_empty: bool = option(False, ALLOW_EMPTY_HELP, "--allow-empty")
    data_opts: DataOptions = field(default_factory=DataOptions)


# ---------------------------------------------------------------------------------------------- reference


@dataclass
class ReferenceOptions:
    inp: str | None = None
    out: str | None = None
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
    batch_size: int = option(8, "Examples per forward pass.", range=count())
    device: str = option("auto", DEVICE_HELP)
    dtype: str = option("float32", f"Model dtype: {', '.join(DTYPES)}.", choices=DTYPES)
    tokenizer_check: str = option(
        "strict",
        "strict: tokenizer fingerprints must match; vocab: identical vocabularies suffice.",
        choices=TOKENIZER_CHECKS,
    )


# ------------------------------------------------------------------------------------------------- select


@dataclass
class SelectOptions:
    inp: str | None = None
    out: str | None = None
    method: str = option(
        "bridge",
        (
            "Selector: bridge, one-pass, independent, a compared method (random, rho1, tokencleaning, sstoken, "
            "llmlingua1, llmlingua2, llm+tc, tokenseek-approx; docs/compared-methods.md) or a plugin's."
        ),
    )
    rho_p: float = option(0.75, "Prompt retention ratio: b_p = ceil(rho_p * eligible).", "--rho-p", range=RETENTION)
    rho_r: float = option(
        0.75,
        (
            "Response retention ratio: b_r = ceil(rho_r * eligible), an upper bound on supervision. After "
            "`bridge close` the supervised share can end well below rho_r (see below)."
        ),
        "--rho-r",
        range=RETENTION,
    )
    rounds: int = option(4, "Alternating rounds T.", "--rounds", "-T", range=count(1, MAX_ROUNDS))
    #: --option key=value, passed to the selector
    options: dict = option(
        help="KEY=VALUE passed to the selector (repeatable), e.g. seed=42, ranking=sample.", factory=dict
    )
    #: presets or regexes: prompt tokens always kept
    protect_prompt: list[str] = option(
        help=(
            "Prompt tokens overlapping a match are always kept (repeatable). A Python regex (^ and $ match at "
            "line ends) or a preset: 'digits' (\\d+), 'answer' (the last '#### N' line and the last "
            "\\boxed{...}). They count against b_p; the rest is filled by the method's ranking."
        ),
        factory=list,
    )
    #: ... response tokens always supervised
    protect_response: list[str] = option(
        help=(
            "Response tokens overlapping a match are always supervised, by select and by close (repeatable), "
            "e.g. 'answer' or '####.*$'. Same presets; they count against b_r."
        ),
        factory=list,
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
    )
    #: processes for the per-example work (runtime/workers.py)
    workers: int = option(1, WORKERS_HELP, "--workers", range=count())


# -------------------------------------------------------------------------------------------------- close


@dataclass
class CloseOptions:
    inp: str | None = None
    out: str | None = None
    segmenter: str = option("sentence", "Segmenter: sentence, math, step, list, code, or a plugin's.")
    alpha: float = option(0.0, "Length normalisation: q(u) = |u|^-alpha * sum of scores.", range=number(0, 1))
    fill: bool = option(
        False,
        "Spend b_r exactly: after the knapsack, add the best remaining units that fit (by q), then single "
        "tokens (by score), until min(b_r, n) tokens are supervised.",
        "--fill/--no-fill",
    )
    #: processes for the per-example work (runtime/workers.py)
    workers: int = option(1, WORKERS_HELP, "--workers", range=count())


# ------------------------------------------------------------------------------------------------ compact


@dataclass
class CompactOptions:
    inp: str | None = None
    out: str | None = option(
        None,
        "Training rows: a JSONL or Parquet file, an hf folder, or text ('-' for stdout: jsonl or text).",
        "--output",
        "-o",
    )
    format: str = option(
        "jsonl",
        f"{', '.join(FORMATS)}: JSONL rows, a Parquet file, a datasets save_to_disk folder, or a human view.",
        choices=FORMATS,
    )
    columns: str = option(
        "trl",
        f"Columns for a trainer: {', '.join(PRESETS)} (trl: id, input_ids, labels; "
        "axolotl: input_ids, attention_mask, labels; torchtune: tokens, mask (True = no "
        "loss); loss-mask: input_ids, loss_mask (1 = loss)).",
        choices=tuple(PRESETS),
    )
    #: writing 0 rows: an error unless set
    allow_empty: bool = option(False, ALLOW_EMPTY_HELP, "--allow-empty")
    #: processes for the per-example work (runtime/workers.py)
    workers: int = option(1, WORKERS_HELP, "--workers", range=count())


# -------------------------------------------------------------------------------------------------- train


@dataclass
class TrainOptions:
    data: str = option(help="JSONL rows with input_ids and labels (what `bridge compact` writes).")
    out: str | Path = option(
        DEFAULT_TRAIN_DIR, "Run folder: the trained HF model, metrics.jsonl, checkpoints/.", "--output", "-o"
    )
    model: str | None = option(None, MODEL_HELP, "--model")
    device: str = option("auto", DEVICE_HELP)
    sft: SFTConfig = field(default_factory=SFTConfig)
    resume: bool = option(
        False, "Continue from the latest complete checkpoint in OUT (start fresh when there is none).", "--resume"
    )
    overwrite: bool = option(False, "Start over in an OUT that holds checkpoints of another run.", "--overwrite")
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


# --------------------------------------------------------------------------------------------------- eval


@dataclass
class EvalRunOptions:
    """``bridge eval``: one model, one or more tasks, one model load."""

    model: str = option(
        help="Model folder (e.g. runs/final), .gguf file, HF id, or 'smollm2'; with --compare, run "
        "folders (or eval-*.json files)."
    )
    tasks: list[str] = option(
        help="Eval task(s), comma-separated or repeated (`bridge plugins` lists them).", factory=lambda: ["gsm8k"]
    )
    #: PATH (one task) or TASK=PATH each
    data: list[str] = option(
        help="Task data: PATH (one task) or TASK=PATH, repeatable (e.g. data/gsm8k/test.jsonl).", factory=list
    )
    data_dir: Path | None = option(
        None,
        "Folder holding each task's data in its standard place (gsm8k/test.jsonl, "
        "...; see docs/eval.md): tasks without --data read their file there.",
    )
    output: Path | None = option(
        None,
        "Result JSON (one task) or folder for eval-TASK.json files (default: MODEL/ when MODEL is a folder).",
        "--output",
        "-o",
    )
    limit: int | None = option(None, "Evaluate only the first N items (MMLU: per subject).")
    few_shot: int = option(0, "Worked examples prepended to each prompt.")
    few_shot_data: str | None = option(
        None, "Where few-shot examples come from (default: the data past the evaluated items; MMLU: dev/)."
    )
    batch_size: int = option(8, "Prompts per generation batch / inputs per scoring forward.")
    batch_tokens: int | None = option(
        None,
        "Generation: also cap a batch at this many tokens, rows x (longest prompt + max new tokens), "
        "so --batch-size can be large (e.g. --batch-size 2048 --batch-tokens 400000).",
    )
    compile: bool = option(
        False,
        "Generation on CUDA: a static KV cache and a torch.compile'd decoding step (elsewhere: ignored, with a note).",
        "--compile",
    )
    max_new_tokens: int | None = option(
        None, "Generation length limit (default: the task's: gsm8k 256, math 512, humaneval/mbpp 512)."
    )
    chat_template: bool | None = option(
        None,
        "Use the tokenizer's chat template (default: yes for generation tasks, "
        "heldout-loss and answer-loss, no for multiple choice).",
        "--chat-template/--no-chat-template",
    )
    code_timeout: float = option(10.0, "Seconds per generated program (humaneval, mbpp).")
    allow_code_execution: bool = option(
        False,
        "Let humaneval/mbpp run model-written code (in a bubblewrap sandbox; or set BRIDGE_ALLOW_CODE_EXECUTION=1).",
        "--allow-code-execution",
    )
    unsafe_code_execution: bool = option(
        False,
        "Where no bubblewrap sandbox works: run model-written code anyway, "
        "with process limits only (not a security boundary).",
        "--unsafe-code-execution",
    )
    device: str = option("auto", "auto, cpu, cuda, ...")
    dtype: str | None = option(None, "float32 (default), bfloat16, float16.")
    resume: bool = option(
        False,
        "Continue an interrupted run: keep each task's result already written by the same "
        "request (model, data, settings), and what an interrupted task had generated or "
        "scored.",
        "--resume",
    )
    engine: str = option(
        "bridge",
        "Who runs the tasks: bridge, or lm-eval (lm-evaluation-harness on the same model "
        "and local files: arc_challenge, arc_easy, hellaswag, mmlu; needs "
        "bridgecli[lm-eval]).",
    )


@dataclass
class CompareOptions:
    """``bridge compare``: the paper's Table 1 for finished runs."""

    runs: list[str] = option(help="Run folders (or eval-*.json files), one row each.", factory=list)
    target: str | None = option(None, "The target task column (default: gsm8k if present, else math).")
    #: comma-separated; None: every general task present
    general: str | None = option(
        None, "General-capability columns (default: arc_challenge,hellaswag,mmlu,humaneval present)."
    )
    metric: str | None = option(None, "Summary field to show where a task has it, e.g. acc_norm (default: accuracy).")
    paired: bool = option(
        False,
        "Also print each run's difference from the first run on every task both have, with a paired "
        "bootstrap 95% interval over the items both evaluated.",
        "--paired",
    )


# ---------------------------------------------------------------------------------------------- show


@dataclass
class ShowOptions:
    inp: str | None = None
    index: int | None = option(None, "The example whose index (position in the input data) is K.")
    id: str | None = option(None, "The example with this id.", "--id")
    html: str | None = option(None, "Also write a self-contained HTML page (scores on hover).")


# ------------------------------------------------------------------------------------------------ analyze

SCORE_KINDS = ("both", "exact", "surrogate")
PERTURB_HELP = (
    "Exact prompt perturbation: mask (hide the key at every layer, positions unchanged) or replace "
    "(neutral token's embedding)."
)
NEUTRAL_HELP = "The neutral token text for --perturb replace (default: a single space)."
ANALYZE_OUT_HELP = "JSON report ('-' for stdout)."


@dataclass
class Source:
    """Where the examples and the scoring checkpoint come from (shared by fidelity and shift)."""

    data: str = option(help="Data (JSONL/JSON/Parquet/save_to_disk), as for `bridge score`.")
    run: str | Path | None = option(None, FROM_HELP, "--from")
    n: int = option(200, "Examples to analyse.", "--n", range=count())
    seed: int = option(0, "Sampling seed (examples; random subsets).", range=SEED)
    first: bool = option(False, "Take the first N examples instead of a seeded sample.", "--first")
    device: str = option("auto", DEVICE_HELP)
    dtype: str = option(
        "float32", "Model dtype: float32 or float64 (exact differences are small).", choices=("float32", "float64")
    )
    batch_size: int = option(16, "Examples per scoring pass, and perturbed copies per exact pass.", range=count())
    attention_layers: int = option(4, "Final blocks whose attention rows give A and c.", range=count(1, MAX_LAYERS))
    data_opts: DataOptions = field(default_factory=DataOptions)
    #: exact prompt matrices, reused across runs (fidelity, shift)
    cache: str | Path | None = option(
        None,
        "Keep the exact prompt perturbation matrices in this folder (fidelity "
        "and shift, and reruns, compute each once).",
    )

    def describe(self) -> dict:
        return {
            "data": str(self.data),
            "from": str(self.run) if self.run is not None else None,
            "n": self.n,
            "seed": self.seed,
            "sample": "first" if self.first else "random",
            "device": self.device,
            "dtype": self.dtype,
            "batch_size": self.batch_size,
            "attention_layers": self.attention_layers,
            "max_length": self.data_opts.max_length,
            "chat_template": self.data_opts.chat_template,
            "cache": str(self.cache) if self.cache is not None else None,
        }


@dataclass
class FidelityOptions:
    src: Source
    out: str | None = option("fidelity.json", ANALYZE_OUT_HELP, "--output", "-o")
    rho_p: float = option(0.75, "Prompt retention of the selected state.", "--rho-p", range=RETENTION)
    rho_r: float = option(0.75, "Response retention of the selected state.", "--rho-r", range=RETENTION)
    rounds: int = option(4, "Alternating rounds T of the selected state.", "--rounds", "-T", range=count(1, MAX_ROUNDS))
    method: str = option("bridge", "Selector giving the states S_p, S_r.")
    perturb: str = option("mask", PERTURB_HELP)
    neutral: str | None = option(None, NEUTRAL_HELP)
    proxies: list[str] = option(
        help="Also compare a scorer plugin's scores (its B matrix if it writes one, else "
        "(a, c, A) through the BRIDGE formula); NAME or NAME:KEY=VALUE,... (scorer "
        "options); repeatable.",
        factory=list,
    )


@dataclass
class ShiftOptions:
    src: Source
    out: str | None = option("shift.json", ANALYZE_OUT_HELP, "--output", "-o")
    png: str | None = option(None, "Line plot (default: the JSON path with .png).")
    #: opposite-side retentions; each a retention ratio, 0 excluded (nothing left to rank against)
    levels: tuple[float, ...] = option(SHIFT_LEVELS, "Opposite-side retention ratios, comma-separated.")
    subset: str = option(
        "top",
        "Opposite-side state at each retention: top (its full-state surrogate top-b) or random.",
        choices=SHIFT_SUBSETS,
    )
    scores: str = option("both", "exact (perturbation), surrogate, or both.", choices=SCORE_KINDS)
    perturb: str = option("mask", PERTURB_HELP)
    neutral: str | None = option(None, NEUTRAL_HELP)


@dataclass
class RobustnessOptions:
    inp: str | None = None
    out: str | None = option("robustness.json", ANALYZE_OUT_HELP, "--output", "-o")
    rho_p: float = option(0.75, "Prompt retention: b_p of S^F and q = b_p for responses.", "--rho-p", range=RETENTION)
    rho_r: float = option(0.75, "Response retention: b_r of S^F and q = b_r for prompts.", "--rho-r", range=RETENTION)
    #: every q's pair and improving swap in the JSON
    full: bool = option(False, "Write the improving swap of every q with kappa_q < 0.", "--all-swaps")

"""The options of ``bridge analyze``: fidelity, shift, robustness, decompose (see :mod:`bridgecli.steps.options`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...analysis.shift import LEVELS as SHIFT_LEVELS
from ...analysis.shift import SUBSETS as SHIFT_SUBSETS
from ...data.examples import DataOptions
from ...optionspec import (
    DEVICE_HELP,
    MAX_LAYERS,
    MAX_ROUNDS,
    NUMBERS,
    RETENTION,
    SEED,
    count,
    group,
    option,
    stream_input,
)
from .pipeline import FROM_HELP

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

    data: str = option(help="Data (JSONL/JSON/Parquet/save_to_disk), as for `bridge score`.", argument=True)
    run: str | Path | None = option(None, FROM_HELP, "--from")
    n: int = option(200, "Examples to analyse.", "--n", range=count())
    seed: int = option(0, "Sampling seed (examples; random subsets).", range=SEED)
    first: bool = option(False, "Take the first N examples instead of a seeded sample.", "--first")
    batch_size: int = option(16, "Examples per scoring pass, and perturbed copies per exact pass.", range=count())
    dtype: str = option(
        "float32", "Model dtype: float32 or float64 (exact differences are small).", choices=("float32", "float64")
    )
    attention_layers: int = option(4, "Final blocks whose attention rows give A and c.", range=count(1, MAX_LAYERS))
    device: str = option("auto", DEVICE_HELP)
    data_opts: DataOptions = group(DataOptions, exclude=("limit",))
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
    src: Source = group()
    rho_p: float = option(0.75, "Prompt retention of the selected state.", "--rho-p", range=RETENTION)
    rho_r: float = option(0.75, "Response retention of the selected state.", "--rho-r", range=RETENTION)
    rounds: int = option(4, "Alternating rounds T of the selected state.", "--rounds", "-T", range=count(1, MAX_ROUNDS))
    method: str = option("bridge", "Selector giving the states S_p, S_r.")
    perturb: str = option("mask", PERTURB_HELP)
    neutral: str | None = option(None, NEUTRAL_HELP)
    proxies: list[str] = option(
        None,
        "Also compare a scorer plugin's scores (its B matrix if it writes one, else "
        "(a, c, A) through the BRIDGE formula); NAME or NAME:KEY=VALUE,... (scorer "
        "options); repeatable.",
        "--proxy",
        factory=list,
    )
    out: str | None = option("fidelity.json", ANALYZE_OUT_HELP, "--output", "-o")


@dataclass
class ShiftOptions:
    src: Source = group()
    scores: str = option("both", "exact (perturbation), surrogate, or both.", choices=SCORE_KINDS)
    subset: str = option(
        "top",
        "Opposite-side state at each retention: top (its full-state surrogate top-b) or random.",
        choices=SHIFT_SUBSETS,
    )
    #: opposite-side retentions; each a retention ratio, 0 excluded (nothing left to rank against)
    levels: tuple[float, ...] = option(SHIFT_LEVELS, "Opposite-side retention ratios, comma-separated.", parse=NUMBERS)
    out: str | None = option("shift.json", ANALYZE_OUT_HELP, "--output", "-o")
    png: str | None = option(None, "Line plot (default: the JSON path with .png).")
    perturb: str = option("mask", PERTURB_HELP)
    neutral: str | None = option(None, NEUTRAL_HELP)


@dataclass
class RobustnessOptions:
    inp: str | None = stream_input()
    rho_p: float = option(0.75, "Prompt retention: b_p of S^F and q = b_p for responses.", "--rho-p", range=RETENTION)
    rho_r: float = option(0.75, "Response retention: b_r of S^F and q = b_r for prompts.", "--rho-r", range=RETENTION)
    out: str | None = option("robustness.json", ANALYZE_OUT_HELP, "--output", "-o")
    #: every q's pair and improving swap in the JSON
    full: bool = option(False, "Write the improving swap of every q with kappa_q < 0.", "--all-swaps")


@dataclass
class DecomposeOptions:
    src: Source = group(Source, exclude=("cache", "attention_layers"))
    base_model: str | None = option(
        None,
        "theta_old, the model the warm-up started from, for the anchor term g_anchor = theta_bar - theta_old "
        "(default: the one warmup.json records; checked against it).",
        "--base-model",
    )
    min_count: int = option(
        20, "Per-id statistics over the token ids occurring at least this many times.", "--min-id-count", range=count()
    )
    out: str | None = option("decompose.json", ANALYZE_OUT_HELP, "--output", "-o")

"""Training hyper-parameters (torch-free, so the CLI can build them without importing torch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..optionspec import SEED, SEED_HELP, Spec, count, group, number, option

#: LoRA target modules when --lora-targets is not given: every linear layer but the output head.
ALL_LINEAR = "all-linear"

#: ``bridge train --help``'s panels
LORA_PANEL = "LoRA (peft)"
EFFICIENCY_PANEL = "Efficiency"
CHECKPOINT_PANEL = "Checkpoints and resume"


@dataclass
class LoraSettings:
    """LoRA through peft (``bridge train --lora``)."""

    r: int = option(16, "LoRA rank.", "--lora-r", range=count(1, 65536))
    alpha: int = option(32, "LoRA alpha (scale alpha / r).", "--lora-alpha", range=number(0, 1e6, low_open=True))
    dropout: float = option(0.05, "Dropout on the LoRA input.", "--lora-dropout", range=number(0, 1, high_open=True))
    targets: list[str] | str = option(
        ALL_LINEAR, "Comma-separated module names (q_proj,k_proj,v_proj,o_proj,...) or all-linear.", "--lora-targets"
    )


#: The peak learning rate when none is given: the paper's 2e-5 for full fine-tuning, 2e-4 for LoRA.
LR_FULL, LR_LORA = 2e-5, 2e-4


def default_lr(lora: bool) -> float:
    return LR_LORA if lora else LR_FULL


def lora_settings(targets: str | None = None, **kw) -> LoraSettings:
    """Build :class:`LoraSettings` from CLI strings (``q_proj,v_proj`` or ``all-linear``; None: all-linear).
    A value that names no module (``""``, ``,``) is a :class:`UsageError`, not all-linear."""
    if targets is None or targets.strip() == ALL_LINEAR:
        return LoraSettings(targets=ALL_LINEAR, **kw)
    names = [t.strip() for t in targets.split(",") if t.strip()]
    check_targets(names, given=targets)
    return LoraSettings(targets=names, **kw)


def lora_from_flags(
    lora: bool,
    targets: str | None = None,
    *,
    r: int | None = None,
    alpha: int | None = None,
    dropout: float | None = None,
) -> LoraSettings | None:
    """The LoRA settings of ``bridge train``'s flags (None: a flag not given, its default applies), or
    None without ``--lora``. A LoRA flag given without ``--lora`` would be ignored, whatever its value:
    it is a :class:`UsageError` instead. The values' ranges are checked with the other options
    (:func:`check_sft`)."""
    from ..errors import UsageError

    values = {"r": r, "alpha": alpha, "dropout": dropout}
    if not lora:
        given = [f"--lora-{name}" for name, value in (*values.items(), ("targets", targets)) if value is not None]
        if given:
            raise UsageError(
                f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with --lora",
                hint="add --lora to train LoRA adapters, or leave the LoRA flags out for full fine-tuning",
            )
        return None
    return lora_settings(targets, **{name: value for name, value in values.items() if value is not None})


@dataclass
class SFTConfig:
    """The SFT loop's settings; the help is `bridge train`'s (``bridge warmup`` words a few its own way).

    Two defaults follow from other settings, here, so that a Python caller gets what the command line
    gets: ``lr`` None (the default) is :func:`default_lr` (2e-4 with LoRA, else 2e-5), and
    ``keep_checkpoints`` 0 keeps every checkpoint, as None does."""

    epochs: float = option(3.0, "Epochs (paper: 3).", range=number(0, 1e6, low_open=True))
    #: None: :func:`default_lr` of ``lora`` (set when the config is made)
    lr: float = option(
        None,
        "Peak learning rate (default: paper's 2e-5; 2e-4 with --lora).",
        range=number(0, 10, low_open=True),
    )
    #: rows per micro-batch when ``max_tokens_per_batch`` is not set
    batch_size: int = option(8, "Rows per micro-batch (without --max-tokens-per-batch).", range=count())
    #: the optimizer step takes ``batch_size * grad_accum`` rows (paper: 64 = 8 x 8)
    grad_accum: int = option(8, "Rows per optimizer step = batch-size x grad-accum (paper: 64 = 8 x 8).", range=count())
    warmup_ratio: float = option(0.03, "Linear warmup fraction before the cosine decay.", range=number(0, 1))
    weight_decay: float = option(0.0, "AdamW weight decay.", range=number(0, 1e3))
    max_grad_norm: float = option(1.0, "Gradient clipping (total norm).", range=number(0, 1e12, low_open=True))
    max_steps: int | None = option(None, "Stop after this many optimizer steps.", range=count())
    #: resolved into ``max_steps`` before training (training/sft.py: resolve_max_flops)
    max_flops: float | None = option(
        None,
        "Stop at the optimizer step whose training FLOPs come nearest this, the schedule ending there (as "
        "--max-steps): full SFT at another run's compute, e.g. its bridge_train.json's train_flops. The formula "
        "is docs/training.md's; not with --lora.",
        range=number(0, 1e40, low_open=True),
    )
    seed: int = option(42, SEED_HELP, range=SEED)
    #: bf16 mixed precision (None: on with CUDA, off on CPU)
    bf16: bool | None = option(
        None,
        "bf16 mixed precision (default: on a GPU, off on the CPU). --no-bf16 trains in float32 (on a GPU with TF32 "
        "matmuls unless --no-tf32): slower, with more activation memory. Use it when a bf16 run stops on NaN or infinite "
        "gradients (train says so and names this flag), or to train as an earlier float32 run did.",
        "--bf16/--no-bf16",
        panel=EFFICIENCY_PANEL,
    )
    #: TF32 for the float32 matmuls on a GPU (all of them with --no-bf16)
    tf32: bool = option(
        True,
        "float32 on a GPU: TensorFloat-32 matmuls (float32 range, a 10-bit mantissa, several times faster); "
        "--no-tf32 for IEEE float32.",
        "--tf32/--no-tf32",
        panel=EFFICIENCY_PANEL,
    )
    #: padding-free packing (True), length bucketing (False), or packing where verified (None)
    packing: bool | None = option(
        None,
        "Padding-free packing (position ids restart per row, no cross-row "
        "attention) or length bucketing. Default: pack when a packed forward "
        "matches separate forwards for this model.",
        "--packing/--no-packing",
        panel=EFFICIENCY_PANEL,
    )
    #: cap micro-batches by tokens (packed: sum of lengths; bucketed: rows x longest) instead of rows
    max_tokens_per_batch: int | None = option(
        None,
        "Cut micro-batches by computed tokens (lines x longest line) instead of --batch-size rows. The step "
        "keeps batch-size x grad-accum rows, so the loss does not change.",
        range=count(),
        panel=EFFICIENCY_PANEL,
    )
    #: longest packed line (None: the longest row, rounded up to 64; one line with flash attention)
    pack_length: int | None = option(
        None,
        "Longest packed line (default: the longest row, rounded up to 64; one "
        "line per micro-batch with flash attention).",
        range=count(),
        panel=EFFICIENCY_PANEL,
    )
    #: None: on the CPU, off on a GPU (:func:`on_device`)
    gradient_checkpointing: bool | None = option(
        None,
        "Recompute each block's activations in the backward instead of keeping them (on the CPU also fix glibc's "
        "mmap threshold, which keeps freed memory from fragmenting): less memory, more time. Default: on the CPU "
        "(SmolLM2-135M at batch 8: 2.8 GB at most instead of 5.3 GB, a step 1.5-1.9x as long), off on a GPU.",
        "--gradient-checkpointing/--no-gradient-checkpointing",
        panel=EFFICIENCY_PANEL,
    )
    #: None: full fine-tuning
    lora: LoraSettings | None = group(
        switch=Spec(
            "Train LoRA adapters instead of all parameters; saves OUT/adapter and the merged model in OUT.",
            ("--lora",),
        ),
        build=lora_from_flags,
        default=None,
        panel=LORA_PANEL,
    )
    #: checkpoint every N optimizer steps into OUT/checkpoints/step-NNNNNN (0/None: never)
    save_every: int | None = option(
        None,
        "Checkpoint every N optimizer steps into OUT/checkpoints/step-NNNNNN.",
        range=count(),
        panel=CHECKPOINT_PANEL,
    )
    #: complete checkpoints kept (oldest removed first, once a new one is complete; None, or 0, keeps all)
    keep_checkpoints: int | None = option(
        1,
        "Complete checkpoints kept (0: all); the disk holds these and the one being written.",
        range=count(),
        optional=True,
        panel=CHECKPOINT_PANEL,
    )

    def __post_init__(self) -> None:
        if self.lr is None:
            self.lr = default_lr(self.lora is not None)
        if self.keep_checkpoints == 0:
            self.keep_checkpoints = None

    @property
    def rows_per_step(self) -> int:
        return self.batch_size * self.grad_accum


#: Settings that may change between a checkpoint and ``--resume``: they change how a step is cut
#: into micro-batches or how often it is saved, not what the step computes.
RESUMABLE_CHANGES = (
    "tf32",
    "packing",
    "max_tokens_per_batch",
    "pack_length",
    "gradient_checkpointing",
    "save_every",
    "keep_checkpoints",
)


def config_dict(cfg: SFTConfig) -> dict:
    return asdict(cfg)


def on_device(cfg: SFTConfig, device: str) -> SFTConfig:
    """``cfg`` with the settings whose default depends on the device settled for ``device`` (in place,
    so that what a run records is what it ran): bf16 on CUDA only (a GPU by default), gradient
    checkpointing on the CPU by default."""
    cuda = str(device).startswith("cuda")
    cfg.bf16 = cuda if cfg.bf16 is None else bool(cfg.bf16) and cuda
    if cfg.gradient_checkpointing is None:
        cfg.gradient_checkpointing = not cuda
    return cfg


def check_targets(targets: object, given: object = None) -> None:
    """``targets`` is ``all-linear`` or a non-empty list of module names (each a non-empty string);
    ``given``: what the user typed, for the message."""
    from ..errors import UsageError

    if targets == ALL_LINEAR:
        return
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t.strip() for t in targets):
        raise UsageError(
            f"--lora-targets must name at least one module, got {targets if given is None else given!r}",
            hint=f"comma-separated module names such as q_proj,v_proj, or {ALL_LINEAR}, the default",
        )


def check_sft(cfg: SFTConfig, *, where: str = "") -> None:
    """An :class:`SFTConfig` (train, warmup) and its LoRA settings in their declared ranges
    (:func:`bridgecli.optionspec.check`; a :class:`UsageError` naming the flag)."""
    from ..optionspec import check

    check(cfg, prefix=where)
    if cfg.lora is not None:
        check(cfg.lora)
        check_targets(cfg.lora.targets)


__all__ = [
    "ALL_LINEAR",
    "CHECKPOINT_PANEL",
    "EFFICIENCY_PANEL",
    "LORA_PANEL",
    "LR_FULL",
    "LR_LORA",
    "LoraSettings",
    "RESUMABLE_CHANGES",
    "SFTConfig",
    "check_sft",
    "check_targets",
    "config_dict",
    "default_lr",
    "lora_from_flags",
    "on_device",
    "lora_settings",
]

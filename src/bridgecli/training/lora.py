"""LoRA through peft: wrap before training, save the adapter and a merged model after.

The run folder then holds the merged model at its top (an ordinary HF folder, which
``bridge eval OUT`` loads like a full fine-tune) and the adapter alone in ``OUT/adapter`` (for
peft users: ``PeftModel.from_pretrained(base, "OUT/adapter")``); the folder's layout is
:mod:`bridgecli.artifacts.train_run`'s.
"""

from __future__ import annotations

from .config import LoraSettings


def wrap(model, settings: LoraSettings):
    """``model`` with LoRA adapters on ``settings.targets``; only the adapters train."""
    from peft import LoraConfig, get_peft_model

    from ..errors import UsageError

    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=settings.targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise UsageError(
            f"--lora-targets: {exc}", hint="name linear layers of this model, e.g. q_proj,v_proj, or all-linear"
        ) from None


def trainable_counts(model) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())
    train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return train, total

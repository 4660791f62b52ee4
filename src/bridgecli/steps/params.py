"""Parameter checks for the steps, in one place: every numeric option has its range, NaN and
infinity are refused, and a device must exist here. The steps call these before reading anything,
so Python callers get the same one-line :class:`UsageError` (exit 2) as the command line."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

from ..errors import UsageError

# Upper bounds that only catch nonsense (a typo, an overflow); no real run comes near them.
MAX_COUNT = 2**40  # rows, tokens, steps, ...
MAX_ROUNDS = 10_000  # select -T
MAX_LAYERS = 100_000
MAX_SEED = 2**32 - 1  # numpy's and torch's generators take it


def _fail(flag: str, value: Any, want: str) -> None:
    raise UsageError(f"{flag} must be {want}, got {value!r}")


def integer(flag: str, value: Any, *, low: int = 1, high: int = MAX_COUNT, optional: bool = False) -> None:
    """``value`` an integer in [low, high] (None allowed when ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, Integral) or not low <= value <= high:
        _fail(flag, value, f"an integer in [{low}, {high}]" if high != MAX_COUNT else f"an integer >= {low}")


def real(flag: str, value: Any, *, low: float | None = None, high: float | None = None, low_open: bool = False,
         high_open: bool = False, optional: bool = False) -> None:
    """``value`` a finite number in the interval given (open or closed at each end)."""
    if value is None and optional:
        return
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        if low is not None and high is not None:
            want = f"a finite number in {left}{low:g}, {high:g}{right}"
        elif low is not None:
            want = f"a finite number {'>' if low_open else '>='} {low:g}"
        elif high is not None:
            want = f"a finite number {'<' if high_open else '<='} {high:g}"
        else:
            want = "a finite number"
        _fail(flag, value, want)


def check_sft(cfg: Any, *, where: str = "") -> None:
    """An :class:`~bridgecli.training.config.SFTConfig` (train, warmup)."""
    real(f"{where}--epochs", cfg.epochs, low=0, high=1e6, low_open=True)
    real(f"{where}--lr", cfg.lr, low=0, high=10, low_open=True)
    integer(f"{where}--batch-size", cfg.batch_size)
    integer(f"{where}--grad-accum", cfg.grad_accum)
    real(f"{where}--weight-decay", cfg.weight_decay, low=0, high=1e3)
    real(f"{where}--warmup-ratio", cfg.warmup_ratio, low=0, high=1)
    real(f"{where}--max-grad-norm", cfg.max_grad_norm, low=0, high=1e12, low_open=True)
    integer(f"{where}--seed", cfg.seed, low=0, high=MAX_SEED)
    integer(f"{where}--max-steps", cfg.max_steps, optional=True)
    integer(f"{where}--max-tokens-per-batch", cfg.max_tokens_per_batch, optional=True)
    integer(f"{where}--pack-length", cfg.pack_length, optional=True)
    integer(f"{where}--save-every", cfg.save_every, optional=True)
    integer(f"{where}--keep-checkpoints", cfg.keep_checkpoints, optional=True)
    lora = getattr(cfg, "lora", None)
    if lora is not None:
        integer("--lora-r", lora.r, high=65536)
        real("--lora-alpha", lora.alpha, low=0, high=1e6, low_open=True)
        real("--lora-dropout", lora.dropout, low=0, high=1, high_open=True)


def check_data_options(opts: Any) -> None:
    """A :class:`~bridgecli.data.examples.DataOptions`: --max-length and --limit."""
    integer("--max-length", opts.max_length, optional=True)
    integer("--limit", opts.limit, optional=True)


def check_device(device: Any) -> None:
    """``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, and present here."""
    if not isinstance(device, str) or not device.strip():
        _fail("--device", device, "auto, cpu, cuda, cuda:N or mps")
    if device == "auto":
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {device}: not a device (use auto, cpu, cuda, cuda:N or mps)") from None
    if dev.type == "cpu":
        return
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {device}: no CUDA GPU is visible here", hint="use --device cpu or auto")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"--device {device}: only {torch.cuda.device_count()} CUDA GPU(s) are visible "
                             f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
        return
    if dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise UsageError(f"--device {device}: MPS is not available here", hint="use --device cpu or auto")
        return
    raise UsageError(f"--device {device}: not supported (use auto, cpu, cuda, cuda:N or mps)")

"""Parameter checks for the steps, in one place. The ranges are declared on the options types
(:mod:`bridgecli.steps.options`, :mod:`bridgecli.training.config`, with
:func:`bridgecli.optionspec.option`); :func:`check` runs them. NaN and infinity are refused, and a
device must exist here. The steps call these before reading anything, so Python callers get the same
one-line :class:`UsageError` (exit 2) as the command line. (An SFT configuration is checked by
:func:`bridgecli.training.config.check_sft`, which knows its LoRA targets.)"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import UsageError
from ..optionspec import MAX_COUNT, MAX_LAYERS, MAX_ROUNDS, MAX_SEED, RETENTION, _fail, check, integer, real

__all__ = [
    "MAX_COUNT",
    "MAX_LAYERS",
    "MAX_ROUNDS",
    "MAX_SEED",
    "RETENTION",
    "check",
    "check_all",
    "check_data_options",
    "check_device",
    "integer",
    "real",
]


def check_all(opts: Any) -> None:
    """Every option field of the options object ``opts`` and of the groups it holds in its range, and its
    ``--device`` (when it has one) present here: a step's checks in one call."""
    check(opts)
    for f in dataclasses.fields(opts):
        value = getattr(opts, f.name)
        if "group" in f.metadata and value is not None:
            check_all(value)
    if any(f.name == "device" for f in dataclasses.fields(opts)):
        check_device(opts.device)


def check_data_options(opts: Any) -> None:
    """A :class:`~bridgecli.data.examples.DataOptions`: --max-length and --limit."""
    check(opts)


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
            raise UsageError(
                f"--device {device}: only {torch.cuda.device_count()} CUDA GPU(s) are visible "
                f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})"
            )
        return
    if dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise UsageError(f"--device {device}: MPS is not available here", hint="use --device cpu or auto")
        return
    raise UsageError(f"--device {device}: not supported (use auto, cpu, cuda, cuda:N or mps)")

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..data.examples import DataOptions as D
from ..steps.options import ScoreOptions as S
from .options import StreamOut, arg, data_options, opt


def score(
    data: str = arg(S, "data"),
    output: StreamOut = "-",
    from_: Optional[Path] = opt(S, "run"),
    scorer: str = opt(S, "scorer"),
    scorer_option: Optional[list[str]] = opt(S, "scorer_options", "--scorer-option", default=None),
    batch_size: int = opt(S, "batch_size"),
    max_tokens: Optional[int] = opt(S, "max_tokens"),
    window: int = opt(S, "window"),
    resume: bool = opt(S, "resume"),
    attention_layers: int = opt(S, "attention_layers"),
    device: str = opt(S, "device"),
    dtype: str = opt(S, "dtype"),
    tf32: bool = opt(S, "tf32"),
    prompt_field: Optional[str] = opt(D, "prompt_field"),
    response_field: Optional[str] = opt(D, "response_field"),
    chat_template: bool = opt(D, "chat_template"),
    max_length: Optional[int] = opt(D, "max_length"),
    split: Optional[str] = opt(D, "split"),
    limit: Optional[int] = opt(D, "limit"),
    allow_empty: bool = opt(S, "allow_empty"),
):
    """Score every example: a_j (one JVP along v), attention rows A and history mass c.

    Several GPUs: torchrun --nproc-per-node N -m bridgecli score DATA -o OUT (ranks shard the
    examples; rank 0 merges the shards into OUT)."""
    from ..steps.common import key_values
    from ..steps.score import run_score

    run_score(
        S(
            data=data,
            out=output,
            run=from_,
            scorer=scorer,
            scorer_options=key_values(scorer_option, "--scorer-option"),
            batch_size=batch_size,
            max_tokens=max_tokens,
            window=window,
            resume=resume,
            attention_layers=attention_layers,
            allow_empty=allow_empty,
            device=device,
            dtype=dtype,
            tf32=tf32,
            data_opts=data_options(prompt_field, response_field, chat_template, max_length, split, limit),
        )
    )

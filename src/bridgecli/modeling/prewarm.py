"""Compile the scorer's GPU kernels in a process of its own while ``bridge score`` loads the model.

On a machine whose Triton cache is empty, the first batch of ``bridge score`` waits 7-10 s for
Triton to compile the scorer's kernels (the RMSNorm/RoPE/SwiGLU tangents, the attention tangent
and its autotuning, the loss) -- after the model has loaded, which takes about as long. Both are
one-time work, and they need not wait for each other: :func:`start` launches
``python -m bridgecli.modeling.prewarm`` on the same GPU before the model loads. That process builds
a few blocks of a random model of the checkpoint's configuration (the same widths, heads, vocabulary
and dtype, so the same kernels and specialisations) and scores two small random batches with the
``bridge`` scorer, one padded to a multiple of 16 tokens and one not. Triton writes what it compiles,
and the attention kernel's autotuning, to its on-disk cache, shared between processes; the scoring
process then loads instead of compiling. :meth:`Prewarm.wait` joins it before the first batch.

Nothing depends on it: if it fails, is slow or is turned off (``BRIDGE_PREWARM=0``), the scoring
process compiles what it needs itself, as before. It is skipped off a GPU, without Triton, and where
its random blocks would take more than a tenth of the GPU's memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

#: the most of the GPU's memory the prewarm process's random blocks may take
MEMORY_SHARE = 0.1
#: padded lengths of its two batches: a multiple of 16 and one that is not (Triton specialises on it)
LENGTHS = (256, 203)


class Prewarm:
    """A running prewarm process."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.started = time.perf_counter()

    def wait(self, timeout: float = 120.0) -> bool:
        """Wait for it (at most ``timeout`` seconds); True when it finished cleanly. A process still
        running then is stopped: the scoring process compiles the rest itself."""
        try:
            return self.proc.wait(timeout=timeout) == 0
        except subprocess.TimeoutExpired:
            self.stop()
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _config_bytes(cfg: Any, blocks: int, dtype_bytes: int) -> int:
    """Bytes of the random model :func:`main` builds: embeddings (and an untied head) plus ``blocks``."""
    hidden = int(cfg.hidden_size)
    inter = int(getattr(cfg, "intermediate_size", None) or 4 * hidden)
    heads = int(cfg.num_attention_heads)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
    embed = int(cfg.vocab_size) * hidden * (1 if getattr(cfg, "tie_word_embeddings", False) else 2)
    block = hidden * head_dim * (2 * heads + 2 * kv) + 3 * hidden * inter
    return (embed + blocks * block) * dtype_bytes


def start(checkpoint: str, dtype: str, device: str, tail_layers: int) -> Prewarm | None:
    """Launch the prewarm process for ``checkpoint`` (a folder with config.json), or None where it
    does not apply (see the module's doc)."""
    if os.environ.get("BRIDGE_PREWARM", "1") == "0" or not device.startswith("cuda"):
        return None
    try:
        import torch
        import triton  # noqa: F401
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(checkpoint)
        dev = torch.device(device)
        total = torch.cuda.get_device_properties(dev).total_memory
        need = _config_bytes(cfg, tail_layers + 1, torch.empty(0, dtype=getattr(torch, dtype)).element_size())
    except Exception:  # no Triton, no config we can read: nothing to prewarm
        return None
    if need > MEMORY_SHARE * total:
        return None
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    env = dict(os.environ, BRIDGE_PREWARM="0", BRIDGE_NO_PROGRESS="1")
    cmd = [sys.executable, "-m", "bridgecli.modeling.prewarm", checkpoint, dtype, f"cuda:{index}", str(tail_layers)]
    try:
        proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    except OSError:
        return None
    return Prewarm(proc)


def examples(lengths: tuple[int, ...], vocab: int) -> list:
    """Random examples of these token lengths: a short template, a prompt, a response (2:3), EOS."""
    import numpy as np

    from ..format.records import Example, Tokens

    rng = np.random.default_rng(0)
    out = []
    for i, n in enumerate(lengths):
        body = n - 6 - 3 - 1
        p = body * 2 // 5
        kinds = [0] * 6 + [1] * p + [0] * 3 + [2] * (body - p) + [3]
        ids = rng.integers(10, max(11, vocab), size=len(kinds)).tolist()
        out.append(
            Example(
                id=str(i),
                index=i,
                text="",
                tokens=Tokens(input_ids=ids, kinds=bytes(kinds), offsets=[0, 0] * len(kinds)),
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m bridgecli.modeling.prewarm CHECKPOINT DTYPE DEVICE TAIL_LAYERS``."""
    from types import SimpleNamespace
    from typing import cast

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from .params import tail_parameters
    from .scoring import BridgeScorer, ScoringContext

    checkpoint, dtype, device, tail = argv if argv is not None else sys.argv[1:]
    tail_layers = int(tail)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    cfg = AutoConfig.from_pretrained(checkpoint)
    cfg.num_hidden_layers = tail_layers + 1
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype)).eval()
    g = torch.Generator(device="cpu").manual_seed(0)
    v = {
        n: (torch.randn(p.shape, generator=g) * 1e-3).to(p.device, p.dtype)
        for n, p in tail_parameters(model, tail_layers).items()
    }
    ctx = ScoringContext(
        model=model, tokenizer=cast(Any, SimpleNamespace(pad_token_id=0)), direction=v, attention_layers=tail_layers, device=device
    )
    scorer = BridgeScorer(ctx)
    vocab = int(cfg.vocab_size)
    scorer.score(examples((LENGTHS[0], LENGTHS[0] - 40), vocab))
    scorer.score(examples((LENGTHS[1],), vocab))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())

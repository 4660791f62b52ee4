"""Split a decoder into a prefix (run once, no tangents, fused kernels) and a tail of the final K
blocks (run under forward-mode AD).

The prefix pass runs the model normally but replaces each tail block's ``forward`` with a recorder
that stores the block's call (hidden states and keyword arguments: masks, rotary embeddings, ...)
and stops the pass at the last tail block, so neither the tail, the final norm nor the LM head run
in it. The tail is then replayed block by block with ``torch.func.functional_call``, any number of
times, with whatever parameters (primal, dual, requiring grad) the caller passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ModelError
from .mask_skip import known_padding
from .params import blocks_of, decoder_of


class _Stop(Exception):
    pass


@dataclass
class TailCall:
    args: tuple
    kwargs: dict


def final_norm(decoder: nn.Module) -> nn.Module:
    for name in ("norm", "final_layernorm", "ln_f", "final_norm"):
        mod = getattr(decoder, name, None)
        if isinstance(mod, nn.Module):
            return mod
    raise ModelError(f"cannot find the final norm of {type(decoder).__name__}")


class Tail:
    """The final blocks ``indices`` of ``model`` (contiguous, ending at the last block)."""

    def __init__(self, model: nn.Module, indices: list[int]):
        self.model = model
        self.decoder = decoder_of(model)
        self.blocks = blocks_of(model)
        n = len(self.blocks)
        if list(indices) != list(range(n - len(indices), n)):
            raise ModelError(f"the tail must be the final blocks of the model, got {indices}")
        self.indices = list(indices)
        self.norm = final_norm(self.decoder)

    def prefix(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, grad: bool = False, padded: bool | None = None
    ) -> tuple[torch.Tensor, list[TailCall]]:
        """Hidden states entering the first tail block, and every tail block's call arguments
        (recorded with autograd when ``grad``, for passes that differentiate through the prefix).
        ``padded``: whether any row of ``attention_mask`` holds padding, when the caller knows it;
        then transformers' mask check does not read the device (:mod:`.mask_skip`)."""
        calls: dict[int, TailCall] = {}
        last = self.indices[-1]

        def recorder(i):
            def record(*args, **kwargs):
                calls[i] = TailCall(args, kwargs)
                if i == last:
                    raise _Stop
                hidden = args[0] if args else kwargs["hidden_states"]
                return hidden

            return record

        saved = {}
        for i in self.indices:
            blk = self.blocks[i]
            saved[i] = blk.__dict__.get("forward")
            blk.forward = recorder(i)
        try:
            with torch.set_grad_enabled(grad), known_padding(padded):
                self.decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        except _Stop:
            pass
        finally:
            for i in self.indices:
                own = saved[i]
                if own is None:
                    del self.blocks[i].forward
                else:
                    self.blocks[i].forward = own
        if len(calls) != len(self.indices):
            raise ModelError("the decoder did not call every tail block (unsupported architecture)")
        first = calls[self.indices[0]]
        hidden = first.args[0] if first.args else first.kwargs["hidden_states"]
        return hidden, [calls[i] for i in self.indices]

    def run(
        self, params: dict[int, dict[str, torch.Tensor]], hidden: torch.Tensor, calls: list[TailCall]
    ) -> torch.Tensor:
        """Replay the tail blocks with ``params[i]`` (names relative to block i); return the
        final-normed hidden states."""
        h = hidden
        for i, call in zip(self.indices, calls):
            args = (h, *call.args[1:]) if call.args else ()
            kwargs = dict(call.kwargs)
            if not call.args:
                kwargs["hidden_states"] = h
            out = torch.func.functional_call(self.blocks[i], params.get(i, {}), args, kwargs, strict=False)
            h = out[0] if isinstance(out, tuple) else out
        return self.norm(h)

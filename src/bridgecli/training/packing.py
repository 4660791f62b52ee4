"""Is padding-free packing exact for this model? Checked, not assumed.

Packing relies on the model turning restarting ``position_ids`` (and no attention mask) into a
block-diagonal causal mask. transformers does this for the architectures built on
``masking_utils`` (Llama, Qwen, Mistral, SmolLM, Gemma, ... with eager, sdpa and flash attention),
but not every model does: a model that ignores the boundaries would silently let rows attend to
each other. So before training we run three short rows once packed and once one by one, and pack
only when the logits agree.
"""

from __future__ import annotations

import torch

from .rows import Row


def _probe_rows(vocab: int) -> list[Row]:
    hi = max(3, min(vocab, 1000))
    g = torch.Generator().manual_seed(0)
    rows = []
    for n in (7, 4, 9):
        ids = torch.randint(1, hi, (n,), generator=g).tolist()
        rows.append(Row(str(n), ids, ids))
    return rows


def one_line(model) -> bool:
    """Flash-attention kernels take packed rows as varlen boundaries only in a batch of one line."""
    return "flash" in (getattr(getattr(model, "config", None), "_attn_implementation", None) or "")


@torch.no_grad()
def check_packing(model) -> tuple[bool, str]:
    """``(ok, reason)``: whether a packed forward, in the layout training will use (several lines
    with a padding tail, or one line for flash attention), gives the logits of separate forwards."""
    from .batching import collate_packed

    vocab = model.get_input_embeddings().weight.shape[0]
    device = model.get_input_embeddings().weight.device
    rows = _probe_rows(vocab)
    was_training = model.training
    model.eval()
    try:
        seqs = [rows] if one_line(model) else [[rows[2]], [rows[0], rows[1]]]  # the second line: a padding tail
        packed = collate_packed(seqs).to(device)
        out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits.float()
        worst, scale = 0.0, 0.0
        for b, seq in enumerate(seqs):
            start = 0
            for r in seq:
                ids = torch.tensor([r.input_ids], device=device)
                alone = model(input_ids=ids, use_cache=False).logits[0].float()
                got = out[b, start : start + len(r.input_ids)]
                worst = max(worst, float((got - alone).abs().max()))
                scale = max(scale, float(alone.abs().max()))
                start += len(r.input_ids)
    except Exception as exc:  # a model that does not take position_ids, or fails on them
        result = (False, f"packed forward failed: {type(exc).__name__}: {exc}")
    else:
        half = model.get_input_embeddings().weight.dtype in (torch.float16, torch.bfloat16)
        tol = (3e-2 if half else 1e-3) * (1.0 + scale)  # leaking across rows moves logits by O(scale)
        result = (worst <= tol, f"max |packed - separate| logit difference {worst:.3g} (tolerance {tol:.3g})")
    finally:
        model.train(was_training)
    return result

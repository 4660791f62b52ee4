"""One forward (and optionally one backward) pass of a model over a batch of tokenised examples: the
per-token quantities the compared methods rank by (see ``Reference`` in bridgecli.format.records).

Conventions (the same as ``bridge score``): the loss of token t is the cross-entropy of predicting it
from the hidden state at t - 1 (a token at position 0 has no prediction: its loss is 0, as the
authors' code pads with a leading 0). Attention quantities come from the *last* block, averaged over
heads, captured for that block only (never every layer's L x L map).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F

from ..format.records import Example
from ..modeling.attention import Routing, routing, use_bridge_attention
from ..modeling.score_batch import make_batch
from ..modeling.params import decoder_of, num_blocks
from ..modeling.sdpa_backends import training_backends


def _targets(ex: Example) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = ex.tokens
    return t.prompt_positions(), t.response_positions(), t.eos_positions()


def reference_batch(
    model,
    examples: list[Example],
    *,
    pad_id: int,
    device: str = "cpu",
    attention: bool = True,
    grad_norms: bool = False,
) -> list[dict[str, np.ndarray]]:
    """Per example: ``prompt_loss`` [m], ``response_loss`` [n]; with ``attention``
    ``response_attention`` [n], ``prompt_received`` [m], ``response_received`` [n]; with
    ``grad_norms`` ``prompt_grad`` [m], ``response_grad`` [n]."""
    batch = make_batch(examples, pad_id, device)
    ids, mask = batch.input_ids, batch.attention_mask
    lengths = [len(ex.tokens.input_ids) for ex in examples]
    decoder = decoder_of(model)
    last = num_blocks(model) - 1
    if attention:
        use_bridge_attention(model)
    capture = Routing(math_layers=frozenset({last}), capture_layers=frozenset({last}), query_start=0)

    # every position whose loss is wanted: eligible prompt, eligible response, EOS (for the SFT loss)
    parts = [_targets(ex) for ex in examples]
    b_idx, pos = [], []
    for b, (p, r, e) in enumerate(parts):
        allp = np.concatenate([p, r, e]).astype(np.int64)
        b_idx.append(np.full(len(allp), b))
        pos.append(allp)
    b_idx_t = torch.as_tensor(np.concatenate(b_idx), dtype=torch.long, device=ids.device)
    pos_t = torch.as_tensor(np.concatenate(pos), dtype=torch.long, device=ids.device)
    has_pred = pos_t > 0
    query = torch.clamp(pos_t - 1, min=0)

    # with grad_norms a backward runs through every layer's attention: cuDNN's kernel is left out of it, as in
    # training (its backward gave NaN gradients for some masked bf16 shapes: modeling/sdpa_backends.py)
    kernels = training_backends() if grad_norms else contextlib.nullcontext()
    with torch.set_grad_enabled(grad_norms), kernels:
        emb = model.get_input_embeddings()(ids)
        if grad_norms:
            emb = emb.detach().requires_grad_(True)
        with routing(capture) if attention else contextlib.nullcontext():
            out = decoder(inputs_embeds=emb, attention_mask=mask, use_cache=False)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        logits = model.get_output_embeddings()(hidden[b_idx_t, query]).float()
        ce = F.cross_entropy(logits, ids[b_idx_t, pos_t], reduction="none") * has_pred
        grads = None
        if grad_norms:
            total = ce.new_zeros(())
            start = 0
            for p, r, e in parts:
                k0, k1 = start + len(p), start + len(p) + len(r) + len(e)
                if k1 > k0:
                    total = total + ce[k0:k1].mean()  # the example's SFT loss: response tokens and EOS
                start = k1
            if total.requires_grad:
                (g,) = torch.autograd.grad(total, emb)
                grads = g.float().norm(dim=-1).cpu().numpy()
            else:
                grads = np.zeros(tuple(ids.shape))
    ce_np = ce.detach().float().cpu().numpy()
    rows = capture.rows.detach().float().cpu().numpy() if attention and capture.rows is not None else None

    out_list = []
    start = 0
    for b, (p, r, e) in enumerate(parts):
        m, n = len(p), len(r)
        item = {"prompt_loss": ce_np[start : start + m], "response_loss": ce_np[start + m : start + m + n]}
        start += m + n + len(e)
        if rows is not None:
            L = lengths[b]
            attn = rows[b, :L, :L]
            first = int(r[0]) if n else L
            item["response_attention"] = attn[r, :first].sum(axis=1) if n else np.zeros(0)
            received = attn.sum(axis=0)
            item["prompt_received"] = received[p]
            item["response_received"] = received[r]
        if grads is not None:
            item["prompt_grad"] = grads[b, p]
            item["response_grad"] = grads[b, r]
        out_list.append({k: np.asarray(v, dtype=np.float32) for k, v in item.items()})
    return out_list

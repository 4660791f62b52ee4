"""Turn tokenised examples into padded tensors plus the index maps the scorers need, built once
per batch on the host and moved to the device in a few transfers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..format.records import Example


@dataclass
class ScoreBatch:
    """Right-padded ids of a batch and its index maps.

    Response token r_j (at position ``resp[b][j]``) is predicted by the hidden state at
    ``resp[b][j] - 1``: that query row is the one used for a_j, A[j, :] and c_j. The flat maps
    list every eligible response token of the batch in example order:

    - ``b_idx`` [N], ``q_pos`` [N], ``targets`` [N]: example, query position and target token;
    - ``j_local`` [N]: the token's index among its example's response tokens;
    - ``prompt_cols`` [B, m_max], ``resp_cols`` [B, n_max]: eligible positions, zero-padded.
    """

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    prompt: list[np.ndarray]
    resp: list[np.ndarray]
    b_idx: torch.Tensor
    q_pos: torch.Tensor
    targets: torch.Tensor
    j_local: torch.Tensor
    prompt_cols: torch.Tensor
    resp_cols: torch.Tensor
    #: whether any row is padded, known on the host (see mask_skip.py); None: not known
    padded: bool | None = None

    @property
    def query_start(self) -> int:
        """The earliest query row any example needs."""
        starts = [int(r[0]) - 1 for r in self.resp if len(r)]
        return max(0, min(starts)) if starts else 0

    def flat_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.b_idx, self.q_pos, self.targets


def padded_length(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple


def _padded(arrays: list[np.ndarray]) -> np.ndarray:
    width = max([len(a) for a in arrays] + [1])
    out = np.zeros((len(arrays), width), dtype=np.int64)
    for i, a in enumerate(arrays):
        out[i, : len(a)] = a
    return out


def make_batch(
    examples: list[Example], pad_id: int, device: str | torch.device = "cpu", multiple: int = 1
) -> ScoreBatch:
    """The examples right-padded to the longest, rounded up to a multiple of ``multiple``."""
    if not examples:
        raise ValueError("an empty batch")
    length = padded_length(max(len(ex.tokens.input_ids) for ex in examples), multiple)
    ids = np.full((len(examples), length), pad_id, dtype=np.int64)
    mask = np.zeros((len(examples), length), dtype=np.int64)
    prompt, resp = [], []
    for b, ex in enumerate(examples):
        n = len(ex.tokens.input_ids)
        ids[b, :n] = ex.tokens.input_ids
        mask[b, :n] = 1
        p, r = ex.tokens.eligible()
        prompt.append(p)
        resp.append(r)
    counts = [len(r) for r in resp]
    b_idx = np.repeat(np.arange(len(examples)), counts)
    q_pos = np.concatenate(resp).astype(np.int64) - 1 if sum(counts) else np.zeros(0, dtype=np.int64)
    targets = ids[b_idx, q_pos + 1]
    j_local = np.concatenate([np.arange(c) for c in counts]) if sum(counts) else np.zeros(0, dtype=np.int64)

    # from pinned memory, a copy to the GPU is queued without waiting for the kernels before it
    pin = torch.device(device).type == "cuda"

    def dev(a):
        t = torch.as_tensor(a, dtype=torch.long)
        return (t.pin_memory() if pin else t).to(device, non_blocking=True)

    return ScoreBatch(
        dev(ids),
        dev(mask),
        prompt,
        resp,
        dev(b_idx),
        dev(q_pos),
        dev(targets),
        dev(j_local),
        dev(_padded(prompt)),
        dev(_padded(resp)),
        padded=any(len(ex.tokens.input_ids) < length for ex in examples),
    )

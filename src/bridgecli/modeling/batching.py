"""Turn tokenised examples into padded tensors plus the index maps the scorers need."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..format.records import Example


@dataclass
class ScoreBatch:
    """Right-padded ids of a batch and, per example, its eligible prompt/response positions.

    Response token r_j (at position ``resp[b][j]``) is predicted by the hidden state at
    ``resp[b][j] - 1``: that query row is the one used for a_j, A[j, :] and c_j."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    prompt: list[np.ndarray]
    resp: list[np.ndarray]

    @property
    def query_start(self) -> int:
        """The earliest query row any example needs."""
        starts = [int(r[0]) - 1 for r in self.resp if len(r)]
        return max(0, min(starts)) if starts else 0

    def flat_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(batch index, query position, target token) for every eligible response token, flattened."""
        b_idx, q_pos, tgt = [], [], []
        ids = self.input_ids
        for b, r in enumerate(self.resp):
            b_idx.append(np.full(len(r), b))
            q_pos.append(r - 1)
            tgt.append(ids[b, torch.as_tensor(r, dtype=torch.long)].cpu().numpy() if len(r) else np.zeros(0, dtype=np.int64))
        dev = ids.device
        return (torch.as_tensor(np.concatenate(b_idx), dtype=torch.long, device=dev),
                torch.as_tensor(np.concatenate(q_pos), dtype=torch.long, device=dev),
                torch.as_tensor(np.concatenate(tgt), dtype=torch.long, device=dev))


def make_batch(examples: list[Example], pad_id: int, device: str | torch.device = "cpu") -> ScoreBatch:
    length = max(len(ex.tokens.input_ids) for ex in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    prompt, resp = [], []
    for b, ex in enumerate(examples):
        n = len(ex.tokens.input_ids)
        ids[b, :n] = torch.as_tensor(ex.tokens.input_ids, dtype=torch.long)
        mask[b, :n] = 1
        prompt.append(ex.tokens.prompt_positions())
        resp.append(ex.tokens.response_positions())
    return ScoreBatch(ids.to(device), mask.to(device), prompt, resp)

"""Export contract: `bridge compact` rows train in TRL's SFTTrainer with the same masked positions,
the same loss (token mean over the step's supervised tokens, Z_r) and the same gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bridgecli.training.rows import IGNORE, Row
from bridgecli.training.sft import accumulate

from tiny import tiny_llama_config, tiny_model

trl = pytest.importorskip("trl")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def compact_rows(n=4, seed=0, vocab=500):
    """Rows shaped like `bridge compact` output: masked template/prompt, a scattered supervision set, EOS."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        length = int(rng.integers(12, 30))
        ids = rng.integers(5, vocab, size=length).tolist()
        start = int(rng.integers(3, length - 4))
        labels = [IGNORE] * start + [t if rng.random() < 0.6 else IGNORE for t in ids[start:]]
        labels[-1] = ids[-1]
        rows.append(Row(f"r{i}", ids, labels))
    return rows


@pytest.mark.integration  # trains with TRL's SFTTrainer (seconds)
@pytest.mark.parametrize("padding_free", [False, True])
def test_sft_trainer_uses_our_labels_and_our_loss(tmp_path, tokenizer, padding_free):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    rows = compact_rows()
    config = tiny_llama_config(len(tokenizer), layers=2, hidden=16, heads=2, kv_heads=1)
    # every column of a `bridge compact` row: TRL passes over id and tokenizer_fingerprint
    ds = Dataset.from_list([{"id": r.id, "input_ids": r.input_ids, "labels": r.labels,
                             "tokenizer_fingerprint": "sha256:" + "0" * 64} for r in rows])
    args = SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=2,
                     max_steps=1, learning_rate=1e-3, lr_scheduler_type="constant", warmup_steps=0, logging_steps=1,
                     report_to=[], use_cpu=True, save_strategy="no", max_length=None, bf16=False, seed=0,
                     padding_free=padding_free, max_grad_norm=1e9)
    trainer = SFTTrainer(model=tiny_model(config), args=args, train_dataset=ds, processing_class=tokenizer)

    # the masked positions TRL trains on are ours (padding and, padding-free, each row's first
    # position aside, which never carries loss in either: nothing predicts it)
    ours = {tuple(r.input_ids): [IGNORE] + r.labels[1:] for r in rows}
    seen = 0
    for batch in trainer.get_train_dataloader():
        ids, labels = batch["input_ids"], batch["labels"]
        if padding_free:
            starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist() + [ids.shape[1]]
            pieces = [(ids[0, a:b], labels[0, a:b]) for a, b in zip(starts, starts[1:])]
        else:
            keep = batch["attention_mask"].bool()
            pieces = [(ids[i][keep[i]], labels[i][keep[i]]) for i in range(ids.shape[0])]
        for piece_ids, piece_labels in pieces:
            got = [IGNORE] + piece_labels.tolist()[1:]
            assert got == ours[tuple(piece_ids.tolist())]
            seen += 1
    assert seen == len(rows)

    trainer.train()
    log = trainer.state.log_history[0]
    reference = tiny_model(config).train()
    loss = accumulate(reference, [rows[:2], rows[2:]], pad_id=tokenizer.pad_token_id)
    grad_norm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in reference.parameters())))
    assert log["loss"] == pytest.approx(loss, rel=1e-5)  # sum over the 4 rows / their supervised tokens
    assert log["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
    per_row_mean = float(np.mean([accumulate(tiny_model(config).train(), [[r]], pad_id=0) for r in rows]))
    assert abs(per_row_mean - loss) > 1e-4  # the comparison can tell Z_r from a mean of row means

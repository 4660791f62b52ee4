"""LLMLingua-2 with a local token classifier (microsoft/LLMLingua, ``llmlingua/prompt_compressor.py``).

The classifier (e.g. ``microsoft/llmlingua-2-xlm-roberta-large-meetingbank``) gives each of its
sub-tokens p_keep = softmax(logits)[1]; sub-token probabilities are averaged into words (as
LLMLingua-2 merges them); each *training* token gets the highest probability among the words it
overlaps (by character offsets; tokens that overlap no word, i.e. pure whitespace, get 0). The text is
classified in windows of at most 510 classifier tokens cut at word boundaries.

Nothing is downloaded: ``classifier=PATH`` must be a local folder (an HF model saved with
``save_pretrained`` and a fast tokenizer).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..format.records import Example

WINDOW = 510
_WORD = re.compile(r"\S+")

HOW_TO_GET = (
    "llmlingua2 needs a local LLMLingua-2 token classifier: on a machine with hub access run "
    "`huggingface-cli download microsoft/llmlingua-2-xlm-roberta-large-meetingbank --local-dir DIR`, "
    "copy DIR here and pass --option classifier=DIR (or use --method llmlingua1, which needs no classifier)"
)


@lru_cache(maxsize=2)
def load_classifier(path: str):
    """(tokenizer, model) of a local token-classification model; cached per path."""
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise ModelError(f"{p} is not a local model folder (no config.json)", hint=HOW_TO_GET)
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        model = AutoModelForTokenClassification.from_pretrained(str(p), local_files_only=True).eval()
    except Exception as exc:  # transformers raises many types
        raise ModelError(f"cannot load the token classifier at {p}: {exc}", hint=HOW_TO_GET) from None
    if not getattr(tok, "is_fast", False):
        raise ModelError(f"the classifier at {p} has no fast tokenizer (character offsets are needed)")
    if model.config.num_labels < 2:
        raise ModelError(
            f"the classifier at {p} has {model.config.num_labels} label(s); LLMLingua-2's has 2 (drop, keep)"
        )
    return tok, model


def _owner(words: list[tuple[int, int]], starts: np.ndarray, s: int, e: int) -> int:
    """The word a token with characters [s, e) belongs to (the last one it overlaps), or -1."""
    if e <= s:
        return -1
    k = int(np.searchsorted(starts, e - 1, side="right")) - 1
    return k if k >= 0 and words[k][1] > s else -1


def word_probabilities(text: str, tok, model) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Words of ``text`` (``\\S+`` runs, as character spans) and their keep probabilities: the mean of
    p_keep over each word's classifier tokens."""
    import torch

    words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    if not words:
        return words, np.zeros(0)
    starts = np.array([s for s, _ in words])
    offs = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    owner = [_owner(words, starts, s, e) for s, e in offs]
    # windows of at most WINDOW classifier tokens, cut between words
    windows, first = [], 0
    while first < len(offs):
        end = min(first + WINDOW, len(offs))
        while first + 1 < end < len(offs) and owner[end] != -1 and owner[end] == owner[end - 1]:
            end -= 1
        windows.append((offs[first][0], offs[end - 1][1]))
        first = end
    total = np.zeros(len(words))
    count = np.zeros(len(words))
    for c0, c1 in windows:
        enc = tok(
            text[c0:c1],
            add_special_tokens=True,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            truncation=True,
            max_length=WINDOW + 2,
        )
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([enc["input_ids"]])).logits[0].float()
        keep = torch.softmax(logits, dim=-1)[:, 1].numpy()
        for (s, e), special, p in zip(enc["offset_mapping"], enc["special_tokens_mask"], keep):
            k = -1 if special else _owner(words, starts, s + c0, e + c0)
            if k >= 0:
                total[k] += p
                count[k] += 1
    return words, np.divide(total, count, out=np.zeros(len(words)), where=count > 0)


def prompt_token_probabilities(example: Example, classifier: str) -> np.ndarray:
    """p_keep for every eligible prompt token of ``example`` (its words' highest probability)."""
    prompt = example.tokens.prompt_positions()
    if len(prompt) == 0:
        return np.zeros(0)
    tok, model = load_classifier(classifier)
    spans = example.tokens.spans()[prompt]
    lo, hi = int(spans[:, 0].min()), int(spans[:, 1].max())
    words, word_p = word_probabilities(example.text[lo:hi], tok, model)
    out = np.zeros(len(prompt))
    for t, (s, e) in enumerate(spans - lo):
        best = 0.0
        for (ws, we), p in zip(words, word_p):
            if ws >= e:
                break
            if we > s and e > s:
                best = max(best, float(p))
        out[t] = best
    return out

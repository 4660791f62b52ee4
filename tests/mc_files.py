"""Tiny multiple-choice data shared by test_eval_mc.py and test_lm_eval_engine.py: ARC rows (one with
a long choice, where the per-character and per-byte normalisations can part) and HellaSwag lines (with
the ``[title]`` and ``[step]`` markers its preprocessing removes)."""

from __future__ import annotations

import bz2
from pathlib import Path

ARC_ROWS = [
    {"id": "q1", "question": {"stem": "Which is a planet?", "choices": [
        {"text": "Mars", "label": "A"}, {"text": "Moon", "label": "B"}, {"text": "Sun", "label": "C"}]},
     "answerKey": "A"},
    {"id": "q2", "question": {"stem": "2+2?", "choices": [
        {"text": "3", "label": "1"}, {"text": "4", "label": "2"}, {"text": "5", "label": "3"}, {"text": "6", "label": "4"}]},
     "answerKey": "2"},
    {"id": "q3", "question": {"stem": "Water is", "choices": [
        {"text": "wet", "label": "A"}, {"text": "dry", "label": "B"}, {"text": "a long word here", "label": "C"}]},
     "answerKey": "A"},
    {"id": "q4", "question": {"stem": "Ice is", "choices": [
        {"text": "cold", "label": "A"}, {"text": "hot", "label": "B"}]}, "answerKey": "A"},
]

HS_LINES = [
    "Roof shingle removal: A man is sitting on a roof. he", "3",
    "is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "is holding a rubik's cube.",
    "starts pulling up roofing on a roof.",
    "Family Life: How to  play. Visit [www.example.org] to find games. [title] Have fun.", "0",
    "Pick one.", "Pick two [step] now.", "Pick three.", "Pick four, the longest ending of them all.",
    "Health: Stay well.", "2",
    "Drink water.", "Sleep.", "Walk every day.", "Eat.",
]


def write_hellaswag(path: Path) -> Path:
    """``HS_LINES`` as a bz2 file at ``path``, as the HellaSwag data comes."""
    path.write_bytes(bz2.compress(("\n".join(HS_LINES) + "\n").encode()))
    return path

"""bench/diagnostics/prompt_numbers.py, run as a process on a one-example selection written here: which of
the question's numbers the prompt side keeps, counted by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bridgecli.format import Array, Example, Header, ModelInfo, Scores, Selection, StreamWriter, Tokens

ROOT = Path(__file__).resolve().parents[1]

PROMPT = ["Tom", " has", " 1", "2", " apples", " and", " 3", ",", "400", " pears", "."]
RESPONSE = ["\n", "<<", "12", "*", "3", "=", "36", ">>", "36", " and", " <<", "3400", "+", "1", "=", "3401", ">>"]


def _stream(path: Path, prompt_keep: list[int]) -> None:
    text, offsets, kinds = "", [], []
    for pieces, kind in ((PROMPT, 1), (RESPONSE, 2)):
        for piece in pieces:
            offsets += [len(text), len(text) + len(piece)]
            text += piece
            kinds.append(kind)
    offsets += [len(text), len(text)]  # the EOS that ends the response
    kinds.append(3)
    n_p, n_r = len(PROMPT), len(RESPONSE)
    response = list(range(n_p, n_p + n_r))
    ex = Example(
        id="ex-0", index=0, text=text,
        tokens=Tokens(input_ids=list(range(n_p + n_r + 1)), kinds=bytes(kinds), offsets=offsets),
        scores=Scores(scorer="bridge", a=Array.of([0.0] * n_r), c=Array.of([0.0] * n_r),
                      A=Array.of([[0.0] * n_p] * n_r, "float16")),
        selection=Selection(method="random", b_p=len(prompt_keep), b_r=n_r, prompt_keep=prompt_keep,
                            response_keep=response, response_scores=Array.of([0.0] * n_r)),
    )
    header = Header(stage="selection", producer="bridgecli test", created="2026-01-01T00:00:00+00:00",
                    model=ModelInfo(source="tiny", fingerprint="sha256:00", tokenizer_fingerprint="sha256:11"),
                    steps=[], source="data.jsonl")
    with open(path, "wb") as fh, StreamWriter(fh, header) as writer:
        writer.write(ex)


@pytest.mark.integration  # runs the script as a process
def test_numbers_kept_whole_and_operands_visible(tmp_path):
    # keep " 1" (not "2": 12 is cut) and all of " 3" "," "400" (3,400 whole)
    _stream(tmp_path / "sel.bridge", prompt_keep=[0, 2, 4, 6, 7, 8])
    _stream(tmp_path / "all.bridge", prompt_keep=list(range(len(PROMPT))))
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench/diagnostics/prompt_numbers.py"), f"cut={tmp_path / 'sel.bridge'}",
         f"all={tmp_path / 'all.bridge'}", "--json", str(out)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["rows"]
    cut = rows["cut"]
    assert cut["numbers"] == 2  # 12 and 3,400
    assert cut["numbers_kept_whole"] == 0.5 and cut["numbers_none_kept"] == 0.0
    assert cut["digits_kept"] == pytest.approx(5 / 6)  # "1" of "12", all of "3" + "400"
    # operands from the question: 12 (cut) and 3400 (whole); 3 and 1 are not numbers of the question
    assert cut["calc_operands_from_question"] == 2 and cut["calc_operands_visible"] == 0.5
    assert rows["all"]["numbers_kept_whole"] == 1.0 and rows["all"]["calc_operands_visible"] == 1.0

"""Write the golden bridge streams of the current format version, and what they must decode to.

    python tests/golden/make_golden.py            # writes tests/golden/v<MAJOR>.<MINOR>-*.bridge + -expected.json

Golden files are written ONCE, when a format version is released, and committed. From then on they
are read forever: tests/test_format.py decodes every ``v*-expected.json`` set with the current reader
and compares. Never regenerate a released set (the script refuses to overwrite; ``--force`` exists
only for a version that has not been released yet). A new minor version adds a new set next to the
old ones.

Everything here is deterministic and needs no model: fixed timestamps, fixed strings, a toy
tokenizer (ids from a CRC-32 of the token text, SmolLM2-style chat markers) and scores computed from
closed-form expressions, rounded so they are exact in their dtypes. The arrays have the shapes and
conventions of real ones: ``Scores`` rows follow the eligible response positions, columns the
eligible prompt positions; ``A`` is float16; positions in ``Selection``/``Closure`` are absolute
token indices.

One stream per stage (tokens, scores, selection, closure), three examples each, the later stages
enriching the same three examples. Example 2 has no ``loss`` (an optional part left out) and a
non-ASCII character (offsets count characters of ``Example.text``, not bytes). The closure stream is
written with two records per zstd frame, so it spans several frames.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import re
import sys
import zlib
from pathlib import Path

import msgspec
import numpy as np
import zstandard

from bridgecli.format.records import (
    Array, Closure, Example, Header, ModelInfo, Reference, Scores, Selection, Step, Tokens,
)
from bridgecli.format.spec import EOS, MAJOR, MINOR, PROMPT, RESPONSE, STAGES, TEMPLATE
from bridgecli.format.writer import StreamWriter

HERE = Path(__file__).resolve().parent
PRODUCER = "bridgecli 0.1.0"
CREATED = "2025-01-01T00:00:00+00:00"
MODEL = ModelInfo(
    source="HuggingFaceTB/SmolLM2-135M-Instruct",
    fingerprint="sha256:5d0b1f0e6c7a4e4b9d2f8a1c3e5b7d9f0a2c4e6b8d0f1a3c5e7b9d1f3a5c7e9b",
    tokenizer_fingerprint="sha256:0c1d2e3f405162738495a6b7c8d9eafb0c1d2e3f405162738495a6b7c8d9eafb",
    chat_template=True,
)
SOURCE = "examples/data/train.jsonl"
RHO_P = RHO_R = 0.75
ROUNDS = 4

PAIRS = [
    ("ex-0000", "Tom has 3 apples and buys 4 more. How many apples does he have now?",
     "He starts with 3 apples. He buys 4 more, so 3 + 4 = 7. #### 7"),
    ("ex-0001", "A pen costs 2 dollars. How much do 6 pens cost?",
     "Each pen costs 2 dollars. Six pens cost 6 * 2 = 12 dollars. #### 12"),
    ("ex-0002", "Léa saves €5 a week. How much does she save in 4 weeks?",
     "She saves 5 each week. In 4 weeks she saves 4 * 5 = 20. #### 20"),
]

SPECIAL = {"<|im_start|>": 1, "<|im_end|>": 2}
_TOKEN = re.compile(r"<\|im_(?:start|end)\|>| ?\w+| ?[^\s\w]+|\s+")


def _tokenize(piece: str) -> list[tuple[int, int, int]]:
    """(id, start, end) for every token of ``piece``; a toy BPE stand-in, deterministic forever."""
    out = []
    for m in _TOKEN.finditer(piece):
        tok = m.group(0)
        tid = SPECIAL.get(tok, 152 + zlib.crc32(tok.encode("utf-8")) % 49000)
        out.append((tid, m.start(), m.end()))
    assert "".join(piece[s:e] for _, s, e in out) == piece
    return out


TEXTS: dict[int, list[str]] = {}  # id(Tokens) -> the text of every token (for the 1.2 protected sets)


def make_tokens(prompt: str, response: str) -> tuple[str, Tokens]:
    pieces = [("<|im_start|>user\n", TEMPLATE), (prompt, PROMPT),
              ("<|im_end|>\n<|im_start|>assistant\n", TEMPLATE), (response, RESPONSE), ("<|im_end|>", EOS)]
    ids, kinds, offsets, pos = [], [], [], 0
    for piece, kind in pieces:
        for tid, s, e in _tokenize(piece):
            ids.append(tid)
            kinds.append(TEMPLATE if (tid in SPECIAL.values() and kind != EOS) else kind)
            offsets += [pos + s, pos + e]
        pos += len(piece)
    text = "".join(p for p, _ in pieces)
    tokens = Tokens(input_ids=ids, kinds=bytes(kinds), offsets=offsets)
    TEXTS[id(tokens)] = [text[offsets[2 * t]:offsets[2 * t + 1]] for t in range(len(ids))]
    return text, tokens


def _f32(x: float) -> float:
    return float(np.float32(x))


def make_scores(tokens: Tokens, k: int) -> Scores:
    n, m = len(tokens.response_positions()), len(tokens.prompt_positions())
    a = np.array([round(0.02 * math.sin(1.3 * j + 0.7 * k), 5) for j in range(n)], dtype=np.float32)
    c = np.array([round(j / (j + 3), 4) for j in range(n)], dtype=np.float32)
    w = np.array([[1 + (3 * j + 5 * i + k) % 7 for i in range(m)] for j in range(n)], dtype=np.float64)
    A = (w / w.sum(axis=1, keepdims=True) * (0.8 * (1.0 - c[:, None]))).astype(np.float16)
    loss = None
    if k != 2:
        loss = Array.of([round(0.3 + 2.5 * ((7 * j + 3 * k) % 11) / 11, 4) for j in range(n)], "float32")
    B = None
    if (MAJOR, MINOR) >= (1, 2) and k == 1:  # (1.2) an interaction matrix, as the atp scorer writes
        B = Array.of(np.round(A.astype(np.float64) * a[:, None] * (1.0 + 0.5 * np.cos(w)), 6), "float32")
    return Scores(scorer="bridge", a=Array.of(a), c=Array.of(c), A=Array.of(A, "float16"), loss=loss, B=B)


def _budget(rho: float, eligible: int) -> int:
    return math.ceil(rho * eligible - 1e-9)


def make_selection(tokens: Tokens, scores: Scores) -> Selection:
    prompt, resp = tokens.prompt_positions(), tokens.response_positions()
    b_p, b_r = _budget(RHO_P, len(prompt)), _budget(RHO_R, len(resp))
    a, A = scores.a.numpy().astype(np.float64), scores.A.numpy().astype(np.float64)
    col = (A * np.abs(a)[:, None]).sum(axis=0)
    p_idx = np.sort(np.argsort(-col, kind="stable")[:b_p])
    r_scores = np.round(a + 0.01 * A[:, p_idx].sum(axis=1), 6).astype(np.float32)
    r_idx = np.sort(np.argsort(-r_scores, kind="stable")[:b_r])
    total = float(r_scores[r_idx].sum())
    u_sur = [round(total * f, 6) for f in (0.81, 0.94, 0.99, 1.0)]
    sel = Selection(method="bridge", b_p=b_p, b_r=b_r, prompt_keep=prompt[p_idx].tolist(),
                    response_keep=resp[r_idx].tolist(), response_scores=Array.of(r_scores), u_sur=u_sur,
                    achieved_rho_p=len(p_idx) / len(prompt), achieved_rho_r=len(r_idx) / len(resp))
    if (MAJOR, MINOR) >= (1, 2):
        # (1.2) protected tokens: the last response token (the "#### N" answer's number) always supervised,
        # and the prompt tokens already kept that hold a digit always kept (so the sets stay consistent)
        digits = [int(p) for p in sel.prompt_keep if any(ch.isdigit() for ch in TEXTS[id(tokens)][p])]
        sel = msgspec.structs.replace(sel, protected_prompt=digits,
                                      protected_response=[int(resp[-1])] if int(resp[-1]) in sel.response_keep else [])
    return sel


def with_weights(sel: Selection) -> Selection:
    """(1.3) loss weights of the kept response tokens, as `select --method importance` writes them."""
    weights = [round(1.0 / (0.5 + 0.125 * j), 4) for j in range(len(sel.response_keep))]
    return msgspec.structs.replace(sel, response_weights=Array.of(weights, "float32"))


def make_references(tokens: Tokens, k: int) -> dict[str, Reference]:
    """(1.1) What `bridge reference` stores: a 'base' model's losses and attention for every example,
    a 'warmup' one's losses for examples 0 and 1 only (example 2 carries one reference)."""
    m, n = len(tokens.prompt_positions()), len(tokens.response_positions())
    loss = lambda size, s: Array.of([round(0.25 + ((5 * t + s) % 13) / 4, 2) for t in range(size)], "float32")  # noqa: E731
    refs = {"base": Reference(
        model="HuggingFaceTB/SmolLM2-135M-Instruct", fingerprint=MODEL.fingerprint,
        prompt_loss=loss(m, k), response_loss=loss(n, k + 1),
        response_attention=Array.of([round(0.5 * (j % 4) / 4 + 0.25, 3) for j in range(n)], "float32"))}
    if k != 2:
        refs["warmup"] = Reference(model="runs/warm/checkpoint", fingerprint="sha256:" + "ab" * 32,
                                   response_loss=loss(n, k + 2))
    return refs


def make_closure(text: str, tokens: Tokens, selection: Selection, fill: bool = False) -> Closure:
    """Sentence units over the response; units chosen greedily by mean score within the budget b_r.
    ``fill`` (1.3): the first response token outside the chosen units is supervised too (``filled``)."""
    resp, spans = tokens.response_positions(), tokens.spans()
    ends = [m.end() for m in re.finditer(r"[.?!](?= )", text)]
    sentence = [sum(1 for e in ends if e <= spans[p, 0]) for p in resp]
    units: list[tuple[int, int]] = []
    for j, s in enumerate(sentence):
        if units and sentence[j - 1] == s:
            units[-1] = (units[-1][0], j + 1)
        else:
            units.append((j, j + 1))
    r = selection.response_scores.numpy()
    order = sorted(range(len(units)), key=lambda u: -float(r[units[u][0]:units[u][1]].mean()))
    chosen, used = [], 0
    for u in order:
        size = units[u][1] - units[u][0]
        if used + size <= selection.b_r:
            chosen.append(u)
            used += size
    chosen.sort()
    supervise = sorted(int(resp[j]) for u in chosen for j in range(*units[u]))
    flat = [int(v) for s, e in units for v in (resp[s], resp[e - 1] + 1)]
    protected_units = []
    if (MAJOR, MINOR) >= (1, 2):  # (1.2) the units holding a protected response token, forced in
        protected_units = [k for k, (s, e) in enumerate(units)
                           if any(s <= j < e for j in np.searchsorted(resp, selection.protected_response))]
        chosen = sorted(set(chosen) | set(protected_units))
        supervise = sorted(int(resp[j]) for u in chosen for j in range(*units[u]))
        filled = []
        if (MAJOR, MINOR) >= (1, 3) and fill:
            filled = [int(p) for p in resp if int(p) not in supervise][:1]
            supervise = sorted(supervise + filled)
            return Closure(segmenter="sentence", alpha=0.0, units=flat, chosen=chosen, supervise=supervise,
                           protected_units=protected_units, filled=filled)
        return Closure(segmenter="sentence", alpha=0.0, units=flat, chosen=chosen, supervise=supervise,
                       protected_units=protected_units)
    return Closure(segmenter="sentence", alpha=0.0, units=flat, chosen=chosen, supervise=supervise)


def make_examples() -> dict[str, list[Example]]:
    by_stage: dict[str, list[Example]] = {s: [] for s in STAGES}
    for k, (ex_id, prompt, response) in enumerate(PAIRS):
        text, tokens = make_tokens(prompt, response)
        ex = Example(id=ex_id, index=k, text=text, tokens=tokens)
        by_stage["tokens"].append(ex)
        ex = msgspec.structs.replace(ex, scores=make_scores(tokens, k))
        if (MAJOR, MINOR) >= (1, 1):
            ex = msgspec.structs.replace(ex, references=make_references(tokens, k))
        by_stage["scores"].append(ex)
        sel = make_selection(tokens, ex.scores)
        ex = msgspec.structs.replace(ex, selection=sel)
        if (MAJOR, MINOR) >= (1, 3) and k == 2:  # (1.3) a weighted selection (not closed: close refuses it)
            by_stage["selection"].append(msgspec.structs.replace(ex, selection=with_weights(sel)))
        else:
            by_stage["selection"].append(ex)
        ex = msgspec.structs.replace(ex, closure=make_closure(text, tokens, ex.selection, fill=k == 0))
        by_stage["closure"].append(ex)
    return by_stage


STEPS = {
    "scores": Step(step="score", producer=PRODUCER, time="2025-01-01T00:00:00+00:00", params={
        "scorer": "bridge", "from": "runs/warm", "attention_layers": 4, "batch_size": 8, "dtype": "bfloat16",
        "device": "cuda", "data": SOURCE, "chat_template": True, "max_length": None, "excluded_warmup_ids": 32}),
    "selection": Step(step="select", producer=PRODUCER, time="2025-01-01T00:01:00+00:00", params={
        "method": "bridge", "rho_p": RHO_P, "rho_r": RHO_R, "rounds": ROUNDS, "plugin": "bridgecli.builtin"}),
    "closure": Step(step="close", producer=PRODUCER, time="2025-01-01T00:02:00+00:00", params={
        "segmenter": "sentence", "alpha": 0.0, "plugin": "bridgecli.builtin"}),
}


def make_header(stage: str) -> Header:
    steps = [STEPS[s] for s in STAGES[1:STAGES.index(stage) + 1]]
    return Header(stage=stage, producer=PRODUCER, created=CREATED, model=MODEL, steps=steps, source=SOURCE)


def zstd_frames(body: bytes) -> int:
    n = 0
    while body:
        d = zstandard.ZstdDecompressor().decompressobj()
        d.decompress(body)
        body = d.unused_data
        n += 1
    return n


def _array(arr: Array) -> dict:
    values = arr.numpy()
    return {"dtype": arr.dtype, "shape": arr.shape, "head": values.reshape(-1)[:4].tolist(),
            "sum": float(values.astype(np.float64).sum())}


def _dumps(obj, indent: int = 0) -> str:
    """JSON with one key per line but lists of scalars on one line (a readable, diffable file)."""
    pad = " " * (indent + 1)
    if isinstance(obj, dict) and obj:
        items = [f"{pad}{json.dumps(k)}: {_dumps(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        items = [pad + _dumps(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))


def expected_example(ex: Example) -> dict:
    tok = ex.tokens
    spans = tok.spans()
    resp = tok.response_positions()
    out = {
        "record": msgspec.to_builtins(ex),
        "stage": ex.stage(),
        "positions": {"prompt": tok.prompt_positions().tolist(), "response": resp.tolist(),
                      "eos": tok.eos_positions().tolist()},
        "response_text": ex.text[spans[resp[0], 0]:spans[resp[-1], 1]],
        "eos_text": ex.text[spans[tok.eos_positions()[0], 0]:spans[tok.eos_positions()[0], 1]],
        "arrays": {},
    }
    if ex.scores is not None:
        for name in ("a", "c", "A", "loss"):
            arr = getattr(ex.scores, name)
            out["arrays"][f"scores.{name}"] = None if arr is None else _array(arr)
    if ex.selection is not None:
        out["arrays"]["selection.response_scores"] = _array(ex.selection.response_scores)
        if ex.selection.response_weights is not None:
            out["arrays"]["selection.response_weights"] = _array(ex.selection.response_weights)
    for name, ref in ex.references.items():
        for part in ("prompt_loss", "response_loss", "response_attention"):
            arr = getattr(ref, part)
            if arr is not None:
                out["arrays"][f"references.{name}.{part}"] = _array(arr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE, help="folder to write into (default: tests/golden)")
    ap.add_argument("--force", action="store_true", help="overwrite an existing set (unreleased versions only)")
    args = ap.parse_args(argv)
    version = f"v{MAJOR}.{MINOR}"
    expected_path = args.out / f"{version}-expected.json"
    if expected_path.exists() and not args.force:
        print(f"{expected_path} exists: golden files of a released version are never regenerated", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    expected = {"format": [MAJOR, MINOR], "files": {}}
    for stage, examples in make_examples().items():
        header = make_header(stage)
        buf = io.BytesIO()
        with StreamWriter(buf, header, records_per_frame=2 if stage == "closure" else 64) as writer:
            for ex in examples:
                writer.write(ex)
        data = buf.getvalue()
        name = f"{version}-{stage}.bridge"
        (args.out / name).write_bytes(data)
        expected["files"][name] = {
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
            "format": [MAJOR, MINOR],
            "stage": stage,
            "zstd_frames": zstd_frames(data[12:]),
            "header": msgspec.to_builtins(header),
            "count": len(examples),
            "examples": [expected_example(ex) for ex in examples],
        }
    expected_path.write_text(_dumps(expected) + "\n", encoding="utf-8")
    print(f"wrote {len(expected['files'])} streams and {expected_path.name} to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

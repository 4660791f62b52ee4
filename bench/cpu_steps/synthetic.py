"""A scored stream of GSM8K-like examples made without a tokenizer or data file, for the CPU-step benchmarks.

    python bench/cpu_steps/synthetic.py OUT.bridge -n 20000 [--seed 0] [--frame 256]

Text: the project's generated GSM8K-style problems (examples/make_sample.py: questions, reasoning lines
with ``<<a*b=c>>c`` calculator annotations, a ``#### N`` answer line), wrapped in a chat template. Tokens:
a regular expression cuts the text as a byte-pair tokenizer roughly would (a word in pieces of at most four
letters with the space before it, each digit, each other character, each run of spaces), which gives about
60 prompt and 125 response tokens per example, as GSM8K with the default model's tokenizer; a token's id is
a hash of its text, its offsets are exact, so `close --segmenter math` and `compact` see real structure.
Scores as bench_steps.py draws them: ``a`` float32 N(0, 1e-3), ``c`` float32 U(0, 1), ``A`` float16 rows
of a Dirichlet draw (summing to at most 1), ``loss`` float32 U(0, 4). Frames hold ``--frame`` examples, as
`bridge score` writes them (one frame per window of 256 by default).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_PIECE = re.compile(r" ?[A-Za-z]{1,4}|\d|[^\sA-Za-z\d]|\s+")
_TEMPLATE, _PROMPT, _RESPONSE, _EOS = 0, 1, 2, 3


def _problems(n: int, seed: int) -> list[dict]:
    spec = importlib.util.spec_from_file_location("make_sample", ROOT / "examples" / "make_sample.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_sample"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.generate(n, seed=seed)


def tokens_of(question: str, answer: str):
    """(text, input_ids, kinds, offsets) of one chat-formatted example."""
    text, ids, kinds, offsets = "", [], bytearray(), []

    def add(piece: str, kind: int, split: bool) -> None:
        nonlocal text
        start = len(text)
        text += piece
        for m in _PIECE.finditer(piece) if split else [re.match(r".*", piece, re.S)]:
            ids.append(zlib.crc32(m.group().encode()) % 150_000 + 16)
            kinds.append(kind)
            offsets.extend((start + m.start(), start + m.end()))

    add("<|im_start|>", _TEMPLATE, False)
    add("user\n", _TEMPLATE, False)
    add(question, _PROMPT, True)
    add("<|im_end|>", _TEMPLATE, False)
    add("\n", _TEMPLATE, False)
    add("<|im_start|>", _TEMPLATE, False)
    add("assistant\n", _TEMPLATE, False)
    add(answer, _RESPONSE, True)
    add("<|im_end|>", _EOS, False)
    return text, ids, bytes(kinds), offsets


def make_stream(path: Path, n: int, seed: int = 0, frame: int = 256, shard: tuple[int, int] | None = None) -> dict:
    """Write ``n`` scored examples to ``path``; returns their average prompt and response token counts.
    ``shard=(rank, shards)``: only the examples whose index is ``rank`` modulo ``shards``, as that rank of a
    ``bridge score`` under torchrun writes them (its own random scores; the header says which shard)."""
    sys.path.insert(0, str(ROOT / "src"))
    import numpy as np  # the venv's packages: imported here, so that --help needs none

    from bridgecli import PRODUCER
    from bridgecli.format.records import Array, Example, Header, ModelInfo, Scores, Tokens
    from bridgecli.format.writer import StreamWriter
    from bridgecli.steps.common import now, step_record

    problems = _problems(min(n, 5000), seed)
    rank, shards = shard or (0, 1)
    rng = np.random.default_rng(seed if shard is None else [seed, rank])
    header = Header(
        stage="scores",
        producer=PRODUCER,
        created=now(),
        model=ModelInfo(source="synthetic", fingerprint="synthetic", tokenizer_fingerprint="synthetic"),
        steps=[step_record("score", {"synthetic": True, "seed": seed, **({"shard": list(shard)} if shard else {})})],
        source="synthetic",
    )
    m_sum = n_sum = count = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        w = StreamWriter(fh, header, records_per_frame=None)
        for i in range(rank, n, shards):
            p = problems[i % len(problems)]
            text, ids, kinds, offsets = tokens_of(p["question"], p["answer"])
            m, k = kinds.count(_PROMPT), kinds.count(_RESPONSE)
            m_sum += m
            n_sum += k
            count += 1
            scores = Scores(
                scorer="synthetic",
                a=Array.of(rng.normal(0, 1e-3, k).astype(np.float32)),
                c=Array.of(rng.uniform(0, 1, k).astype(np.float32)),
                A=Array.of(rng.dirichlet(np.ones(m + 8), size=k)[:, :m].astype(np.float16), "float16"),
                loss=Array.of(rng.uniform(0, 4, k).astype(np.float32)),
            )
            tokens = Tokens(input_ids=ids, kinds=kinds, offsets=offsets)
            w.write(Example(id=f"syn-{i:07d}", index=i, text=text, tokens=tokens, scores=scores))
            if w.count % frame == 0:
                w.flush()
        w.close()
    return {
        "examples": count,
        "prompt_tokens": round(m_sum / max(count, 1), 1),
        "response_tokens": round(n_sum / max(count, 1), 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--frame", type=int, default=256, help="examples per zstd frame (bridge score: its --window)")
    a = ap.parse_args(argv)
    sizes = make_stream(a.out, a.n, a.seed, a.frame)
    print(
        f"wrote {a.out}: {sizes['examples']} examples, {sizes['prompt_tokens']} prompt and "
        f"{sizes['response_tokens']} response tokens each on average, {a.out.stat().st_size / 1e6:.1f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

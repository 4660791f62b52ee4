"""Long real-text examples for `bench/score/e2e.py`'s long case (the kernel table's "3B long":
512 prompt + 1,536 response tokens): GSM8K questions joined into a prompt and their answers joined
into a response until each reaches its token count under the given tokenizer.

    python bench/score/long_examples.py --data gsm8k/train.jsonl --tokenizer TOKENIZER_DIR \\
        --prompt-tokens 512 --response-tokens 1536 -n 512 --out /tmp/long.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from itertools import cycle
from pathlib import Path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="GSM8K-style JSONL (question, answer)")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--response-tokens", type=int, default=1536)
    ap.add_argument("-n", type=int, default=512)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    rows = [json.loads(line) for line in open(args.data) if line.strip()]
    source = cycle(rows)

    def fill(field: str, budget: int) -> str:
        parts: list[str] = []
        while True:
            parts.append(next(source)[field])
            ids = tok("\n\n".join(parts), add_special_tokens=False)["input_ids"]
            if len(ids) >= budget:
                return tok.decode(ids[:budget])

    out = Path(args.out)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name + ".")
    with os.fdopen(fd, "w") as fh:
        for i in range(args.n):
            rec = {
                "id": f"long-{i}",
                "question": fill("question", args.prompt_tokens),
                "answer": fill("answer", args.response_tokens),
            }
            fh.write(json.dumps(rec) + "\n")
    os.replace(tmp, out)


if __name__ == "__main__":
    main()

"""How fast `bridge eval` generates: end to end (the model load included) and generation alone, for a
list of batch sizes (and token budgets), with and without --compile; and, on the CPU, the host cost
per decoding step of the stopping criteria.

    # generation (GPU: the lead's grid; CPU: a smoke run)
    python bench/eval/gen_speed.py run MODEL --data data/gsm8k/test.jsonl \\
        [--limit N] [--batch-sizes 64,256,1319] [--batch-tokens 0,400000] [--compile off,on] \\
        [--max-new-tokens 256] [--dtype bfloat16] [--device cuda] [--no-end-to-end] [--json OUT.json]

    # the stopping criteria alone, old (from git) against new, with a real tokenizer
    python bench/eval/gen_speed.py criteria TOKENIZER --data data/gsm8k/test.jsonl \\
        [--batch-sizes 64,256,512,1319] [--steps 256] [--json OUT.json]

``run`` loads MODEL once and, for every setting (batch size x token budget x compile), generates the
GSM8K prompts exactly as ``bridge eval --task gsm8k`` builds them (chat template, zero-shot) with
:func:`bridgecli.evaluation.generate.generate`, timing it (CUDA synchronised) and reading its
``stats``: items/s, generated tokens/s (EOS included, padding and finished rows not), batches,
decoding steps, how full the batches were (generated tokens / (rows x steps)), items cut off by
the length limit, and whether the texts equal the first setting's (greedy decoding should give the
same texts; a static cache or another batch can flip a rare near-tie). The first call of a
compiled setting includes its compilation, so a compiled setting runs twice and both timings are
kept. Then, unless ``--no-end-to-end``, it times ``bridge eval MODEL --task gsm8k`` as a
subprocess for each batch size (load, generation, grading), with and without ``--compile`` as
asked (and each token budget), and keeps its accuracy.

``criteria`` needs no model. Rows are GSM8K reference answers tokenised (the "generation"),
each followed by EOS and padding as ``model.generate`` leaves a finished row, behind a padded
prompt; every step calls the criteria on the sequence so far, as ``model.generate`` does. It
times the old criteria (``--old-rev``: the generate.py of that commit) and the new ones, in chat
mode (EOS only: the progress bar's check) and in plain mode (the stop strings of gsm8k's plain
prompt, ``\\nQ:`` and ``\\n\\n\\n``), and checks that both stop the same rows at the same steps.

Both write a JSON (``--json``) with the device name, the commit, the command, the date, torch and
transformers versions and every number printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from load_code import import_at

REPO = Path(__file__).resolve().parents[2]
GENERATE = "src/bridgecli/evaluation/generate.py"
OLD_REV = "99b4326"  # the last commit with the criteria that decode every row's window at every step
sys.path.insert(0, str(REPO / "bench"))
from provenance import header, settings, write_json  # noqa: E402


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


# ------------------------------------------------------------------------------------------------ run


def gsm8k_prompts(tokenizer, data: str, limit: int | None):
    from bridgecli.evaluation import gsm8k
    from bridgecli.evaluation.generate import uses_chat_template

    items = gsm8k.load(data)
    items = items if limit is None else items[:limit]
    chat = uses_chat_template(tokenizer, True)
    return items, [gsm8k.build_prompt(item.question, [], chat=chat) for item in items], chat


def timed_generate(model, tokenizer, prompts, *, stop, **kwargs):
    import torch

    from bridgecli.evaluation.generate import generate

    stats: dict = {}
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    texts = generate(model, tokenizer, prompts, stop=stop, progress=False, stats=stats, **kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return texts, stats, time.perf_counter() - start


def summarize(n: int, stats: dict, seconds: float) -> dict:
    batches = stats["batches"]
    new = sum(b["new_tokens"] for b in batches)
    cells = sum(b["rows"] * b["steps"] for b in batches)
    return {
        "seconds": round(seconds, 3),
        "items_per_s": round(n / seconds, 2),
        "new_tokens": new,
        "new_tokens_per_s": round(new / seconds, 1),
        "batches": len(batches),
        "steps": sum(b["steps"] for b in batches),
        "fill": round(new / cells, 3) if cells else None,
        "hit_limit": sum(1 for v in stats["items"].values() if v["hit_limit"]),
        "compiled": stats["compiled"],
    }


def run(args) -> None:
    import torch

    from bridgecli.evaluation import gsm8k
    from bridgecli.modeling.loading import load_model, load_tokenizer, resolve, resolve_device

    device = resolve_device(args.device)
    result = {
        **header(device),
        "mode": "run",
        **settings(args, "model", "data", "limit", "max_new_tokens", "dtype"),
        "generation": [],
        "end_to_end": [],
    }
    ref = resolve(args.model)
    start = time.perf_counter()
    tokenizer = load_tokenizer(ref)
    model = load_model(ref, device=device, dtype=getattr(torch, args.dtype) if args.dtype else None)
    model.eval()
    result["load_seconds"] = round(time.perf_counter() - start, 2)
    items, prompts, chat = gsm8k_prompts(tokenizer, args.data, args.limit)
    stop = () if chat else gsm8k.PLAIN_STOP
    print(f"{len(prompts)} prompts on {result['device_name']}; model loaded in {result['load_seconds']} s")
    first = None
    for compile_ in args.compile:
        for batch_size in args.batch_sizes:
            for budget in args.batch_tokens:
                runs = 2 if compile_ and device.startswith("cuda") else 1
                for attempt in range(runs):
                    texts, stats, seconds = timed_generate(
                        model,
                        tokenizer,
                        prompts,
                        stop=stop,
                        max_new_tokens=args.max_new_tokens,
                        batch_size=batch_size,
                        batch_tokens=budget or None,
                        compile=compile_,
                    )
                    row = {
                        "batch_size": batch_size,
                        "batch_tokens": budget or None,
                        "compile": compile_,
                        "attempt": attempt + 1,
                        **summarize(len(prompts), stats, seconds),
                    }
                    first = texts if first is None else first
                    row["same_texts_as_first"] = sum(a == b for a, b in zip(texts, first))
                    row["accuracy"] = gsm8k.summarize(gsm8k.grade(items, texts), {})["accuracy"]
                    result["generation"].append(row)
                    print(json.dumps(row))
                    write_json(args.json, result)
    if args.end_to_end:
        for compile_ in args.compile:
            for batch_size in args.batch_sizes:
                for budget in args.batch_tokens:
                    row = end_to_end(args, device, batch_size, budget or None, compile_, len(prompts))
                    result["end_to_end"].append(row)
                    print(json.dumps(row))
                    write_json(args.json, result)
    write_json(args.json, result)


def end_to_end(args, device: str, batch_size: int, budget: int | None, compile_: bool, n: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "eval-gsm8k.json"
        cmd = [
            sys.executable,
            "-m",
            "bridgecli",
            "eval",
            args.model,
            "--task",
            "gsm8k",
            "--data",
            args.data,
            "--batch-size",
            str(batch_size),
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--device",
            device,
            "-o",
            str(out),
        ]
        cmd += ["--limit", str(args.limit)] if args.limit else []
        cmd += ["--dtype", args.dtype] if args.dtype else []
        cmd += ["--batch-tokens", str(budget)] if budget else []
        cmd += ["--compile"] if compile_ else []
        env = {**os.environ, "BRIDGE_NO_PROGRESS": "1"}
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - start
        row = {
            "command": " ".join(["bridge", *cmd[3:]]),
            "batch_size": batch_size,
            "batch_tokens": budget,
            "compile": compile_,
            "returncode": done.returncode,
            "wall_seconds": round(seconds, 2),
            "items_per_s": round(n / seconds, 2),
        }
        if done.returncode == 0:
            summary = json.loads(out.read_text())["summary"]
            row.update(
                accuracy=summary["accuracy"], task_seconds=summary["seconds"], generation=summary.get("generation")
            )
        else:
            row["stderr_tail"] = done.stderr[-2000:]
        return row


# ------------------------------------------------------------------------------------------- criteria


def old_generate_module(rev: str):
    """generate.py as it was at ``rev``, imported beside the package (its relative imports work)."""
    return import_at(rev, GENERATE, "bridgecli.evaluation._generate_old")


def simulated_ids(tokenizer, data: str, rows: int, prompt: int, steps: int):
    """``rows`` continuations (GSM8K reference answers, EOS, then padding) behind ``prompt`` pads."""
    import torch

    from bridgecli.evaluation import gsm8k

    answers = [item.answer for item in gsm8k.load(data)]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((rows, prompt + steps), pad, dtype=torch.long)
    encoded = tokenizer([answers[r % len(answers)] for r in range(rows)], add_special_tokens=False)["input_ids"]
    for r, tokens in enumerate(encoded):
        tokens = (tokens + [eos])[:steps]
        ids[r, prompt : prompt + len(tokens)] = torch.tensor(tokens)
    return ids


def time_criteria(module, tokenizer, ids, prompt: int, stop, eos) -> tuple[float, list[int]]:
    """Seconds per step of ``module``'s ItemProgress (wrapping its StopOnStrings when ``stop``), and
    the step at which each row was first seen done."""
    import torch

    from bridgecli.progress import BridgeProgress

    bar = BridgeProgress(disable=True)
    task = bar.add_task("bench", total=ids.shape[0])
    rule = module.StopOnStrings(tokenizer, stop, prompt) if stop else None
    watch = module.ItemProgress(bar, task, 0, prompt, [eos], rule)
    done_at = [-1] * ids.shape[0]
    seconds = 0.0
    for t in range(1, ids.shape[1] - prompt + 1):
        view = ids[:, : prompt + t]
        start = time.perf_counter()
        watch(view, None)
        seconds += time.perf_counter() - start
        for r in (watch.done.cpu() & (torch.tensor(done_at) < 0)).nonzero()[:, 0].tolist():
            done_at[r] = t
    return seconds / (ids.shape[1] - prompt), done_at


def criteria(args) -> None:
    from bridgecli.evaluation import generate as new
    from bridgecli.evaluation import gsm8k
    from bridgecli.modeling.loading import load_tokenizer, resolve

    tokenizer = load_tokenizer(resolve(args.tokenizer))
    old = old_generate_module(args.old_rev)
    result = {
        **header("cpu"),
        "mode": "criteria",
        **settings(args, "tokenizer", "old_rev", "steps", "prompt_tokens"),
        "rows": [],
    }
    for rows in args.batch_sizes:
        ids = simulated_ids(tokenizer, args.data, rows, args.prompt_tokens, args.steps)
        for mode, stop in (("chat (EOS only)", ()), ("plain (stop strings)", gsm8k.PLAIN_STOP)):
            new._ENDS.pop(tokenizer, None)  # the new check's per-token table starts empty, as in a fresh run
            per_old, done_old = time_criteria(old, tokenizer, ids, args.prompt_tokens, stop, tokenizer.eos_token_id)
            per_new, done_new = time_criteria(new, tokenizer, ids, args.prompt_tokens, stop, tokenizer.eos_token_id)
            row = {
                "batch_size": rows,
                "mode": mode,
                "old_ms_per_step": round(1000 * per_old, 3),
                "new_ms_per_step": round(1000 * per_new, 3),
                "speedup": round(per_old / per_new, 1),
                "same_rows_done_at_same_steps": done_old == done_new,
            }
            result["rows"].append(row)
            print(json.dumps(row))
    write_json(args.json, result)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run", help="time generation and bridge eval --task gsm8k")
    r.add_argument("model", help="model folder, .gguf file, HF id or 'smollm2'")
    r.add_argument("--data", required=True, help="GSM8K test JSONL")
    r.add_argument("--limit", type=int, default=None, help="the first N items (default: all)")
    r.add_argument("--batch-sizes", type=ints, default=[64, 256, 1319])
    r.add_argument("--batch-tokens", type=ints, default=[0], help="token budgets to try (0: none)")
    r.add_argument(
        "--compile",
        type=lambda s: [x.strip() == "on" for x in s.split(",")],
        default=[False, True],
        help="off,on (default both)",
    )
    r.add_argument("--max-new-tokens", type=int, default=256)
    r.add_argument("--dtype", default=None, help="e.g. bfloat16 (default: the loader's)")
    r.add_argument("--device", default="auto")
    r.add_argument("--no-end-to-end", dest="end_to_end", action="store_false")
    r.add_argument("--json", help="write the results here")
    c = sub.add_parser("criteria", help="time the stopping criteria per step, old against new")
    c.add_argument("tokenizer", help="model folder, .gguf file or HF id whose tokenizer to use")
    c.add_argument("--data", required=True, help="GSM8K test JSONL (its reference answers are the continuations)")
    c.add_argument("--batch-sizes", type=ints, default=[64, 256, 512, 1319])
    c.add_argument("--steps", type=int, default=256)
    c.add_argument("--prompt-tokens", type=int, default=160)
    c.add_argument("--old-rev", default=OLD_REV)
    c.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    (run if args.mode == "run" else criteria)(args)


if __name__ == "__main__":
    main()

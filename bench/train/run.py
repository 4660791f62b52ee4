"""Does a compacted prompt turn into real training savings?

Trains the same model, from the same initial weights, with the same settings, on the same examples
twice: once on BRIDGE-compacted rows (kept prompt tokens + full response) and once on the rows
uncompacted (the whole prompt + the same response and supervision). Reports tokens/s, wall time,
the executed-token ratio and the time ratio; the time ratio should track the token ratio.

    python bench/train/run.py                                   # CPU: tiny random model, ~1-2 min
    python bench/train/run.py --preset gpu                      # GPU: Llama-3.2-1B shape, bf16
    python bench/train/run.py --preset gpu --shape smollm2-135m # GPU: SmolLM2-135M shape
    python bench/train/run.py --stream closed.bridge            # a real selection (select/close output)
    python bench/train/run.py --model runs/warmup/checkpoint    # real weights instead of a shape

Selections: by default every example keeps ceil(rho_p |P|) prompt tokens and supervises
ceil(rho_r |R|) response tokens chosen at random (the cost of a step depends on the budgets,
not on which tokens were chosen); --stream takes the selection of a bridge stream instead.
Weights: random, in the shape of a real model (the tokenizer is the real one; the vocabulary is
the tokenizer's). Both runs use the training loop of `bridge train` (packing, Z_r, AdamW,
cosine); the first --skip-steps steps of each run (allocator and kernel warm-up) are not timed.

Writes OUT/NAME.json and OUT/NAME.md (default OUT: bench/train/results) and prints the table.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from model_shapes import sizes  # noqa: E402

SHAPES = {
    # name: LlamaConfig keyword arguments (vocab from the tokenizer, or --vocab); the sizes of
    # bench/model_shapes.py's tiny body and real models, with LlamaConfig's default position settings
    "tiny": sizes("tiny-train"),
    **{name: {**sizes(name), "rms_norm_eps": 1e-5} for name in ("smollm2-135m", "smollm2-360m", "llama-3.2-1b")},
}
#: per device, the defaults that --preset sets (each one's flag overrides it)
PRESET_KEYS = "shape rows steps skip_steps device max_tokens_per_batch batch_size grad_accum vocab".split()
PRESETS = {
    name: dict(zip(PRESET_KEYS, values, strict=True))
    for name, values in (
        # CPU: a small body needs a small vocabulary, or the output head (the same supervised positions
        # in both runs) is most of the work; token ids are folded into --vocab (timing only)
        ("cpu", ("tiny", 128, 8, 2, "cpu", 4096, 4, 4, 4096)),
        ("gpu", ("llama-3.2-1b", 4096, 24, 4, "cuda", 32768, 8, 8, None)),
    )
}


def parse(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="defaults for a device (default: gpu when CUDA is visible, else cpu)",
    )
    p.add_argument(
        "--data",
        default=None,
        help="examples, a prompt/response JSONL such as your GSM8K train file (default: the bundled sample)",
    )
    p.add_argument("--stream", default=None, help="a bridge stream at selection/closure stage: use its selection")
    p.add_argument("--rows", type=int, default=None, help="examples to train on (the data is cycled if shorter)")
    p.add_argument("--rho-p", type=float, default=0.5, help="prompt retention for the random selection")
    p.add_argument("--rho-r", type=float, default=0.75, help="response supervision for the random selection")
    p.add_argument("--shape", choices=sorted(SHAPES), default=None, help="random weights of this shape")
    p.add_argument("--model", default=None, help="an HF model folder instead of --shape")
    p.add_argument(
        "--tokenizer", default=None, help="tokenizer folder (default: the embedded SmolLM2 tokenizer, or --model's)"
    )
    p.add_argument("--attn", default="sdpa", help="attention implementation (sdpa, eager, flash_attention_2, ...)")
    p.add_argument("--device", default=None)
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run")
    p.add_argument("--skip-steps", type=int, default=None, help="first steps of each run left out of the timing")
    p.add_argument("--batch-size", type=int, default=None, help="default 8 (gpu preset), 4 (cpu)")
    p.add_argument("--grad-accum", type=int, default=None, help="default 8 (gpu preset), 4 (cpu)")
    p.add_argument(
        "--vocab",
        type=int,
        default=None,
        help="random-weight shapes only: fold token ids into this vocabulary (cpu preset: 4096; 0: the tokenizer's)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument(
        "--max-tokens-per-batch", type=int, default=-1, help="micro-batch token budget (default: the preset's)"
    )
    p.add_argument("--pack-length", type=int, default=None)
    p.add_argument("--packing", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--repeats", type=int, default=1, help="runs of each kind, alternating; medians reported")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", default=str(ROOT / "bench" / "train" / "results"))
    p.add_argument("--name", default=None, help="result file name (default: from shape and device)")
    args = p.parse_args(argv)
    import torch

    preset = PRESETS[args.preset or ("gpu" if torch.cuda.is_available() else "cpu")]
    for k, v in preset.items():
        if k == "max_tokens_per_batch":
            if args.max_tokens_per_batch == -1:
                args.max_tokens_per_batch = v
        elif getattr(args, k) is None:
            setattr(args, k, v)
    if args.max_tokens_per_batch is not None and args.max_tokens_per_batch <= 0:
        args.max_tokens_per_batch = None
    if args.model or args.vocab == 0:
        args.vocab = None
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def default_data() -> Path:
    """The bundled sample: the same examples on every machine unless --data names others."""
    return ROOT / "examples" / "data" / "train.jsonl"


def build_rows(args, tokenizer):
    """(compacted rows, uncompacted rows, stats): the same examples and supervision, the prompt
    compacted or whole."""
    from bridgecli.core.budgets import budget
    from bridgecli.training.rows import compact_row

    rng = np.random.default_rng(args.seed)
    triples = []  # (id, tokens, prompt_keep, supervise)
    if args.stream:
        from bridgecli.format.reader import open_reader
        from bridgecli.steps.compact import supervision_of

        with open_reader(args.stream) as reader:
            for ex in reader:
                if ex.selection is None:
                    raise SystemExit(f"{args.stream}: no selection in this stream (run bridge select first)")
                triples.append((ex.id, ex.tokens, list(ex.selection.prompt_keep), list(supervision_of(ex))))
                if len(triples) >= args.rows:
                    break
        source = str(args.stream)
    else:
        from bridgecli.data.examples import DataOptions, iter_examples

        data = Path(args.data) if args.data else default_data()
        for ex in iter_examples(data, tokenizer, DataOptions(limit=args.rows)):
            P, R = ex.tokens.prompt_positions(), ex.tokens.response_positions()
            keep = sorted(rng.choice(P, budget(args.rho_p, len(P)), replace=False).tolist()) if len(P) else []
            sup = sorted(rng.choice(R, budget(args.rho_r, len(R)), replace=False).tolist()) if len(R) else []
            triples.append((ex.id, ex.tokens, keep, sup))
        source = str(data)
    if not triples:
        raise SystemExit("no examples")
    compacted, full = [], []
    bp = np_ = nr = 0
    for k in range(args.rows):
        id_, tokens, keep, sup = triples[k % len(triples)]
        rid = f"{id_}#{k // len(triples)}"
        compacted.append(compact_row(rid, tokens, keep, sup))
        full.append(compact_row(rid, tokens, tokens.prompt_positions().tolist(), sup))
        bp += len(keep)
        np_ += len(tokens.prompt_positions())
        nr += len(tokens.response_positions())
    stats = {
        "source": source,
        "examples": len(triples),
        "rows": args.rows,
        "selection": "stream" if args.stream else f"random, rho_p={args.rho_p}, rho_r={args.rho_r}",
        "prompt_tokens": np_,
        "prompt_kept": bp,
        "response_tokens": nr,
        "formula_ratio": (bp + nr) / (np_ + nr),
        "executed_ratio_all_rows": sum(len(r.input_ids) for r in compacted) / sum(len(r.input_ids) for r in full),
        "supervised_tokens": sum(r.supervised for r in compacted),
    }
    assert [r.labels[-1] for r in compacted] == [r.labels[-1] for r in full]
    if args.vocab:
        from bridgecli.training.rows import IGNORE, Row

        def fold(r):
            return Row(
                r.id,
                [t % args.vocab for t in r.input_ids],
                [t % args.vocab if t != IGNORE else IGNORE for t in r.labels],
            )

        compacted, full = [fold(r) for r in compacted], [fold(r) for r in full]
        stats["vocab_folded_to"] = args.vocab
    return compacted, full, stats


def make_model(args, vocab: int, device: str):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(args.seed)
    if args.model:
        from bridgecli.modeling.loading import load_model

        return load_model(args.model, device=device, attn_implementation=args.attn)
    config = LlamaConfig(vocab_size=vocab, max_position_embeddings=8192, **SHAPES[args.shape])
    model = AutoModelForCausalLM.from_config(config, attn_implementation=args.attn)
    return model.to(device)


def one_run(args, rows, cfg, vocab, device, pad_id) -> dict:
    import torch

    from bridgecli.training.sft import fit

    model = make_model(args, vocab, device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    res = fit(model, rows, cfg, pad_id=pad_id, device=device, live=False)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    wall = time.perf_counter() - t
    timed = res.history[args.skip_steps :]
    out = {
        "wall_s": wall,
        "timed_steps": len(timed),
        "timed_s": sum(h["step_time"] for h in timed),
        "executed_tokens": sum(h["executed_tokens"] for h in timed),
        "computed_tokens": sum(h["computed_tokens"] for h in timed),
        "supervised_tokens": sum(h["tokens"] for h in timed),
        "micro_batches": sum(h["micro_batches"] for h in timed),
        "final_loss": res.history[-1]["loss"],
        "batching": res.packing_note,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None,
    }
    out["tokens_per_s"] = out["executed_tokens"] / out["timed_s"] if out["timed_s"] else 0.0
    del model, res
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def median_run(runs: list[dict]) -> dict:
    keys = ("wall_s", "timed_s", "tokens_per_s")
    med = dict(runs[0])
    for k in keys:
        med[k] = statistics.median(r[k] for r in runs)
    med["repeats"] = [{k: r[k] for k in keys} for r in runs]
    return med


def markdown(result: dict) -> str:
    c, u, s = result["compacted"], result["uncompacted"], result["summary"]
    lines = [
        f"### bridge train: compacted vs uncompacted ({result['setup']['model']}, {result['setup']['device_name']})",
        "",
        "| rows | executed tokens (timed) | computed tokens | wall s | timed s | tokens/s | micro-batches | final loss |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in (("compacted", c), ("uncompacted", u)):
        lines.append(
            f"| {name} | {r['executed_tokens']:,} | {r['computed_tokens']:,} | {r['wall_s']:.2f} | "
            f"{r['timed_s']:.2f} | {r['tokens_per_s']:,.0f} | {r['micro_batches']} | {r['final_loss']:.4f} |"
        )
    lines += [
        "",
        f"executed-token ratio {s['token_ratio']:.3f} (data: {result['data']['executed_ratio_all_rows']:.3f}; "
        f"(b_p+|R|)/(|P|+|R|) = {result['data']['formula_ratio']:.3f}), time ratio {s['time_ratio']:.3f} "
        f"(wall {s['wall_ratio']:.3f}): time/token {s['time_over_token']:.3f}, "
        f"{'within' if s['within_10pct'] else 'NOT within'} 10%.",
        "",
        f"{result['setup']['batching']}; {result['setup']['steps']} steps of {result['setup']['rows_per_step']} rows, "
        f"first {result['setup']['skip_steps']} untimed; {result['data']['rows']} rows from {result['data']['source']} "
        f"({result['data']['selection']}).",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse(argv)
    import torch

    from bridgecli.modeling.loading import load_tokenizer, resolve_device
    from bridgecli.training.config import SFTConfig

    device = resolve_device(args.device)
    if args.tokenizer and not (Path(args.tokenizer) / "config.json").exists():  # a bare tokenizer folder
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
    else:
        tokenizer = load_tokenizer(args.tokenizer or args.model)
    compacted, full, data_stats = build_rows(args, tokenizer)
    vocab = args.vocab or len(tokenizer)
    pad_id = tokenizer.pad_token_id % vocab
    epochs = -(-args.steps * args.batch_size * args.grad_accum // len(full))  # enough epochs for --steps
    cfg = SFTConfig(
        epochs=epochs,
        lr=2e-5,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        max_steps=args.steps,
        seed=args.seed,
        bf16=device.startswith("cuda"),
        packing=args.packing,
        max_tokens_per_batch=args.max_tokens_per_batch,
        pack_length=args.pack_length,
        gradient_checkpointing=args.gradient_checkpointing,
    )
    # same rows per step, same seed -> both runs see the same examples in the same order
    print(
        f"bench: {len(full)} rows, {args.steps} steps on {device} ({args.model or args.shape}); warming up",
        file=sys.stderr,
    )
    warm = SFTConfig(**{**cfg.__dict__, "max_steps": 2})
    one_run(args, full, warm, vocab, device, pad_id)
    runs = {"compacted": [], "uncompacted": []}
    for rep in range(args.repeats):
        order = ("compacted", "uncompacted") if rep % 2 == 0 else ("uncompacted", "compacted")
        for name in order:
            r = one_run(args, compacted if name == "compacted" else full, cfg, vocab, device, pad_id)
            runs[name].append(r)
            print(
                f"bench: {name} run {rep + 1}: {r['timed_s']:.2f} s timed, {r['tokens_per_s']:,.0f} tokens/s",
                file=sys.stderr,
            )
    c, u = median_run(runs["compacted"]), median_run(runs["uncompacted"])
    token_ratio = c["executed_tokens"] / u["executed_tokens"]
    time_ratio = c["timed_s"] / u["timed_s"]
    result = {
        "setup": {
            "model": args.model or f"{args.shape} (random weights, vocab {vocab})",
            "attn": args.attn,
            "device": device,
            "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu",
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "steps": args.steps,
            "skip_steps": args.skip_steps,
            "rows_per_step": cfg.rows_per_step,
            "max_tokens_per_batch": args.max_tokens_per_batch,
            "pack_length": args.pack_length,
            "bf16": cfg.bf16,
            "batching": c["batching"],
            "repeats": args.repeats,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        "data": data_stats,
        "compacted": c,
        "uncompacted": u,
        "summary": {
            "token_ratio": token_ratio,
            "time_ratio": time_ratio,
            "wall_ratio": c["wall_s"] / u["wall_s"],
            "time_over_token": time_ratio / token_ratio,
            "within_10pct": abs(time_ratio / token_ratio - 1) <= 0.10,
            "speedup": u["timed_s"] / c["timed_s"],
        },
    }
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    name = (
        args.name
        or f"{(Path(args.model).name if args.model else args.shape)}-{'gpu' if device.startswith('cuda') else 'cpu'}"
    )
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    (out / f"{name}.md").write_text(table)
    print(table)
    return result


if __name__ == "__main__":
    main()

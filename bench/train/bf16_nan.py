"""Does cuDNN's attention backward make the bf16 gradients of `bridge train` NaN? (docs/results.md, the 0.5B grid)

    python bench/train/bf16_nan.py --model qwen.gguf --data gsm8k/train.jsonl --out bf16_nan.json      # GPU
    python bench/train/bf16_nan.py --parts kernel                # the attention kernel alone, no model or data
    python bench/train/bf16_nan.py --model qwen.gguf --data gsm8k/train.jsonl --parts plan,lse --device cpu

--parts picks among (default on a GPU: kernel,plan,grads):

- plan: over all steps of the grid's plan (full-SFT rows of the first --rows records, batch 16 x 4, 3 epochs,
  seed --seed), packed at the longest row rounded up to 64 as `bridge train` packs, and padded: how many
  micro-batches carry a mask and are 64 (mod 128) tokens wide, in how many steps, the first step. No model.
- lse: the model in float32 (no autocast) on step 1's first packed micro-batch of that width (else its
  widest): per layer the lowest attention logsumexp of any query row and head and how many (row, head)
  pairs are below -88.7, the largest |hidden state| and |logit|. Runs on the CPU (minutes).

- kernel: scaled_dot_product_attention, bf16, an explicit causal mask, query rows anti-aligned with every key
  (every scaled logit about -120, so every row's logsumexp is below -88.7) at key lengths 575, 576, 577, 640
  and 704; grad_q checked for NaN with cuDNN's kernel allowed and left out (pytorch/pytorch#196678).
- grads: the first --steps optimizer steps of the grid's plan (full-SFT rows of the first --rows records, batch
  16 x 4, seed 42, packed at the longest row rounded up to 64 as `bridge train` packs, or --no-packing), each
  micro-batch through `token_loss_sum` and its backward under bf16 autocast (what accelerate's bf16 mixed
  precision does), once with cuDNN's attention allowed (PyTorch's default) and once inside
  `training_backends()` (what `bridge train` runs in now); per micro-batch its width, whether any gradient is
  NaN or infinite, and the time. The model's weights are reloaded before every pass, so passes are independent.

cuDNN at fault: the allowed passes have non-finite gradients on micro-batches of width 64 (mod 128) and the
left-out passes none. Writes --out (JSON) and prints it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def backends(allow_cudnn: bool):
    import contextlib

    from bridgecli.modeling.sdpa_backends import training_backends

    return contextlib.nullcontext() if allow_cudnn else training_backends()


def kernel_check(device: str) -> list[dict]:
    out = []
    d = 64
    for length in (575, 576, 577, 640, 704):
        for allow in (True, False):
            g = torch.Generator(device=device).manual_seed(0)
            q = torch.randn(1, 1, length, d, device=device, dtype=torch.bfloat16, generator=g) * 0.1
            k = torch.randn(1, 1, length, d, device=device, dtype=torch.bfloat16, generator=g) * 0.1
            v = torch.randn(1, 1, length, d, device=device, dtype=torch.bfloat16, generator=g)
            q[..., 0], k[..., 0] = 1.0, -120 * math.sqrt(d)
            for t in (q, k, v):
                t.requires_grad_()
            mask = torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]
            with backends(allow):
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                o.backward(torch.randn(o.shape, device=device, dtype=o.dtype, generator=g))
            assert q.grad is not None
            bad = int((~torch.isfinite(q.grad)).sum())
            out.append({"length": length, "cudnn_allowed": allow, "grad_q_nonfinite": bad})
    return out


def load_rows(args):
    from bridgecli.data.examples import DataOptions, iter_examples
    from bridgecli.modeling.loading import load_tokenizer
    from bridgecli.training.rows import full_response_row

    tok = load_tokenizer(args.model)
    rows = [full_response_row(ex.id, ex.tokens) for ex in iter_examples(args.data, tok, DataOptions(limit=args.rows))]
    return tok, rows


def plan(rows, args, packing: bool, steps: int | None = None):
    from bridgecli.training.batching import step_plan
    from bridgecli.training.config import SFTConfig

    cfg = SFTConfig(batch_size=16, grad_accum=4, epochs=3, seed=args.seed)
    pack_length = -(-max(len(r.input_ids) for r in rows) // 64) * 64 if packing else None
    return pack_length, step_plan(rows, cfg, packing=packing, pack_length=pack_length)[:steps]


def width(rows, seqs, packing: bool) -> tuple[int, bool]:
    """A micro-batch's width and whether it carries an attention mask (packed: always; padded: unless every
    row has the same length)."""
    lens = [sum(len(rows[i].input_ids) for i in q) for q in seqs]
    return max(lens), packing or min(lens) != max(lens)


def plan_check(rows, args) -> dict:
    out = {}
    for packing in (True, False):
        pack_length, steps = plan(rows, args, packing)
        hits = []  # the step of every micro-batch that carries a mask and is 64 (mod 128) wide
        for s, mbs in enumerate(steps):
            for seqs in mbs:
                w, masked = width(rows, seqs, packing)
                if masked and w % 128 == 64:
                    hits.append(s + 1)
        out["packed" if packing else "padded"] = {
            "pack_length": pack_length,
            "steps": len(steps),
            "micro_batches": sum(len(mbs) for mbs in steps),
            "with_a_mask": sum(width(rows, seqs, packing)[1] for mbs in steps for seqs in mbs),
            "masked_and_64_mod_128": len(hits),
            "steps_with_one": len(set(hits)),
            "first_step": min(hits, default=None),
        }
    return out


def lse_check(model, rows, tok, args) -> dict:
    import transformers.integrations.sdpa_attention as sa
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from bridgecli.training.batching import collate

    _, steps = plan(rows, args, True, 1)
    seqs = max(steps[0], key=lambda q: (width(rows, q, True)[0] % 128 == 64, width(rows, q, True)[0]))
    mb = collate([[rows[i] for i in q] for q in seqs], tok.pad_token_id, packing=True).to(args.device)
    layers: list[dict] = []
    real = sa.sdpa_attention_forward

    def probe(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        with torch.no_grad():
            k = sa.repeat_kv(key.float(), module.num_key_value_groups)
            scores = query.float() @ k.transpose(-1, -2) * (scaling or query.shape[-1] ** -0.5)
            lse = torch.logsumexp(scores.masked_fill(~attention_mask, float("-inf")), -1)  # [lines, heads, tokens]
            per_head = lse.amin(dim=(0, 2))
            layers.append(
                {
                    "layer": module.layer_idx,
                    "min_lse": round(float(per_head.min()), 1),
                    "head": int(per_head.argmin()),
                    "pairs_below_-88.7": int((lse < -88.7).sum()),
                    "max_logit": round(float(scores.masked_fill(~attention_mask, float("-inf")).amax()), 1),
                }
            )
        return real(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)

    ALL_ATTENTION_FUNCTIONS["sdpa"] = probe
    try:
        with torch.no_grad():
            out = model(
                input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False, output_hidden_states=True
            )
    finally:
        ALL_ATTENTION_FUNCTIONS["sdpa"] = real
    for rec, h in zip(layers, out.hidden_states):
        rec["max_abs_hidden_in"] = round(float(h.abs().max()), 1)
    return {
        "shape": list(mb.input_ids.shape),
        "tokens": mb.tokens,
        "max_abs_logit": round(float(out.logits.abs().max()), 1),
        "largest_weights": [
            [n, round(float(p.detach().abs().max()), 1)]
            for n, p in sorted(model.named_parameters(), key=lambda t: -float(t[1].detach().abs().max()))[:3]
        ],
        "layers": layers,
    }


def grads_check(model, rows, tok, args) -> dict:
    from bridgecli.training.batching import collate
    from bridgecli.training.sft import token_loss_sum

    device = args.device
    pack_length, steps = plan(rows, args, args.packing, args.steps)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.train()
    results = []
    for s, mbs in enumerate(steps):
        for m, seqs in enumerate(mbs):
            mb = collate([[rows[i] for i in q] for q in seqs], tok.pad_token_id, packing=args.packing).to(device)
            w = int(mb.input_ids.shape[1])
            rec: dict = {"step": s + 1, "micro_batch": m + 1, "width": w, "width_mod_128": w % 128}
            for allow in (True, False):
                model.load_state_dict(initial)
                model.zero_grad(set_to_none=True)
                t = time.perf_counter()
                with backends(allow):
                    with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16):
                        loss = token_loss_sum(model, mb)
                    loss.backward()
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                finite = bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                key = "cudnn_allowed" if allow else "cudnn_left_out"
                rec[key] = {"loss": float(loss), "finite": finite, "seconds": round(time.perf_counter() - t, 4)}
            results.append(rec)
            print(json.dumps(rec), flush=True)
    bad = {k: [r for r in results if not r[k]["finite"]] for k in ("cudnn_allowed", "cudnn_left_out")}
    return {
        "packing": args.packing,
        "pack_length": pack_length,
        "micro_batches": len(results),
        "width_64_mod_128": sum(r["width_mod_128"] == 64 for r in results),
        "nonfinite": {k: len(v) for k, v in bad.items()},
        "nonfinite_width_64_mod_128": {k: sum(r["width_mod_128"] == 64 for r in v) for k, v in bad.items()},
        "per_micro_batch": results,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="/tmp/models/qwen.gguf")
    ap.add_argument("--data", default="/tmp/data/gsm8k/train.jsonl")
    ap.add_argument("--rows", type=int, default=6773, help="the first N records (the grid trains on 6,773)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--packing", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--parts", help="comma-separated: kernel, plan, lse, grads (default: kernel,plan,grads)")
    ap.add_argument("--out")
    args = ap.parse_args()
    parts = set((args.parts or "kernel,plan,grads").split(","))
    report: dict = {
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "data": {"file": Path(args.data).name, "rows": args.rows, "seed": args.seed},
    }
    if "kernel" in parts:
        report["kernel"] = kernel_check(args.device)
    if parts & {"plan", "lse", "grads"}:
        tok, rows = load_rows(args)
        if "plan" in parts:
            report["plan"] = plan_check(rows, args)
        if parts & {"lse", "grads"}:
            from bridgecli.modeling.loading import load_model

            model = load_model(args.model, device=args.device)
            if "lse" in parts:
                report["lse"] = lse_check(model, rows, tok, args)
            if "grads" in parts:
                report["grads"] = grads_check(model, rows, tok, args)
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

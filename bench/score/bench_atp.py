"""Cost of the ``atp`` scorer (key-gate attribution, one reverse pass through the JVP) against the
default ``bridge`` scorer, side by side on one GPU, same model, examples and direction.

    python bench/score/bench_atp.py --out bench/score/results/atp_cost.json

Random bf16 weights of real shapes (weights do not change the cost). Each scorer scores every
example in length-bucketed batches under its own padded-token budget (``bridge`` at its default
32768; ``atp`` keeps every layer's attention for the reverse pass, so it needs smaller batches:
``--atp-max-tokens``); the ratio is total atp time / total bridge time (median of repeats).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from bench_score import CASES, buckets, direction, make_examples, make_model, timed  # noqa: E402

from bridgecli.modeling.attribution import AttributionScorer  # noqa: E402
from bridgecli.modeling.scoring import BridgeScorer, ScoringContext  # noqa: E402


def run_case(name: str, n: int, bridge_tokens: int, atp_tokens: int, repeats: int, chunks: int) -> dict:
    shape, p_len, r_len = CASES[name]
    model = make_model(shape)
    exs = make_examples(n, p_len, r_len, model.config.vocab_size)
    v = direction(model)
    ctx = ScoringContext(model=model, tokenizer=SimpleNamespace(pad_token_id=0), direction=v, device="cuda")
    bridge = BridgeScorer(ctx)
    atp = AttributionScorer(ScoringContext(model=model, tokenizer=SimpleNamespace(pad_token_id=0), direction=v,
                                           device="cuda", options={"scorer_options": {"chunks": chunks}}))
    b_batches, a_batches = buckets(exs, bridge_tokens), buckets(exs, atp_tokens)
    tokens = sum(len(e.tokens.input_ids) for e in exs)
    torch.cuda.reset_peak_memory_stats()
    t_bridge = timed(lambda: [bridge.score(b) for b in b_batches], repeats)
    mem_bridge = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t_atp = timed(lambda: [atp.score(b) for b in a_batches], repeats)
    mem_atp = torch.cuda.max_memory_allocated()
    med = statistics.median
    out = {"case": name, "examples": n, "tokens": tokens, "chunks": chunks,
           "bridge_max_tokens": bridge_tokens, "atp_max_tokens": atp_tokens,
           "bridge_s": med(t_bridge), "atp_s": med(t_atp), "ratio_atp_over_bridge": med(t_atp) / med(t_bridge),
           "bridge_tokens_per_s": tokens / med(t_bridge), "atp_tokens_per_s": tokens / med(t_atp),
           "peak_mem_bridge_gb": mem_bridge / 2**30, "peak_mem_atp_gb": mem_atp / 2**30, "repeats": repeats}
    print(json.dumps(out), flush=True)
    del model, bridge, atp
    torch.cuda.empty_cache()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="llama-3.2-1b/metamath,llama-3.2-3b/metamath")
    ap.add_argument("--examples", type=int, default=256)
    ap.add_argument("--bridge-max-tokens", type=int, default=32768)
    ap.add_argument("--atp-max-tokens", type=int, default=8192)
    ap.add_argument("--chunks", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/score/results/atp_cost.json")
    args = ap.parse_args(argv)
    rows = [run_case(c, args.examples, args.bridge_max_tokens, args.atp_max_tokens, args.repeats, args.chunks)
            for c in args.cases.split(",")]
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    for r in rows:
        print(f"| {r['case']} | {r['tokens']} | {r['bridge_s']:.2f} | {r['atp_s']:.2f} | "
              f"**{r['ratio_atp_over_bridge']:.2f}** | {r['peak_mem_bridge_gb']:.1f} | {r['peak_mem_atp_gb']:.1f} |")


if __name__ == "__main__":
    main()

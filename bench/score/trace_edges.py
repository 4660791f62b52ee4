#!/usr/bin/env python3
"""How far `bridge score` travels through the package: the distinct call edges between its modules, and
those that cross layers (tests/test_layers.py's LAYERS), in one traced run on a tiny model, and how often
the input file is opened. On the CPU, in this process: a tiny random Llama with the default model's
tokenizer, a warmup run folder made by hand (a random unit direction), the first --examples records of
the bundled sample. The command runs once untraced (imports, caches), then once under a profiler
(sys.setprofile and threading.setprofile: every Python call, on every thread), whose edges are counted:
caller module -> callee module, both of the package, each pair once. Target (issue 42): at most 40
cross-layer edges, the input opened at most twice.

    PYTHONPATH=$PWD/src python bench/score/trace_edges.py --out bench/score/results/trace_edges_cpu.json
    PYTHONPATH=$PWD/src python bench/score/trace_edges.py --list      # every cross-layer edge, with a call
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
from provenance import header, result_parser, write_json  # noqa: E402
from test_layers import LAYERS, LEVEL, part_of  # noqa: E402  (the layers the tests hold the package to)
from tiny import tiny_llama_config, tiny_model  # noqa: E402  (the tests' tiny random Llama)

SAMPLE = ROOT / "examples" / "data" / "train.jsonl"


def make_run(folder: Path) -> Path:
    """A warmup run folder over a tiny random Llama (the default model's tokenizer): a random unit v over
    its last 4 blocks, as tests/test_score_e2e_pipeline.py makes one."""
    import torch

    from bridgecli.artifacts.direction_file import Direction, DirectionMeta, save_direction
    from bridgecli.modeling.loading import load_tokenizer
    from bridgecli.modeling.params import tail_parameters

    tokenizer = load_tokenizer(None)
    model = tiny_model(tiny_llama_config(len(tokenizer), layers=5, hidden=48))  # tests/conftest.py's CLI model
    checkpoint = folder / "checkpoint"
    model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    g = torch.Generator().manual_seed(0)
    v = {n: torch.randn(p.shape, generator=g) for n, p in tail_parameters(model, 4).items()}
    norm = float(torch.sqrt(sum((t**2).sum() for t in v.values())))
    save_direction(Direction({n: t / norm for n, t in v.items()}, DirectionMeta(layers=4, lam=0.2)), folder)
    (folder / "warmup.json").write_text(json.dumps({"base_model": str(checkpoint)}))
    return folder


class Tracer:
    """Package call edges (caller module, callee module) with a call of each, and opens of one path."""

    def __init__(self, watched: Path):
        self.edges: dict[tuple[str, str], str] = {}
        #: (caller module, its function, callee module, its function): the edges between functions
        self.calls: set[tuple[str, str, str, str]] = set()
        self.entered: set[str] = set()
        self.watched = str(watched)
        self.opens = 0
        self.on = False

    def profile(self, frame, event, arg) -> None:
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        if not callee.startswith("bridgecli"):
            return
        self.entered.add(callee)
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back is not None else ""
        if caller.startswith("bridgecli") and caller != callee:
            back = frame.f_back
            self.calls.add((caller, back.f_code.co_qualname, callee, frame.f_code.co_qualname))
            self.edges.setdefault((caller, callee), f"{back.f_code.co_name} -> {frame.f_code.co_name}")

    def audit(self, event: str, args) -> None:
        if self.on and event == "open" and args and str(args[0]) == self.watched:
            self.opens += 1

    def __enter__(self) -> "Tracer":
        self.on = True
        threading.setprofile(self.profile)
        sys.setprofile(self.profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        self.on = False


def layer(module: str) -> int:
    return LEVEL[part_of(module)]


def main() -> None:
    ap = result_parser(__doc__ or "", None)
    ap.add_argument("--examples", type=int, default=12)
    ap.add_argument("--list", action="store_true", help="print every cross-layer edge with one call of it")
    args = ap.parse_args()
    from bridgecli.cli.app import app

    with tempfile.TemporaryDirectory(prefix="bridge-trace-") as tmp:
        tmp = Path(tmp)
        run = make_run(tmp / "run")
        data = tmp / "data.jsonl"
        data.write_text("".join(SAMPLE.read_text().splitlines(keepends=True)[: args.examples]))
        argv = ["score", str(data), "--from", str(run), "-o", str(tmp / "out.bridge"), "--device", "cpu"]
        app(argv, prog_name="bridge", standalone_mode=False)  # imports, caches: not counted
        tracer = Tracer(data)
        sys.addaudithook(tracer.audit)
        with tracer:
            app(argv, prog_name="bridge", standalone_mode=False)
    cross = {e: call for e, call in tracer.edges.items() if layer(e[0]) != layer(e[1])}
    upward = sorted(f"{a} -> {b}" for a, b in cross if layer(a) < layer(b))
    by_layers = Counter(f"{LAYERS[layer(a)][0]} -> {LAYERS[layer(b)][0]}" for a, b in cross)
    result = {
        **header("cpu"),
        "examples": args.examples,
        "modules_entered": len(tracer.entered),
        "module_edges": len(tracer.edges),
        "cross_layer_edges": len(cross),
        "function_edges": len(tracer.calls),
        "cross_layer_function_edges": sum(layer(a) != layer(b) for a, _, b, _ in tracer.calls),
        "input_opens": tracer.opens,
        "cross_layer_edges_by_layers": dict(sorted(by_layers.items())),
        "upward_calls": upward,  # a lower layer calling a higher one: callbacks handed down
        "cross_layer": sorted(f"{a} -> {b}  ({call})" for (a, b), call in cross.items()),
        "cross_layer_functions": sorted(
            f"{a}.{fa} -> {b}.{fb}" for a, fa, b, fb in tracer.calls if layer(a) != layer(b)
        ),
    }
    print(
        f"modules entered {result['modules_entered']}, module edges {result['module_edges']} "
        f"({result['cross_layer_edges']} across layers), function edges {result['function_edges']} "
        f"({result['cross_layer_function_edges']} across layers), input opened {result['input_opens']} times"
    )
    for line in result["cross_layer_functions"] if args.list else ():
        print(" ", line)
    write_json(args.out, result)


if __name__ == "__main__":
    main()

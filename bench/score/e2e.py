"""`bridge score` end to end, as a user waits for it, against a plain bf16 forward process.

    python bench/score/e2e.py --data gsm8k/train.jsonl --tokenizer TOKENIZER_DIR \
        --out bench/score/results/e2e_h100.json [--shapes llama-3.2-1b,llama-3.2-3b] [--profile]

For every shape (bench_score.py's: real models' Llama configs from bench/model_shapes.py, random bf16
weights, the given tokenizer; vocabulary of the real shape unless ``--vocab tokenizer``) it writes a
model folder and a warmup run folder (a random unit v over the final 4 blocks), takes the first
``--n`` records of the data, and times three separate processes, wall clock of the whole command:

1. ``forward``: e2e_forward.py, a plain bf16 forward process (load the model, tokenise the same
   records with the same chat template and max length as ``bridge score``, length-bucketed batches
   of the same windows and limits, ``model(...).logits`` under no_grad);
2. ``score_first``: ``python -m bridgecli score DATA --from RUN -o OUT`` with empty compile caches
   (inductor, Triton and autotuning caches in fresh folders: a new machine);
3. ``score_second``: the same command again, the caches now warm (later runs).

It reads the scorer's own summary from stderr ("scoring took X s ... after the first window, which
took Y s") and reports process seconds, the ratio to the forward process, the first window and the
loop's tokens/s after it, and whether the two scoring runs wrote the same bytes. ``--profile`` then
runs e2e_profile.py: torch.profiler over a few windows of the scoring loop (after the first), with
the top ops by CUDA and CPU time and the GPU's idle share, written as small text/JSON files.
``--src`` runs the scorer from another checkout's ``src`` (a baseline, same machine);
``--score-args`` adds arguments to both scoring commands (``--score-args "--scorer atp"``: the
whole command with another scorer).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))  # model_shapes

SUMMARY = re.compile(
    r"scoring took ([\d.]+) s for (\d+) tokens \(([\d,]+) tokens/s(?:, rank \d+)?"
    r"(?:; ([\d,]+) tokens/s after the first window, which took ([\d.]+) s)?\)"
)


def shapes() -> dict:
    from bench_score import SHAPES
    from model_shapes import TINY

    return {**SHAPES, "tiny": TINY["tiny-score"]}  # tiny: for CPU runs of this script and host_profile.py


def build(shape: str, tok_dir: str, folder: Path, device: str, vocab: str = "shape") -> Path:
    """A warmup run folder for ``shape``: checkpoint/ (random bf16 weights, the tokenizer), a random
    unit direction over the final 4 blocks, warmup.json. Kept when already built the same way."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from bridgecli.artifacts.direction_file import Direction, DirectionMeta, save_direction
    from bridgecli.modeling.params import tail_parameters

    run = folder / "run"
    stamp = {"shape": shape, "tokenizer": str(Path(tok_dir).resolve()), "vocab": vocab, "version": 1}
    marker = folder / "built.json"
    if marker.exists() and json.loads(marker.read_text()) == stamp:
        return run
    shutil.rmtree(folder, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    cfg_kw = dict(shapes()[shape])
    if vocab == "tokenizer" or cfg_kw["vocab_size"] < len(tok):
        cfg_kw["vocab_size"] = len(tok)
    cfg = LlamaConfig(
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        **cfg_kw,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    (run / "checkpoint").mkdir(parents=True)
    model.save_pretrained(run / "checkpoint")
    tok.save_pretrained(run / "checkpoint")
    g = torch.Generator(device=device).manual_seed(1)
    v = {n: torch.randn(p.shape, generator=g, device=device) for n, p in tail_parameters(model, 4).items()}
    norm = float(torch.sqrt(sum((t.double() ** 2).sum() for t in v.values())))
    save_direction(Direction({n: (t / norm).cpu() for n, t in v.items()}, DirectionMeta(layers=4, lam=0.2)), run)
    (run / "warmup.json").write_text(json.dumps({"base_model": str(run / "checkpoint")}))
    del model, v
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    marker.write_text(json.dumps(stamp))
    return run


def head(src: str, dst: Path, n: int) -> Path:
    lines = []
    with open(src, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                lines.append(line if line.endswith("\n") else line + "\n")
                if len(lines) == n:
                    break
    dst.write_text("".join(lines), encoding="utf-8")
    return dst


def timed(cmd: list[str], env: dict, log: Path, timeout: float) -> tuple[float, str, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    log.write_text(f"$ {' '.join(cmd)}\n--- stdout\n{proc.stdout[-20000:]}\n--- stderr\n{proc.stderr[-20000:]}")
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[2:4]} failed ({proc.returncode}); see {log}:\n{proc.stderr[-3000:]}")
    return wall, proc.stdout, proc.stderr


def summary(stderr: str) -> dict:
    m = SUMMARY.search(stderr)
    if not m:
        return {}
    num = lambda s: float(s.replace(",", "")) if s else None  # noqa: E731
    return {
        "loop_s": num(m[1]),
        "tokens": int(m[2]),
        "loop_tokens_per_s": num(m[3]),
        "after_first_tokens_per_s": num(m[4]),
        "first_window_s": num(m[5]),
    }


TIMING = re.compile(r"^bridge: timing: (.+) at ([\d.]+) s$", re.M)


def timings(stderr: str) -> dict:
    """The scorer's BRIDGE_TIMINGS marks: seconds since bridgecli was imported, by label."""
    return {label: float(t) for label, t in TIMING.findall(stderr)}


def after_header(path: Path) -> bytes:
    """The stream's bytes after the preamble and the header's zstd frame (the header holds a time)."""
    import zstandard

    from bridgecli.format.spec import PREAMBLE

    data = path.read_bytes()[PREAMBLE.size :]
    dobj = zstandard.ZstdDecompressor().decompressobj()
    dobj.decompress(data)
    return dobj.unused_data


def child_env(base: dict, src: str | None, caches: Path | None, extra: list[str] = ()) -> dict:
    env = {**base, "BRIDGE_NO_PROGRESS": "1", "PYTHONUNBUFFERED": "1", "BRIDGE_TIMINGS": "1"}
    env.update(kv.split("=", 1) for kv in extra)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(src).resolve()), env.get("PYTHONPATH", "")])
    if caches is not None:  # every compile cache in one folder: empty = a new machine
        env["BRIDGE_CACHE"] = str(caches / "bridge")
        env["TORCHINDUCTOR_CACHE_DIR"] = str(caches / "inductor")
        env["TRITON_CACHE_DIR"] = str(caches / "triton")
        env["XDG_CACHE_HOME"] = str(caches / "xdg")
    return env


def score_args(data: Path, run: Path, out: Path, limits: list[str]) -> list[str]:
    """``-m bridgecli score`` of ``data`` with the warmup run ``run`` into ``out``: the arguments after
    the interpreter (and any module it runs the command under)."""
    return ["-m", "bridgecli", "score", str(data), "--from", str(run), "-o", str(out), *limits]


def run_shape(shape: str, args, data: Path, env0: dict, log_dir: Path) -> dict:
    import torch

    t0 = time.perf_counter()
    folder = Path(args.work) / shape
    run = build(shape, args.tokenizer, folder, args.device, args.vocab)
    res: dict = {"shape": shape, "build_s": round(time.perf_counter() - t0, 1)}
    caches = folder / "caches"
    # the default model's converted copy (if any) is not needed: the run folder is a plain HF folder
    py = sys.executable
    limits = ["--window", str(args.window), "--batch-size", str(args.batch_size), "--max-tokens", str(args.max_tokens)]
    if "forward" in args.runs:
        env = child_env(env0, None, None)
        wall, out, _ = timed(
            [
                py,
                str(HERE / "e2e_forward.py"),
                "--model",
                str(run / "checkpoint"),
                "--data",
                str(data),
                "--device",
                args.device,
                *limits,
            ],
            env,
            log_dir / f"{shape}-forward.log",
            args.timeout,
        )
        res["forward"] = {"process_s": round(wall, 2), **json.loads(out.strip().splitlines()[-1])}
    outs = {}
    for name in ("score_first", "score_second"):
        if name not in args.runs:
            continue
        if name == "score_first":
            shutil.rmtree(caches, ignore_errors=True)
        env = child_env(env0, args.src, caches, args.score_env)
        outs[name] = folder / f"{name}.bridge"
        outs[name].unlink(missing_ok=True)
        cmd = [py, *score_args(data, run, outs[name], limits), *shlex.split(args.score_args)]
        wall, _, err = timed(cmd, env, log_dir / f"{shape}-{name}.log", args.timeout)
        r = {"process_s": round(wall, 2), **summary(err), "timings": timings(err)}
        if "forward" in res:
            r["ratio_to_forward"] = round(wall / res["forward"]["process_s"], 3)
        res[name] = r
    if len(outs) == 2:
        res["same_bytes_after_header"] = after_header(outs["score_first"]) == after_header(outs["score_second"])
    if args.profile:
        env = child_env(env0, args.src, caches, args.score_env)
        prof_dir = Path(args.profile_dir) / shape
        wall, out, _ = timed(
            [
                py,
                str(HERE / "e2e_profile.py"),
                "--from",
                str(run),
                "--data",
                str(data),
                "--windows",
                str(args.profile_windows),
                "--out",
                str(prof_dir),
                *limits,
            ],
            env,
            log_dir / f"{shape}-profile.log",
            args.timeout,
        )
        res["profile"] = {"process_s": round(wall, 2), **json.loads(out.strip().splitlines()[-1])}
    if args.cprofile:
        res["cprofile"] = cprofile_run(shape, args, run, data, caches, env0, log_dir, limits)
    for f in outs.values():
        f.unlink(missing_ok=True)
    if torch.cuda.is_available():
        res["device"] = torch.cuda.get_device_name()
    return res


def cprofile_run(shape, args, run, data, caches, env0, log_dir, limits) -> dict:
    """A later run under cProfile (the main thread only; profiling slows Python-heavy work such as
    dynamo's tracing about 1.5x): the top 60 functions by cumulative time, as text beside the report."""
    import pstats

    env = child_env(env0, args.src, caches, args.score_env)
    prof_dir = Path(args.profile_dir) / shape
    prof_dir.mkdir(parents=True, exist_ok=True)
    pfile = prof_dir / "score_later.prof"
    out = Path(args.work) / shape / "cprofile.bridge"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "cProfile", "-o", str(pfile), *score_args(data, run, out, limits)]
    wall, _, err = timed(cmd, env, log_dir / f"{shape}-cprofile.log", args.timeout)
    out.unlink(missing_ok=True)
    import io

    buf = io.StringIO()
    pstats.Stats(str(pfile), stream=buf).sort_stats("cumulative").print_stats(60)
    (prof_dir / "score_later_cumulative.txt").write_text(buf.getvalue())
    return {"process_s": round(wall, 2), **summary(err), "timings": timings(err), "listing": str(prof_dir)}


def table(rows: list[dict]) -> str:
    lines = [
        "| shape | forward process s (loop tok/s) | score, first run s (ratio) | first window s | "
        "tok/s after it | score, later run s (ratio) | first window s | tok/s after it | same bytes |",
        "|" + "---|" * 9,
    ]
    f = lambda x, d=1: "-" if x is None else f"{x:,.{d}f}"  # noqa: E731
    for r in rows:
        fw = r.get("forward", {})
        cells = [r["shape"], f"{f(fw.get('process_s'))} ({f(fw.get('loop_tokens_per_s'), 0)})"]
        for k in ("score_first", "score_second"):
            s = r.get(k, {})
            cells += [
                f"{f(s.get('process_s'))} ({f(s.get('ratio_to_forward'), 2)}x)",
                f(s.get("first_window_s")),
                f(s.get("after_first_tokens_per_s"), 0),
            ]
        cells.append(str(r.get("same_bytes_after_header", "-")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="GSM8K-style JSONL (the first --n records are used)")
    ap.add_argument("--tokenizer", required=True, help="tokenizer folder (save_pretrained of the default model's)")
    ap.add_argument("--shapes", default="llama-3.2-1b,llama-3.2-3b")
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--runs", default="forward,score_first,score_second")
    ap.add_argument("--window", type=int, default=256, help="as bridge score's --window (default: its default)")
    ap.add_argument("--batch-size", type=int, default=None, help="default: bridge score's default")
    ap.add_argument("--max-tokens", type=int, default=None, help="default: 32768 on a GPU, 4096 on CPU")
    ap.add_argument("--vocab", choices=("shape", "tokenizer"), default="shape")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--src", default=None, help="run the scorer from this src/ folder (a baseline checkout)")
    ap.add_argument(
        "--score-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment of the scoring processes (repeatable), e.g. BRIDGE_COMPILE=0",
    )
    ap.add_argument(
        "--score-args",
        default="",
        metavar="ARGS",
        help="more bridge score arguments, e.g. '--scorer atp --scorer-option fast=1'",
    )
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--cprofile",
        action="store_true",
        help="one more later run under cProfile: where a warm process's time goes (first window)",
    )
    ap.add_argument("--profile-windows", type=int, default=3)
    ap.add_argument("--profile-dir", default=None, help="default: next to --out, <out stem>_profile/")
    ap.add_argument("--work", default="/tmp/bridge-e2e")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default="bench/score/results/e2e.json")
    args = ap.parse_args(argv)
    from bridgecli.steps.options import ScoreOptions

    defaults = ScoreOptions(data="")
    args.batch_size = args.batch_size or defaults.batch_size
    args.max_tokens = args.max_tokens or (32768 if args.device.startswith("cuda") else 4096)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    args.profile_dir = args.profile_dir or str(out.with_name(out.stem + "_profile"))
    log_dir = Path(args.work) / "logs"
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    data = head(args.data, Path(args.work) / f"data_{args.n}.jsonl", args.n)
    env0 = dict(os.environ)
    rows = []
    for shape in args.shapes.split(","):
        t0 = time.perf_counter()
        try:
            r = run_shape(shape, args, data, env0, log_dir)
        except Exception as exc:  # keep what the other shapes measured
            r = {"shape": shape, "error": str(exc)[-3000:]}
        r["shape_total_s"] = round(time.perf_counter() - t0, 1)
        r.update(
            examples=args.n,
            window=args.window,
            batch_size=args.batch_size,
            max_tokens=args.max_tokens,
            src=args.src or "this checkout",
            score_env=args.score_env,
        )
        rows.append(r)
        print(json.dumps(r), flush=True)
        out.write_text(json.dumps(rows, indent=2) + "\n")  # after every shape: a timeout keeps the rest
    # one file with every child process's command, stdout and stderr tails
    with open(out.with_suffix(".log"), "w") as fh:
        for f in sorted(log_dir.glob("*.log")):
            fh.write(f"===== {f.name}\n{f.read_text()}\n")
    print(table(rows))


if __name__ == "__main__":
    main()

"""`bridge train` under FSDP (and DDP) on several GPUs against one GPU, and an FSDP kill + --resume.

    python bench/train/fsdp_check.py --data data/gsm8k/train.jsonl --gpus 2 --out fsdp.json

Tokenises the first --rows examples (whole prompt, whole response supervised), then trains the
same model from the same weights for --steps optimizer steps with the same command:

- one:        one process on GPU 0 (the reference);
- ddp:        torchrun --nproc-per-node N (accelerate's DDP);
- fsdp2/fsdp1: accelerate launch --config_file (FSDP, fsdp_version 2 / 1, full sharding);
- fsdp2-resumed: the fsdp2 run SIGKILLed once its step --steps/2 checkpoint is complete, then
               continued with --resume (sharded checkpoint: every rank reloads its own shard);
- NAME-again: NAME once more, unchanged: how far two identical GPU runs land apart (the noise
               floor the other differences are read against).

--runs picks which (default: all of the above except the -again ones). Reports, per run, the
largest relative loss difference from `one` over the steps, and the final weights' distance from
`one` relative to the size of `one`'s update (||w - w_one|| / ||w_one - w_0||). The resumed run is
compared with the uninterrupted fsdp2 run, and NAME-again with NAME, the same way. Writes --out
(JSON) and prints it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from provenance import header, result_parser, settings, write_json  # noqa: E402

FSDP_YAML = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
num_processes: {n}
mixed_precision: bf16
fsdp_config:
  fsdp_version: {version}
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_cpu_ram_efficient_loading: false
  fsdp_reshard_after_forward: true
{extra}"""
V1_EXTRA = """  fsdp_sharding_strategy: FULL_SHARD
  fsdp_use_orig_params: true
  fsdp_sync_module_states: true
"""


def write_rows(data: str, model: str, n: int, path: Path) -> int:
    from bridgecli.data.examples import DataOptions, iter_examples
    from bridgecli.modeling.loading import load_tokenizer
    from bridgecli.training.rows import compact_row

    tok = load_tokenizer(model)
    lines = []
    for ex in iter_examples(Path(data), tok, DataOptions(limit=n)):
        t = ex.tokens
        row = compact_row(ex.id, t, t.prompt_positions().tolist(), t.response_positions().tolist())
        lines.append(json.dumps({"id": row.id, "input_ids": list(row.input_ids), "labels": list(row.labels)}))
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


def saved(folder: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}


def initial_weights(model: str) -> dict:
    import torch

    from bridgecli.modeling.loading import load_model

    return {k: v.float() for k, v in load_model(model, dtype=torch.float32).state_dict().items()}


def distance(a: dict, b: dict) -> float:
    """||a - b|| over the tensors both hold (a tied lm_head is saved once, as the embedding)."""
    keys = sorted(a.keys() & b.keys())
    if not keys:
        raise SystemExit("no common weights to compare")
    return sum(float((a[k] - b[k]).double().pow(2).sum()) for k in keys) ** 0.5


def losses(folder: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]


def killed_then_resumed(cmd: list[str], out: Path, step: int, env: dict) -> dict:
    """Start ``cmd`` (fresh), SIGKILL its process group once the step-``step`` checkpoint is complete,
    then run it again with --resume."""
    proc = subprocess.Popen(
        [*cmd, "--overwrite"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    mark = out / "checkpoints" / f"step-{step:06d}" / "trainer_state.json"
    deadline = time.monotonic() + 300
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    killed = proc.poll() is None
    if killed:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    t0 = time.time()
    again = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True)
    run = {"killed_at_checkpoint": killed, "wall_s": round(time.time() - t0, 1), "rc": again.returncode}
    if again.returncode != 0:
        run["error"] = again.stderr[-3000:]
    else:
        run["resumed_from_step"] = json.loads((out / "bridge_train.json").read_text()).get("resumed_from_step")
    return run


def main(argv=None) -> dict:
    ap = result_parser(__doc__, out="fsdp.json")
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--work", default="/tmp/bridge-fsdp")
    ap.add_argument(
        "--runs",
        default="one,ddp,fsdp2,fsdp1,fsdp2-resumed",
        help="comma-separated: one, ddp, fsdp2, fsdp1, fsdp2-resumed, and NAME-again for any of them",
    )
    args = ap.parse_args(argv)
    import torch

    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if "one" not in runs:
        raise SystemExit("--runs must include one (the reference)")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = work / "rows.jsonl"
    n_rows = write_rows(args.data, args.model, args.rows, rows)
    env = {**os.environ, "BRIDGE_NO_PROGRESS": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    train = [
        "-m",
        "bridgecli",
        "train",
        str(rows),
        "--model",
        args.model,
        "--max-steps",
        str(args.steps),
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--grad-accum",
        "8",
        "--seed",
        "3",
        "--lr",
        "1e-4",
    ]
    for v in (1, 2):
        (work / f"fsdp{v}.yaml").write_text(FSDP_YAML.format(n=args.gpus, version=v, extra=V1_EXTRA if v == 1 else ""))
    launch = {
        "one": [sys.executable],
        "ddp": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.gpus)],
        "fsdp2": [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(work / "fsdp2.yaml")],
        "fsdp1": [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(work / "fsdp1.yaml")],
    }
    device = "cuda" if torch.cuda.is_available() else "cpu"
    res: dict = {**header(device), **settings(args, "gpus", "steps", "model"), "rows": n_rows, "runs": {}}
    mid = args.steps // 2
    for name in runs:
        kind = name.removesuffix("-again")
        if kind not in (*launch, "fsdp2-resumed"):
            raise SystemExit(f"--runs: unknown run {name!r}")
        out = work / name
        if kind == "fsdp2-resumed":
            cmd = [*launch["fsdp2"], *train, "-o", str(out), "--save-every", str(mid)]
            res["runs"][name] = killed_then_resumed(cmd, out, mid, env)
        else:
            cmd = [*launch[kind], *train, "-o", str(out), "--overwrite"]
            cmd += ["--save-every", "2"] if kind == "fsdp2" else []
            t0 = time.time()
            proc = subprocess.run(
                cmd, env={**env, "CUDA_VISIBLE_DEVICES": "0"} if kind == "one" else env, capture_output=True, text=True
            )
            res["runs"][name] = {"wall_s": round(time.time() - t0, 1), "rc": proc.returncode}
            if proc.returncode != 0:
                res["runs"][name]["error"] = proc.stderr[-3000:]
        print(name, json.dumps(res["runs"][name])[:400], flush=True)

    ok = {k for k, r in res["runs"].items() if r["rc"] == 0}
    if "one" in ok:
        w1 = saved(work / "one")
        update = distance(w1, initial_weights(args.model))
        res["update_norm_one"] = update
        res["runs"]["one"]["losses"] = losses(work / "one")
        for name in [r for r in runs if r in ok and r != "one"]:
            base = (
                name.removesuffix("-again")
                if name.endswith("-again")
                else "fsdp2"
                if name == "fsdp2-resumed"
                else "one"
            )
            if base not in ok:
                continue
            lb, ln = losses(work / base), losses(work / name)
            wb = w1 if base == "one" else saved(work / base)
            r = res["runs"][name]
            r["compared_with"] = base
            r["same_step_count"] = len(lb) == len(ln)
            r["max_rel_loss_diff"] = max(abs(a - b) / abs(b) for a, b in zip(ln, lb))
            r["weight_diff_rel_to_update"] = distance(saved(work / name), wb) / update
    print(json.dumps(res, indent=2))
    write_json(args.out, res)
    return res


if __name__ == "__main__":
    main()

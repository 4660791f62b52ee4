"""Every numeric flag of every command, given values it must refuse and values at its edges: how many
runs end in a traceback, in exit 0 on a value the flag's declared range refuses, or in exit 0 with an
output that does not read back (a NaN or infinity in it).

The commands run in this process (Typer's CliRunner) on a small pipeline made first: a tiny random
Llama with the real tokenizer, a few lines of the bundled sample data, a warmup run, its scores, a
selection, a closure, rows and an eval file. Each flag of each command's options type that holds a
number (ints, floats, the retention list of ``analyze shift``, and a few ``--option`` /
``--scorer-option`` keys) is given each of :data:`VALUES` in turn, on top of a quick base command
that succeeds. A value the flag's declared range (``optionspec.Range``) refuses must end in exit 2
with one line; one it accepts may run, and then its output must read back (streams through the
reader, JSON without NaN or infinities, run folders with a finite loss).

    python bench/fuzz/flags.py -o bench/fuzz/results/flags.json     # about 10-20 minutes on 2 cores

The counts, with the commit, the date and the command, are printed and written with ``-o``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
import typing
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # the tiny model and the sample data of the test suite
sys.path.insert(0, str(ROOT / "bench"))
from provenance import finish, stamp  # noqa: E402

VALUES = ["nan", "inf", "-inf", "1e999", "-1", "0", "-0", "1e-320", "1.5", str(2**70), "abc", ""]
#: seconds one run may take (an accepted value runs the command for real)
RUN_LIMIT = 300


def _inputs(folder: Path) -> dict[str, str]:
    """The small pipeline every command reads from; its paths by name."""
    from typer.testing import CliRunner

    from bridgecli.cli.app import app
    from bridgecli.modeling.loading import load_tokenizer
    from tiny import sample_inputs, tiny_llama_config, tiny_model

    tok = load_tokenizer(None)
    model = folder / "model"
    tiny_model(tiny_llama_config(len(tok), layers=5, hidden=48)).save_pretrained(model)  # as tests/conftest.py
    tok.save_pretrained(model)
    sample_inputs(folder, warm=4, val=2, data=4, test=2)
    w = {"w": str(folder), "model": str(model)}
    steps = [
        f"warmup {folder}/warm.jsonl --val {folder}/val.jsonl --model {model} --max-steps 1 --batch-size 4 "
        f"-o {folder}/warm",
        f"score {folder}/data.jsonl --from {folder}/warm -o {folder}/scores.bridge",
        f"select {folder}/scores.bridge -o {folder}/sel.bridge",
        f"close {folder}/sel.bridge -o {folder}/closed.bridge",
        f"compact {folder}/closed.bridge -o {folder}/rows.jsonl",
    ]
    for line in steps:
        result = CliRunner().invoke(app, line.split(), env=ENV)
        assert result.exit_code == 0, (line, result.output)
    return w


ENV = {"BRIDGE_NO_PROGRESS": "1", "COLUMNS": "200"}

#: command -> (its options type's import path, a quick run of it that succeeds; {out} is a fresh output)
COMMANDS = {
    "warmup": (
        "WarmupOptions",
        "warmup {w}/warm.jsonl --val {w}/val.jsonl --model {model} --max-steps 1 --batch-size 4 -o {out}",
    ),
    "score": ("ScoreOptions", "score {w}/data.jsonl --from {w}/warm -o {out}"),
    "merge": ("MergeOptions", "merge {w}/scores.bridge -o {out}"),
    "reference": ("ReferenceOptions", "reference {w}/scores.bridge --model {model} -o {out}"),
    "select": ("SelectOptions", "select {w}/scores.bridge -o {out}"),
    "select importance": ("SelectOptions", "select {w}/scores.bridge --preset importance-loss-resp -o {out}"),
    "close": ("CloseOptions", "close {w}/sel.bridge -o {out}"),
    "compact": ("CompactOptions", "compact {w}/closed.bridge -o {out}"),
    "train": ("TrainOptions", "train {w}/rows.jsonl --model {model} --max-steps 1 --batch-size 2 -o {out}"),
    "eval": (
        "EvalRunOptions",
        "eval {model} --task gsm8k --data {w}/test.jsonl --max-new-tokens 2 --batch-size 2 -o {out}.json",
    ),
    "inspect": ("InspectOptions", "inspect {w}/closed.bridge --stats"),
    "show": ("ShowOptions", "show {w}/closed.bridge"),
    "analyze fidelity": (
        "FidelityOptions",
        "analyze fidelity {w}/data.jsonl --from {w}/warm --n 2 --first --batch-size 2 --device cpu -o {out}.json",
    ),
    "analyze shift": (
        "ShiftOptions",
        "analyze shift {w}/data.jsonl --from {w}/warm --n 2 --first --batch-size 2 --device cpu "
        "--levels 0.5,1 -o {out}.json",
    ),
    "analyze robustness": ("RobustnessOptions", "analyze robustness {w}/scores.bridge -o {out}.json"),
}

#: numbers passed through KEY=VALUE flags: (command, flag, key, its check)
KEYED = [
    ("select", "--option", "seed", lambda v: float(v).is_integer() and 0 <= float(v) <= 2**32 - 1),
    ("select importance", "--option", "floor", lambda v: 0 <= float(v) <= 1),
    ("select", "--option", "rounds", lambda v: float(v).is_integer() and 1 <= float(v) <= 10_000),
    ("score", "--scorer-option", "chunks", None),  # the bridge scorer takes no option: any value is refused
]


@dataclasses.dataclass
class Flag:
    flag: str
    integer: bool
    spec: typing.Any  # optionspec.Spec
    listed: bool = False  # a comma-separated list of numbers (analyze shift --levels)


def numeric_flags(cls: type) -> list[Flag]:
    """The flags of ``cls`` (and of the groups in it) that hold a number."""
    from bridgecli.optionspec import Group

    out: list[Flag] = []

    def walk(kind: type, group: Group) -> None:
        hints = typing.get_type_hints(kind)
        for f in group.fields(kind):
            if "group" in f.metadata:
                tp = hints[f.name]
                args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
                walk(args[0], f.metadata["group"])
                continue
            spec = f.metadata["option"]
            tp = hints[f.name]
            base = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_args(tp) else [tp]
            longs = [x.split("/")[0] for x in spec.flags if x.startswith("--")]
            flag = longs[0] if longs else "--" + f.name.replace("_", "-")
            if spec.argument:
                continue
            if base and base[0] in (int, float) and base[0] is not bool:
                out.append(Flag(flag, base[0] is int, spec))
            elif typing.get_origin(tp) is tuple and typing.get_args(tp)[0] is float:
                out.append(Flag(flag, False, spec, listed=True))

    walk(cls, Group())
    return out


#: values a flag's range refuses that it takes by design, as its help says: (flag, value)
DOCUMENTED = {("--keep-checkpoints", "0"), ("--keep-checkpoints", "-0")}  # "0: all"


def valid(flag: Flag, text: str) -> bool:
    """Whether the flag's declaration takes ``text``."""
    from bridgecli.errors import UsageError

    if (flag.flag, text) in DOCUMENTED:
        return True
    try:
        value: typing.Any = int(text) if flag.integer else float(text)
    except ValueError:
        return False
    if flag.listed:  # retention ratios, 0 excluded
        return math.isfinite(value) and 0 < value <= 1
    if flag.spec.range is not None:
        try:
            flag.spec.range.check(flag.flag, value)
        except UsageError:
            return False
        return True
    return flag.integer or math.isfinite(value)


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


def run_one(argv: list[str]) -> tuple[str, str]:
    """(outcome, the last line of the output) of ``bridge ARGV`` in this process."""
    from typer.testing import CliRunner

    from bridgecli.cli.app import app

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(RUN_LIMIT)
    try:
        result = CliRunner().invoke(app, argv, env=ENV)
    except _Timeout:
        return "timeout", ""
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    text = (result.output or "").strip().splitlines()
    last = text[-1] if text else ""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        if isinstance(result.exception, _Timeout):
            return "timeout", last
        return f"traceback ({type(result.exception).__name__}: {result.exception})"[:300], last
    errors = [line for line in text if "error:" in line]
    if result.exit_code != 0 and len(errors) > 1:
        return f"exit {result.exit_code}, {len(errors)} error lines", last
    return f"exit {result.exit_code}", last


def reads_back(out: Path) -> str | None:
    """None when what a run wrote at ``out`` reads back sound, else why not."""
    from bridgecli.errors import BridgeError
    from bridgecli.format import read_all
    from bridgecli.format.spec import MAGIC

    def strict(text: str) -> None:
        json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} in the JSON")))

    for path in [out, Path(f"{out}.json")]:
        try:
            if path.is_file() and path.suffix == ".json":
                strict(path.read_text())
            elif path.is_file():
                with open(path, "rb") as fh:
                    magic = fh.read(4)
                if magic == MAGIC[:4] or magic[:1] not in (b"{", b"["):
                    try:
                        read_all(path)
                    except BridgeError as err:
                        if "not a bridge stream" not in str(err):
                            return str(err)
                else:
                    for line in path.read_text().splitlines():
                        strict(line)
            elif path.is_dir():
                for name in ("bridge_train.json", "warmup.json"):
                    if (path / name).is_file():
                        strict((path / name).read_text())
        except ValueError as exc:
            return str(exc)
    return None


def sweep(w: dict[str, str], scratch: Path) -> dict:
    from bridgecli.steps import options as option_types

    rows = []
    counter = 0

    def once(command: str, argv: list[str], flag: str, value: str, ok: bool) -> None:
        nonlocal counter
        counter += 1
        out = scratch / f"out-{counter}"
        argv = [a.replace("{out}", str(out)) for a in argv]
        start = time.perf_counter()
        outcome, last = run_one(argv)
        bad_output = reads_back(out) if outcome == "exit 0" else None
        rows.append(
            {
                "command": command,
                "flag": flag,
                "value": value,
                "valid": ok,
                "outcome": outcome,
                "seconds": round(time.perf_counter() - start, 2),
                "said": last[:300],
                **({"bad_output": bad_output} if bad_output else {}),
            }
        )
        for p in scratch.iterdir():
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        print(f"{command:20} {flag:24} {value!r:28} {'ok ' if ok else 'bad'} {outcome}", flush=True)

    for command, (type_name, template) in COMMANDS.items():
        base = [part.format(**w, out="{out}") for part in template.split()]
        for flag in numeric_flags(getattr(option_types, type_name)):
            for value in VALUES:
                argv = list(base)
                if flag.flag in argv:  # the base's own value is replaced
                    at = argv.index(flag.flag)
                    del argv[at : at + 2]
                once(command, argv + [flag.flag, value], flag.flag, value, valid(flag, value))
    for command, flag, key, check in KEYED:
        base = [part.format(**w, out="{out}") for part in COMMANDS[command][1].split()]
        for value in VALUES:
            try:
                ok = bool(check and check(value))
            except ValueError:
                ok = False
            once(command, base + [flag, f"{key}={value}"], f"{flag} {key}=", value, ok)
    return summarize(rows)


def summarize(rows: list[dict]) -> dict:
    outcomes = Counter(r["outcome"].split(" (")[0] for r in rows)
    tracebacks = [r for r in rows if r["outcome"].startswith("traceback")]
    wrong_0 = [r for r in rows if r["outcome"] == "exit 0" and not r["valid"]]
    bad_outputs = [r for r in rows if r.get("bad_output")]
    several = [r for r in rows if "error lines" in r["outcome"]]
    return {
        "runs": len(rows),
        "flags": len({(r["command"], r["flag"]) for r in rows}),
        "commands": len({r["command"] for r in rows}),
        "outcomes": dict(sorted(outcomes.items())),
        "refused_values": sum(1 for r in rows if not r["valid"]),
        "tracebacks": len(tracebacks),
        "wrong_exit_0": len(wrong_0),
        "exit_0_with_a_bad_output": len(bad_outputs),
        "several_error_lines": len(several),
        "timeouts": outcomes.get("timeout", 0),
        "problems": (tracebacks + wrong_0 + bad_outputs + several)[:50],
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, help="write the summary as JSON here")
    parser.add_argument("--only", help="the commands to sweep, comma-separated (default: all)")
    args = parser.parse_args(argv)
    if args.output is not None:
        args.output = args.output.absolute()
    os.environ.setdefault("BRIDGE_NO_PROGRESS", "1")
    if args.only:
        keep = set(args.only.split(","))
        for name in list(COMMANDS):
            if name not in keep:
                del COMMANDS[name]
        KEYED[:] = [k for k in KEYED if k[0] in keep]
    run = stamp("bench/fuzz/flags.py", argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bridge-flags-") as tmp:
        w = _inputs(Path(tmp) / "inputs")
        scratch = Path(tmp) / "scratch"
        scratch.mkdir()
        here = os.getcwd()
        os.chdir(scratch)  # a default output lands here, never in the checkout
        try:
            summary = sweep(w, scratch)
        finally:
            os.chdir(here)
    summary = {**run, "seconds": round(time.perf_counter() - t0, 1), **summary}
    line = (
        f"{summary['runs']} runs over {summary['flags']} numeric flags of {summary['commands']} commands in "
        f"{summary['seconds']} s: {summary['outcomes']}; {summary['tracebacks']} tracebacks, "
        f"{summary['wrong_exit_0']} exit 0 on a refused value, {summary['exit_0_with_a_bad_output']} exit 0 with "
        f"a bad output, {summary['several_error_lines']} with several error lines, {summary['timeouts']} timeouts"
    )
    return finish(line, summary["problems"], summary, args.output, indent=1)


if __name__ == "__main__":
    result = main()
    sys.exit(1 if result["tracebacks"] or result["wrong_exit_0"] or result["exit_0_with_a_bad_output"] else 0)

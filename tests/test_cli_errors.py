"""One error path: every command, given a bad flag value, prints one line `bridge CMD: error: ...`
on stderr (no Click box, no traceback) and exits non-zero, before reading any input or loading a
model. The checks live in steps/, so Python callers of the steps get them too; cli/ only parses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.errors import UsageError

CLI = Path(__file__).resolve().parents[1] / "src" / "bridgecli" / "cli"

# (command words, arguments with one bad value, exit code, what the line names)
BAD = [
    (["warmup"], ["x.jsonl", "--val", "v.jsonl", "--lambda", "-1"], 2, "--lambda"),
    (["warmup"], ["x.jsonl", "--warm-fraction", "1"], 2, "--warm-fraction"),
    (["score"], ["x.jsonl", "--batch-size", "0"], 2, "--batch-size"),
    (["score"], ["x.jsonl", "--dtype", "int8"], 2, "--dtype"),
    (["merge"], ["a.bridge", "-o"], 2, "-o"),
    (["merge"], ["a.bridge", "--workers", str(2**70)], 2, "--workers"),  # was lowered to the CPU count unseen
    (["reference"], ["x.bridge", "--tokenizer-check", "loose"], 2, "--tokenizer-check"),
    (["select"], ["x.bridge", "--rho-p", "1.5"], 2, "--rho-p"),
    (["select"], ["x.bridge", "--rho-r", "abc"], 2, "--rho-r"),
    (["select"], ["x.bridge", "-T", "0"], 2, "-T/--rounds"),
    (["select"], ["x.bridge", "--option", "seed"], 2, "--option"),
    (["select"], ["x.bridge", "--method", "random", "--option", "seed=-5"], 2, "--option seed"),
    (["select"], ["x.bridge", "--workers", "0"], 2, "--workers"),
    (["select"], ["x.bridge", "--option", "rounds=9"], 2, "-T/--rounds"),  # -T won over it unseen
    (["close"], ["x.bridge", "--alpha", "2"], 2, "--alpha"),
    (["compact"], ["x.bridge", "--format", "csv"], 2, "--format"),
    (["train"], ["x.jsonl", "--epochs", "0"], 2, "--epochs"),
    (["train"], ["x.jsonl", "--resume", "--overwrite"], 2, "--resume and --overwrite"),
    (["train"], ["x.jsonl", "--lora", "--lora-r", "0"], 2, "--lora-r"),
    (["train"], ["x.jsonl", "--lora-dropout", "nan"], 2, "--lora-dropout applies only with --lora"),
    (["train"], ["x.jsonl", "--lora", "--lora-targets", ""], 2, "--lora-targets"),
    (["train"], ["x.jsonl", "--max-length", "0"], 2, "--max-length"),
    (["eval"], ["runs/x", "--few-shot", "-1"], 2, "--few-shot"),
    (["eval"], ["runs/x", "--task", ","], 2, "--task"),
    (["eval"], ["runs/x", "--dtype", "int8"], 2, "--dtype must be one of float32, bfloat16, float16, float64"),
    (["compare"], ["runs/x", "--target"], 2, "--target"),
    (["inspect"], ["x.bridge", "--png"], 2, "--png"),
    (["show"], ["x.bridge", "--index", "first"], 2, "--index"),
    (["plugins"], ["--verbose"], 2, "--verbose"),
    (["analyze", "fidelity"], ["x.jsonl", "--n", "0"], 2, "--n"),
    (["analyze", "fidelity"], ["x.jsonl", "--dtype", "float16"], 2, "--dtype"),
    (["analyze", "shift"], ["x.jsonl", "--levels", "0.5,2"], 2, "--levels"),
    (["analyze", "shift"], ["x.jsonl", "--subset", "bottom"], 2, "--subset"),
    (["analyze", "robustness"], ["x.bridge", "--rho-r", "-0.5"], 2, "--rho-r"),
    (["analyze", "decompose"], ["x.jsonl", "--min-id-count", "0"], 2, "--min-id-count"),
]


def _commands(group=None, prefix: str = "") -> set[str]:
    """Every leaf command of the app, as typed after `bridge`."""
    import typer

    if group is None:
        group = typer.main.get_command(app)
        group.load_all()  # the root builds a command when it runs (cli/app.py, LazyGroup)
    out: set[str] = set()
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            out |= _commands(cmd, f"{prefix}{name} ")
        else:
            out.add(prefix + name)
    return out


def test_every_command_is_covered():
    assert {" ".join(words) for words, *_ in BAD} == _commands()


@pytest.mark.parametrize("words, args, code, names", BAD, ids=[" ".join(w + a) for w, a, *_ in BAD])
def test_bad_flag_value_is_one_line(tmp_path, monkeypatch, words, args, code, names):
    monkeypatch.chdir(tmp_path)  # none of the files named exists: the flag must be refused first
    result = CliRunner().invoke(app, [*words, *args], env={"BRIDGE_NO_PROGRESS": "1", "COLUMNS": "80"})
    assert result.exit_code == code, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"bridge {' '.join(words)}: error: "), lines[0]
    assert names in lines[0], lines[0]
    assert "Traceback" not in result.output and "╭" not in result.output and result.stdout == ""


def test_unknown_command_and_flag_are_one_line():
    for args, start in ((["frobnicate"], "bridge: error: No such command"),
                        (["select", "--rho"], "bridge select: error: No such option: --rho"),
                        (["analyze", "fidelity"], "bridge analyze fidelity: error: Missing argument")):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1 and result.stderr.startswith(start), \
            result.stderr


def test_no_arguments_still_show_the_help():
    for args in ([], ["analyze"]):
        result = CliRunner().invoke(app, args)
        assert "Usage" in result.output and "error" not in result.output


def test_cli_only_parses():
    """No check and no error of its own in cli/: BadParameter and UsageError are raised in steps/."""
    for path in CLI.glob("*.py"):
        text = path.read_text()
        assert "BadParameter" not in text, path.name
        assert "raise UsageError" not in text and "import UsageError" not in text, path.name


def test_python_callers_get_the_checks(tmp_path):
    from bridgecli.steps.analyze import run_fidelity, run_robustness
    from bridgecli.steps.eval import run_eval
    from bridgecli.steps.options import EvalRunOptions, FidelityOptions, RobustnessOptions, Source
    from bridgecli.steps.train import TrainOptions, run_train

    with pytest.raises(UsageError, match="--resume and --overwrite exclude each other"):
        run_train(TrainOptions(data=str(tmp_path / "x.jsonl"), out=tmp_path / "run", resume=True, overwrite=True))
    with pytest.raises(UsageError, match="--task names no task"):
        run_eval(EvalRunOptions(model="x", tasks=[]))
    with pytest.raises(UsageError, match="--task names a task twice"):
        run_eval(EvalRunOptions(model="x", tasks=["gsm8k", "gsm8k"]))
    with pytest.raises(UsageError, match=r"^--rho-r must be a finite number in \[0, 1\]"):
        run_fidelity(FidelityOptions(src=Source(data="x.jsonl"), rho_r=1.01))
    with pytest.raises(UsageError, match=r"^--batch-size must be an integer >= 1"):
        run_fidelity(FidelityOptions(src=Source(data="x.jsonl", batch_size=0)))
    with pytest.raises(UsageError, match=r"^--rho-p must be a finite number in \[0, 1\]"):
        run_robustness(RobustnessOptions(inp="x.bridge", rho_p=float("nan")))


def test_retention_has_one_range():
    """rho is a retention ratio in [0, 1] (b = ceil(rho * eligible)) for every step that takes one."""
    from bridgecli.optionspec import RETENTION
    from bridgecli.steps import options as o

    rho_fields = [(cls, f) for cls in (o.SelectOptions, o.FidelityOptions, o.RobustnessOptions)
                  for f in cls.__dataclass_fields__.values() if f.name in ("rho_p", "rho_r")]
    assert len(rho_fields) == 6
    assert all(f.metadata["option"].range == RETENTION for _, f in rho_fields)
    RETENTION.check("--rho-p", 0.0)
    RETENTION.check("--rho-p", 1.0)
    for bad in (-0.01, 1.01, float("nan"), float("inf")):
        with pytest.raises(UsageError):
            RETENTION.check("--rho-p", bad)


def _result(folder: Path, accuracy: float) -> Path:
    folder.mkdir()
    (folder / "eval-gsm8k.json").write_text(json.dumps(
        {"task": "gsm8k", "summary": {"task": "gsm8k", "n": 4, "accuracy": accuracy, "correct": int(4 * accuracy)},
         "items": []}))
    return folder


def test_compare_is_a_command_and_eval_compare_its_alias(tmp_path):
    a, b = _result(tmp_path / "base", 0.25), _result(tmp_path / "final", 0.75)
    new = CliRunner().invoke(app, ["compare", str(a), str(b), "--target", "gsm8k"])
    old = CliRunner().invoke(app, ["eval", "--compare", str(a), str(b), "--target", "gsm8k"])
    assert new.exit_code == 0 and old.exit_code == 0, new.output + old.output
    assert "25.00" in new.stdout and "75.00" in new.stdout and "GSM8K (target)" in new.stdout
    assert "bridge compare" in new.stdout and "bridge eval --compare" in old.stdout
    body = [line for line in new.stdout.splitlines() if "bridge compare" not in line]
    assert body == [line for line in old.stdout.splitlines() if "bridge eval --compare" not in line]
    missing = CliRunner().invoke(app, ["compare", str(tmp_path / "nowhere")])
    assert missing.exit_code != 0 and missing.stderr.startswith("bridge compare: error: ")


def test_every_exit_code_is_documented():
    """docs/cli.md's table lists the exit code of every error class, and the codes the CLI exits with
    itself (interrupted, closed pipe, terminated)."""
    import re

    from bridgecli import errors

    table = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text().split("## Exit codes and errors")[1]
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, flags=re.M)}
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.BridgeError)]
    assert {c.exit_code for c in classes} | {0, 130, 141, 143} == documented
    assert errors.WriteError.exit_code == 7 and len({c.exit_code for c in classes if c.exit_code > 1}) == len(
        [c for c in classes if c.exit_code > 1])  # one code per kind of error

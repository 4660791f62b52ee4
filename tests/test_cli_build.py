"""Each command is built from its options type (cli/build.py): every option field is a flag of its
command and every flag a field, a command given no flag hands its step the options type's own
defaults (no default is applied in cli/), and cli/ imports no private Typer or Click name."""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.cli.build import Command, command
from bridgecli.errors import UsageError
from bridgecli.optionspec import KEY_VALUES, Group, Spec, count, group, option
from bridgecli.steps import options as o
from bridgecli.training.config import LR_FULL, LR_LORA, LoraSettings, SFTConfig, lora_from_flags

CLI = Path(__file__).resolve().parents[1] / "src" / "bridgecli" / "cli"


def _command(words: list[str]):
    cmd = typer.main.get_command(app)
    cmd.load_all()  # the root group builds a command when it runs (cli/app.py, LazyGroup)
    for word in words:
        cmd = cmd.commands[word]
    return cmd


def _declared(cls: type, spec: Group = Group()) -> tuple[set[str], set[str]]:
    """The flags and argument names the fields of ``cls`` (and of its groups) declare."""
    flags: set[str] = set()
    arguments: set[str] = set()
    if spec.switch is not None:
        flags.update(spec.switch.flags)
    for f in spec.fields(cls):
        if "group" in f.metadata:
            more = _declared(_group_type(cls, f.name), f.metadata["group"])
            flags |= more[0]
            arguments |= more[1]
            continue
        opt: Spec = f.metadata["option"]
        if opt.argument:
            arguments.add(opt.flags[0] if opt.flags else f.name)
        elif opt.flags:
            flags.update(part for flag in opt.flags for part in flag.split("/"))
        else:
            flags.add("--" + f.name.replace("_", "-"))
            if typing.get_type_hints(cls)[f.name] in (bool, bool | None):  # Typer's own --no-x
                flags.add("--no-" + f.name.replace("_", "-"))
    return flags, arguments


def _group_type(cls: type, name: str) -> type:
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return args[0]


TYPES = [
    (["warmup"], o.WarmupOptions),
    (["score"], o.ScoreOptions),
    (["merge"], o.MergeOptions),
    (["reference"], o.ReferenceOptions),
    (["select"], o.SelectOptions),
    (["close"], o.CloseOptions),
    (["compact"], o.CompactOptions),
    (["train"], o.TrainOptions),
    (["compare"], o.CompareOptions),
    (["inspect"], o.InspectOptions),
    (["show"], o.ShowOptions),
    (["analyze", "fidelity"], o.FidelityOptions),
    (["analyze", "shift"], o.ShiftOptions),
    (["analyze", "robustness"], o.RobustnessOptions),
]


@pytest.mark.parametrize("words, cls", TYPES, ids=[" ".join(w) for w, _ in TYPES])
def test_the_flags_are_the_fields(words, cls):
    cmd = _command(words)
    opts = {name for p in cmd.params if p.param_type_name == "option" for name in (*p.opts, *p.secondary_opts)}
    args = {p.name for p in cmd.params if p.param_type_name == "argument"}
    flags, arguments = _declared(cls)
    assert opts - {"--help"} == flags and args == arguments


def test_eval_is_its_options_and_the_compare_spelling():
    from bridgecli.steps.options import EvalCommand

    cmd = _command(["eval"])
    opts = {name for p in cmd.params if p.param_type_name == "option" for name in (*p.opts, *p.secondary_opts)}
    flags, arguments = _declared(EvalCommand)
    assert opts - {"--help"} == flags and {"--limit", "--code-timeout", "--dtype", "--compare", "--paired"} <= flags
    assert arguments == {"model"}


def _capture(monkeypatch, module: str, name: str) -> list:
    import importlib

    got: list = []
    monkeypatch.setattr(importlib.import_module(module), name, lambda opts, *a, **k: got.append(opts) or {})
    return got


DEFAULTS = [
    (["warmup", "x.jsonl"], "bridgecli.steps.warmup", "run_warmup", o.WarmupOptions(data="x.jsonl")),
    (["score", "x.jsonl"], "bridgecli.steps.score", "run_score", o.ScoreOptions(data="x.jsonl")),
    (["reference", "x.bridge"], "bridgecli.steps.reference", "run_reference", o.ReferenceOptions(inp="x.bridge")),
    (["select", "x.bridge"], "bridgecli.steps.select", "run_select", o.SelectOptions(inp="x.bridge")),
    (["select"], "bridgecli.steps.select", "run_select", o.SelectOptions()),
    (["close", "x.bridge"], "bridgecli.steps.close", "run_close", o.CloseOptions(inp="x.bridge")),
    (["compact", "x.bridge"], "bridgecli.steps.compact", "run_compact", o.CompactOptions(inp="x.bridge")),
    (["train", "x.jsonl"], "bridgecli.steps.train", "run_train", o.TrainOptions(data="x.jsonl")),
    (["train", "x.jsonl", "--lora"], "bridgecli.steps.train", "run_train",
     o.TrainOptions(data="x.jsonl", sft=SFTConfig(lora=LoraSettings()))),
    (["train", "x.jsonl", "--keep-checkpoints", "0"], "bridgecli.steps.train", "run_train",
     o.TrainOptions(data="x.jsonl", sft=SFTConfig(keep_checkpoints=0))),
    (["eval", "m"], "bridgecli.steps.eval", "run_eval", o.EvalRunOptions(model="m")),
    (["compare", "a", "b"], "bridgecli.steps.eval", "run_compare", o.CompareOptions(runs=["a", "b"])),
    (["show", "x.bridge"], "bridgecli.steps.show", "run_show", o.ShowOptions(inp="x.bridge")),
    (["analyze", "fidelity", "x.jsonl"], "bridgecli.steps.analyze", "run_fidelity",
     o.FidelityOptions(src=o.Source(data="x.jsonl"))),
    (["analyze", "shift", "x.jsonl"], "bridgecli.steps.analyze", "run_shift",
     o.ShiftOptions(src=o.Source(data="x.jsonl"))),
    (["analyze", "robustness", "x.bridge"], "bridgecli.steps.analyze", "run_robustness",
     o.RobustnessOptions(inp="x.bridge")),
]


@pytest.mark.parametrize("args, module, name, expected", DEFAULTS, ids=[" ".join(a) for a, *_ in DEFAULTS])
def test_no_flag_is_the_options_types_default(monkeypatch, args, module, name, expected):
    """What a Python caller gets with the same values is what the command line passes: no default of
    cli/'s own (the learning rate with --lora, --keep-checkpoints 0, the repeatable flags' empty lists)."""
    got = _capture(monkeypatch, module, name)
    CliRunner().invoke(app, args)
    assert got == [expected]


def test_python_callers_get_the_derived_defaults():
    assert SFTConfig().lr == LR_FULL and SFTConfig(lora=LoraSettings()).lr == LR_LORA
    assert SFTConfig(lr=1e-3, lora=LoraSettings()).lr == 1e-3
    assert SFTConfig(keep_checkpoints=0).keep_checkpoints is None and SFTConfig().keep_checkpoints == 1
    assert o.WarmupOptions(data="x").sft == SFTConfig(epochs=1.0, grad_accum=1)


def test_cli_imports_no_private_typer_or_click_name():
    private = re.compile(r"\b(typer|click)\._|from (typer|click)[\w.]* import [^\n]*\b_[A-Za-z]|_TyperParameter")
    for path in sorted(CLI.parent.rglob("*.py")):
        assert not private.search(path.read_text()), path


# -- the builder on a type of its own ----------------------------------------------------------


@dataclass
class _Inner:
    size: int = option(3, "Inner size.", range=count(1, 9), show_range=True)
    tags: list[str] = option(None, "Tags (repeatable).", "--tag", factory=list)


@dataclass
class _Toy:
    path: str = option(help="The input.", argument=True)
    pairs: dict = option(None, "KEY=VALUE (repeatable).", "--pair", factory=dict, parse=KEY_VALUES)
    inner: _Inner = group(_Inner, defaults={"size": 5}, help={"tags": "Labels."}, prefix="inner: ")
    lora: LoraSettings | None = group(switch=Spec("Turn LoRA on.", ("--lora",)), build=lora_from_flags, default=None)
    verbose: bool = option(False, "Say more.", "--verbose/--quiet")


def _toy_app(got: list) -> typer.Typer:
    toy = typer.Typer(add_completion=False)

    @command(_Toy)
    def run(opts: _Toy) -> None:
        """Run the toy."""
        got.append(opts)

    toy.command("run", cls=Command)(run)
    toy.command("other", cls=Command)(lambda: None)  # two commands: `run` is a subcommand
    return toy


def test_the_builder_walks_groups_parses_and_switches():
    got: list = []
    toy = _toy_app(got)
    done = CliRunner().invoke(toy, ["run", "in.txt"])
    assert done.exit_code == 0, done.output
    assert got.pop() == _Toy(path="in.txt", inner=_Inner(size=5), lora=None, verbose=False)
    done = CliRunner().invoke(toy, ["run", "in.txt", "--pair", "a=1", "--size", "2", "--tag", "x", "--tag", "y",
                                    "--lora", "--lora-r", "4", "--quiet"])
    assert done.exit_code == 0, done.output
    assert got.pop() == _Toy(path="in.txt", pairs={"a": "1"}, inner=_Inner(size=2, tags=["x", "y"]),
                             lora=LoraSettings(r=4))
    for args, message in ((["--size", "10"], "less than or equal to 9"),
                          (["--lora-r", "4"], "--lora-r applies only with --lora"),
                          (["--pair", "a"], "--pair expects KEY=VALUE")):
        done = CliRunner().invoke(toy, ["run", "in.txt", *args])
        assert done.exit_code != 0 and not got
        error = done.exception if isinstance(done.exception, UsageError) else None
        assert message in (str(error) if error else done.output), done.output
    text = CliRunner().invoke(toy, ["run", "--help"], env={"COLUMNS": "200"}).output
    assert "inner: labels." in text and "[default: 5]" in text and "(16 with --lora)" in text
    assert "run [OPTIONS] PATH" in text and "INTEGER RANGE [1<=x<=9]" in text
    options = text.split("Options")[1]  # an argument's type is Typer's own (<str>), an option's plain
    assert not re.search(r"<(list\[|str>|int>|float>|bool>)", options)


@dataclass
class _Ruled:
    kind: str | None = option(None, "Kind (not given: the rule's).", fallback="plain")
    level: float | None = option(None, "Level.", "--level", fallback=0.5)


def test_a_field_with_a_fallback_is_none_unless_its_flag_is_given():
    """select's --method and --rho-p (which --preset fills in): --help shows the fallback as the default, the
    field is None when the flag is left out, and a flag given at the fallback's own value counts as given."""
    got: list = []
    toy = typer.Typer(add_completion=False)

    @command(_Ruled)
    def run(opts: _Ruled) -> None:
        got.append(opts)

    toy.command("run", cls=Command)(run)
    toy.command("other", cls=Command)(lambda: None)
    for args, want in (([], _Ruled()), (["--kind", "plain", "--level", "0.5"], _Ruled("plain", 0.5)),
                       (["--level", "0.25"], _Ruled(None, 0.25))):
        done = CliRunner().invoke(toy, ["run", *args])
        assert done.exit_code == 0, done.output
        assert got.pop() == want, args
    assert _Ruled() == _Ruled(kind=None, level=None)
    text = " ".join(CliRunner().invoke(toy, ["run", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "[default: (plain)]" in text and "[default: (0.5)]" in text  # Typer writes a described default in ()


def _every_command(cmd, words=()):
    """``(words, command)`` for the root, every group and every command under it."""
    yield list(words), cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _every_command(sub, (*words, name))


_BRACKETED = re.compile(r"\[+[^\[\]\s]*(?: [^\[\]\s]+)*\]+")  # [lm-eval], [[supervised response]], [0, 1]


def _source_texts(cmd) -> list[str]:
    """What the help of ``cmd`` shows as written: its help, its options' and their panels' names, and for a
    group the first paragraph of each command's help."""
    import click

    ctx = click.Context(cmd)
    texts = [cmd.help or "", cmd.epilog or ""]
    for param in cmd.get_params(ctx):
        texts += [getattr(param, "help", None) or "", getattr(param, "rich_help_panel", None) or ""]
    for sub in getattr(cmd, "commands", {}).values():
        texts.append((sub.short_help or sub.help or "").split("\n\n")[0])
    return [text.replace("\\[", "[") for text in texts]  # as written: the builder escapes them for rich


def test_help_shows_bracketed_words_as_written():
    """Typer's rich mode reads help as markup, where ``[lm-eval]`` is a tag and vanishes: every bracketed
    word of every command's help texts (docstrings, option help, panel names) is in its rendered --help."""
    checked: set[str] = set()
    root = typer.main.get_command(app)
    root.load_all()
    for words, cmd in _every_command(root):
        out = CliRunner().invoke(app, [*words, "--help"], prog_name="bridge", env={"COLUMNS": "1000"})
        assert out.exit_code == 0, (words, out.output)
        shown = " ".join(re.sub(r"[│╭╮╰╯─]", " ", out.stdout).split())
        for text in _source_texts(cmd):
            for word in _BRACKETED.findall(" ".join(text.split())):
                assert word in shown, (words, word)
                checked.add(word)
    assert {"[lm-eval]", "[[supervised response]]"} <= checked  # the two that vanished before


@dataclass
class _Bracketed:
    size: int = option(1, "Size [b] of it.", panel="Panel [p]")


def test_escaped_help_covers_panels_and_the_command_list():
    """Where the real commands have no bracket yet: a panel's name, a command's line in its group's list,
    a group's own help."""
    from bridgecli.cli.app import Group
    from bridgecli.cli.build import escaped

    toy = typer.Typer(cls=Group, help=escaped("Toy [group] help."), rich_markup_mode="rich", add_completion=False)

    @command(_Bracketed)
    def run(opts: _Bracketed) -> None:
        pass

    toy.command("run", cls=Command, help=escaped("Run [the toy]."))(run)
    toy.command("other", cls=Command)(lambda: None)
    listing = CliRunner().invoke(toy, ["--help"], env={"COLUMNS": "200"}).stdout
    assert "Toy [group] help." in listing and "Run [the toy]." in listing
    text = CliRunner().invoke(toy, ["run", "--help"], env={"COLUMNS": "200"}).stdout
    assert "Run [the toy]." in text and "Size [b] of it." in text and "Panel [p]" in text


@pytest.mark.integration  # starts Python processes
@pytest.mark.parametrize("args", [["--version"], ["--help"], ["select", "x", "--preset", "a", "--preset", "b"]])
def test_starting_loads_no_step_it_does_not_run(args):
    """`bridge --version` and `bridge --help` import at most 25 of the package's modules and no step; a
    command imports its own (bench/cli/startup.py times them)."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "bridgecli", *args], capture_output=True,
                          text=True, env=dict(os.environ, COLUMNS="100"))
    names = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    ours = {n for n in names if n.split(".")[0] == "bridgecli"}
    steps = {n for n in ours if n.startswith("bridgecli.steps.") and n != "bridgecli.steps.catalog"}
    if args[0].startswith("--"):
        assert proc.returncode == 0 and len(ours) + 1 <= 25 and not steps, sorted(ours)  # + __main__
        assert not {"torch", "numpy", "pluggy"} & names
    else:  # a usage error found by the parser: the command's options are built, its step never runs
        assert proc.returncode == 2 and "--preset given 2 times" in proc.stderr
        assert "bridgecli.steps.select" not in steps and "torch" not in names

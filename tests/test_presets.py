"""``bridge select --preset NAME``: one table of named settings (steps/presets.py) that fill in --method,
--rho-p and --option where the user gave none; flags given win, a clashing --method and an unknown name
are one-line usage errors, and what ran (the expansion and the preset's name) is in the output's header."""

from __future__ import annotations

import re

import msgspec
import pytest
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.errors import UsageError
from bridgecli.format.reader import open_reader
from bridgecli.registry import get
from bridgecli.steps import presets
from bridgecli.steps.options import SelectOptions
from bridgecli.steps.presets import PRESETS, Expanded, expand
from bridgecli.steps.select import run_select


@pytest.fixture(scope="module")
def scores(tmp_path_factory, tokenizer):
    from test_show import synthetic, write_stream

    exs = [msgspec.structs.replace(e, selection=None, closure=None) for e in synthetic(tokenizer, closure=False)]
    assert all(e.scores.loss is not None for e in exs)  # by=loss reads it, as every built-in scorer writes it
    return write_stream(tmp_path_factory.mktemp("presets") / "scores.bridge", exs, "scores")


def _select(tmp_path, src, *args: str, name: str = "out.bridge"):
    """(result, output path, step params, examples) of ``bridge select SRC ARGS -o OUT``."""
    out = tmp_path / name
    r = CliRunner().invoke(app, ["select", str(src), "-o", str(out), *args])
    if r.exit_code != 0:
        return r, out, None, None
    with open_reader(str(out)) as reader:
        exs = list(reader)
    return r, out, reader.header.steps[-1].params, exs


# -- the table ------------------------------------------------------------------------------------


def test_the_table_is_the_grids_rows():
    """Each preset is the grid row of its name (bench/results/grid.sh): every prompt token kept, the
    importance rows with the floor and weights they were measured with, by=loss for the loss row."""
    assert expand("importance-loss-resp", None, None, {}) == Expanded(
        "importance", 1.0, {"by": "loss", "floor": "0.5", "weights": "ipw"}, "importance-loss-resp"
    )
    assert expand("importance-resp", None, None, {}) == Expanded(
        "importance", 1.0, {"by": "abs", "floor": "0.5", "weights": "ipw"}, "importance-resp"
    )
    assert expand("random-resp", None, None, {}) == Expanded("random", 1.0, {}, "random-resp")
    assert PRESETS["importance-loss-resp"].flags() == (
        "--method importance --rho-p 1 --option by=loss --option floor=0.5 --option weights=ipw"
    )
    for name, p in PRESETS.items():
        assert "results.md" not in p.why and p.why and "\n" not in p.why, name  # one line; the section is SECTION's
        get("selector", p.method).obj.parse(dict(p.options))  # every key is one its selector takes


def test_without_a_preset_the_defaults_stay():
    assert expand(None, None, None, {}) == Expanded("bridge", 0.75, {}, None)
    assert expand(None, "random", 0.5, {"seed": "1"}) == Expanded("random", 0.5, {"seed": "1"}, None)


def test_what_is_given_wins_key_by_key():
    got = expand("importance-loss-resp", "importance", 0.75, {"floor": "0.3", "seed": "7"})
    assert got == Expanded(
        "importance", 0.75, {"by": "loss", "floor": "0.3", "weights": "ipw", "seed": "7"}, "importance-loss-resp"
    )


@pytest.mark.parametrize(
    "preset, method, message",
    [
        ("nope", None, "--preset must be one of importance-loss-resp, importance-resp, random-resp, got 'nope'"),
        (
            "importance-resp",
            "random",
            "--method random conflicts with --preset importance-resp, which runs --method importance",
        ),
    ],
)
def test_expand_refuses_an_unknown_name_and_another_method(preset, method, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        expand(preset, method, None, {})


# -- the command line and Python callers -----------------------------------------------------------


def test_the_preset_is_the_explicit_command(tmp_path, scores):
    """``--preset importance-loss-resp --rho-r 0.5`` writes what the grid's explicit flags write; its header
    records the same expansion, plus the preset's name."""
    r, _, params, got = _select(tmp_path, scores, "--preset", "importance-loss-resp", "--rho-r", "0.5")
    assert r.exit_code == 0, r.output
    flags = PRESETS["importance-loss-resp"].flags().split()
    r2, _, params2, want = _select(tmp_path, scores, *flags, "--rho-r", "0.5", name="explicit.bridge")
    assert r2.exit_code == 0, r2.output
    assert got == want and len(got) > 1
    assert all(e.selection.method == "importance" and e.selection.response_weights is not None for e in got)
    assert params == {**params2, "preset": "importance-loss-resp"}
    assert params["options"] == {"by": "loss", "floor": "0.5", "weights": "ipw"} and params["rho_p"] == 1.0


def test_flags_given_win_even_at_their_default_value(tmp_path, scores):
    """--rho-p 0.75 given is given, though it is the default (click's parameter source, not a comparison
    with the default); --option floor=0.3 replaces that key and leaves the preset's others."""
    r, _, params, got = _select(
        tmp_path, scores, "--preset", "importance-loss-resp", "--rho-p", "0.75", "--option", "floor=0.3"
    )
    assert r.exit_code == 0, r.output
    assert params["rho_p"] == 0.75 and params["method"] == "importance"
    assert params["options"] == {"by": "loss", "floor": "0.3", "weights": "ipw"}
    assert any(len(e.selection.prompt_keep) < len(e.tokens.prompt_positions()) for e in got)
    # the same method as the preset's, given: allowed
    r, _, params, _ = _select(tmp_path, scores, "--preset", "random-resp", "--method", "random", name="r.bridge")
    assert r.exit_code == 0, r.output
    assert params["method"] == "random" and params["rho_p"] == 1.0 and params["preset"] == "random-resp"


def test_no_preset_records_the_defaults(tmp_path, scores):
    r, _, params, _ = _select(tmp_path, scores)
    assert r.exit_code == 0, r.output
    assert params["method"] == "bridge" and params["rho_p"] == 0.75 and params["preset"] is None
    assert params["options"] == {}


def test_a_python_caller_gets_the_same_expansion(tmp_path, scores):
    out = tmp_path / "py.bridge"
    run_select(SelectOptions(inp=str(scores), out=str(out), preset="importance-loss-resp", rho_r=0.5, rho_p=0.75))
    _, _, params, want = _select(tmp_path, scores, "--preset", "importance-loss-resp", "--rho-r", "0.5",
                                 "--rho-p", "0.75", name="cli.bridge")
    with open_reader(str(out)) as reader:
        assert list(reader) == want
        assert reader.header.steps[-1].params == params
    assert SelectOptions().method is None and SelectOptions().rho_p is None  # None: not given


@pytest.mark.parametrize(
    "args, start",
    [
        (["--preset", "importance-loss-resp", "--method", "random"],
         "bridge select: error: --method random conflicts with --preset importance-loss-resp, which runs "
         "--method importance"),
        (["--preset", "best"],
         "bridge select: error: --preset must be one of importance-loss-resp, importance-resp, random-resp, "
         "got 'best'"),
    ],
)
def test_a_clash_or_an_unknown_name_is_one_line_and_writes_nothing(tmp_path, scores, args, start):
    r, out, _, _ = _select(tmp_path, scores, *args)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith(start), r.stderr
    assert "Traceback" not in r.output and not out.exists() and list(tmp_path.iterdir()) == []


def test_help_lists_the_presets_from_the_table():
    r = CliRunner().invoke(app, ["select", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    text = " ".join(r.stdout.replace("│", " ").split())
    for name, p in PRESETS.items():
        assert f"{name}: {p.flags()}" in text, name
    assert presets.SECTION in text
    assert "[default: (bridge)]" in text and "[default: (0.75)]" in text  # the defaults still show (Typer: "(...)")


def test_the_docs_table_is_the_presets():
    """docs/cli.md lists each preset with the flags it stands for, the same as the table."""
    from pathlib import Path

    rows = {line.split("|")[1].strip(" `"): line for line in
            (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text().splitlines()
            if line.startswith("| `")}
    for name, p in PRESETS.items():
        assert f"`{p.flags()}`" in rows.get(name, ""), name


def test_a_preset_given_twice_is_a_usage_error(tmp_path, scores):
    """Issue 40: not the last one silently; one line, exit 2, before the input is read."""
    r, out, _, _ = _select(tmp_path, scores, "--preset", "random-resp", "--preset", "importance-loss-resp")
    assert r.exit_code == UsageError.exit_code and not out.exists()
    assert r.stderr.strip() == (
        "bridge select: error: --preset given 2 times ('random-resp', 'importance-loss-resp'): give it once"
    )

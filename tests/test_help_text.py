"""Command help: a docstring's source line breaks are joined per paragraph before Typer renders it,
since Typer's rich help keeps them and then wraps again to the terminal (ragged lines at 80 columns)."""

from __future__ import annotations

from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.cli.build import unwrapped


def test_paragraph_lines_are_joined_and_list_items_kept():
    doc = """First line.

    A paragraph wrapped
    at 100 columns in the source.

    Presets:

    * one: its flags
    and why.
    * two: more.
        an indented line
    """
    assert unwrapped(doc) == (
        "First line.\n\nA paragraph wrapped at 100 columns in the source.\n\nPresets:\n\n"
        "* one: its flags and why.\n* two: more.\n    an indented line"
    )


def test_select_help_reads_as_paragraphs_at_80_columns():
    out = CliRunner().invoke(app, ["select", "--help"], env={"COLUMNS": "80", "NO_COLOR": "1"}).output
    prose = out.split("─ Arguments")[0]  # the command's help text, before the option panels
    lines = [line.strip(" │") for line in prose.splitlines()]
    # the docstring's source breaks ("keeps whole structural" / "units (sentences, ...") are gone: the
    # paragraph is wrapped once, to the terminal, so no line ends short in the middle of a sentence
    assert not any(line.rstrip().endswith("keeps whole structural") for line in lines)
    assert "units (sentences, equations, steps)" in " ".join(lines)
    short = [a for a, b in zip(lines, lines[1:]) if 0 < len(a.rstrip()) < 45 and b[:1].islower()]
    assert short == [], short

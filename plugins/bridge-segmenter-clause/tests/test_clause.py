"""The clause segmenter: the pure function, and the real CLI listing the plugin."""

from __future__ import annotations

import json
import random
from importlib.metadata import PackageNotFoundError, version

import pytest
from typer.testing import CliRunner

import bridge_segmenter_clause
from bridge_segmenter_clause import split_clauses
from bridgecli import plugins
from bridgecli.builtin.segmenters import validate_spans
from bridgecli.cli.app import app


def clauses(text: str) -> list[str]:
    spans = split_clauses(text)
    validate_spans(text, spans)  # sorted, non-overlapping, in range, not whitespace-only
    return [text[a:b] for a, b in spans]


# --- the function ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("First, mix; then bake: done.", ["First,", "mix;", "then bake:", "done."]),
        ("At 3:45, we paid $1,000: half up front.", ["At 3:45,", "we paid $1,000:", "half up front."]),
        ("It costs 3.5 dollars. Really? Yes!", ["It costs 3.5 dollars.", "Really?", "Yes!"]),
        ("one\ntwo\r\nthree\rfour", ["one", "two", "three", "four"]),
        ('He said, "stop!" Then left.', ["He said,", '"stop!"', "Then left."]),
        ("(see above.) Next", ["(see above.)", "Next"]),
        ("Wait... what", ["Wait...", "what"]),
        ("a,b;c:d", ["a,b;c:d"]),  # no space after the punctuation: not a clause end
        ("  padded ,  clause  \n\n  ", ["padded ,", "clause"]),
        ("no punctuation at all", ["no punctuation at all"]),
        ("ends with a comma,", ["ends with a comma,"]),
        ("", []),
        (" \t\n\r\n ", []),
    ],
)
def test_clauses(text, expected):
    assert clauses(text) == expected


def test_gsm8k_answer():
    text = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
            "In all, she sold 48+24 = <<48+24=72>>72 clips.\n#### 72")
    assert clauses(text) == [
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.",
        "In all,",
        "she sold 48+24 = <<48+24=72>>72 clips.",
        "#### 72",
    ]


PIECES = ["a", "word", "1", "1,000", "3:45", "3.5", ",", ";", ":", ".", "!", "?", "...", '"', ")", "]",
          " ", "  ", "\t", "\n", "\r", "\r\n", "\u2028", "\x0c", "é", "×"]


def test_contract_on_random_text():
    rng = random.Random(0)
    for _ in range(2000):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30)))
        spans = split_clauses(text)
        validate_spans(text, spans)
        assert all(type(a) is int and type(b) is int for a, b in spans)
        assert not any(text[a].isspace() or text[b - 1].isspace() for a, b in spans)  # stripped
        covered = {i for a, b in spans for i in range(a, b)}
        assert all(ch.isspace() for i, ch in enumerate(text) if i not in covered)  # nothing lost
        assert split_clauses(text) == spans  # deterministic


# --- the CLI --------------------------------------------------------------------------------


def bridge_plugins() -> dict:
    result = CliRunner().invoke(app, ["plugins"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def registered(monkeypatch):
    """The plugin module registered by hand, with no installed plugin loaded beside it."""
    monkeypatch.setenv("BRIDGE_LOAD_PLUGINS", "")
    plugins.reset()
    try:
        plugins.get_manager().register(bridge_segmenter_clause, name="clause")
        yield
    finally:
        plugins.reset()


def test_bridge_plugins_lists_it(registered):
    out = bridge_plugins()
    [entry] = [p for p in out["plugins"] if p["name"] == "clause"]
    assert entry["hooks"] == ["register_segmenters"]
    assert entry["builtin"] is False
    assert out["registered"]["segmenter"]["clause"]["plugin"] == "clause"


def test_installed_plugin_loads_through_its_entry_point(monkeypatch):
    try:
        installed = version("bridge-segmenter-clause")
    except PackageNotFoundError:
        pytest.skip("not installed: pip install -e plugins/bridge-segmenter-clause")
    monkeypatch.delenv("BRIDGE_LOAD_PLUGINS", raising=False)
    plugins.reset()
    try:
        out = bridge_plugins()
    finally:
        plugins.reset()
    [entry] = [p for p in out["plugins"] if p["name"] == "clause"]
    assert (entry["package"], entry["version"]) == ("bridge-segmenter-clause", installed)
    assert out["registered"]["segmenter"]["clause"]["plugin"] == "clause"

"""docs/cli-reference.md is generated from the Typer app; it must not drift from the commands."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_cli_reference_is_up_to_date(monkeypatch):
    """In the fast set (a stale reference is the commonest drift): scripts/gen_cli_reference.py's render,
    in this process (about 2 s), against the file."""
    spec = importlib.util.spec_from_file_location("gen_cli_reference", REPO / "scripts" / "gen_cli_reference.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    monkeypatch.setenv("COLUMNS", "100")  # what the script sets when it runs on its own
    assert gen.render() == gen.TARGET.read_text(), "docs/cli-reference.md is out of date: run python scripts/gen_cli_reference.py"


def test_cli_reference_lists_every_command():
    from bridgecli.steps.catalog import ANALYZE, COMMANDS

    text = (REPO / "docs" / "cli-reference.md").read_text()
    for name, _ in COMMANDS:
        assert f"## `bridge {name}`" in text, name
    for name, _ in ANALYZE:
        assert f"## `bridge analyze {name}`" in text, name

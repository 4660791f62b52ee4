"""docs/cli-reference.md is generated from the Typer app; it must not drift from the commands."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.integration  # starts scripts/gen_cli_reference.py
def test_cli_reference_is_up_to_date():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_cli_reference.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_cli_reference_lists_every_command():
    from bridgecli.steps.catalog import ANALYZE, COMMANDS

    text = (REPO / "docs" / "cli-reference.md").read_text()
    for name, _ in COMMANDS:
        assert f"## `bridge {name}`" in text, name
    for name, _ in ANALYZE:
        assert f"## `bridge analyze {name}`" in text, name

"""Plugin loading: built-ins through the hooks, an installed third-party package, the allow-list,
and name resolution (collisions, unknown names) with a fake plugin registered in the test."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bridgecli import hookimpl, plugins, registry
from bridgecli.cli.app import app
from bridgecli.errors import PluginError

REPO = Path(__file__).resolve().parents[1]
PLUGIN_DIR = REPO / "plugins" / "bridge-segmenter-clause"

BUILTINS = {
    "bridgecli.builtin.segmenters": ("register_segmenters", "segmenter",
                                     {"sentence", "math", "step", "list", "code"}),
    "bridgecli.builtin.scorers": ("register_scorers", "scorer", {"bridge", "atp", "exact"}),
    "bridgecli.builtin.selectors": ("register_selectors", "selector", {"bridge", "one-pass", "independent", "importance", "stratified"}),
    "bridgecli.builtin.baselines": ("register_selectors", "selector",
                                    {"random", "rho1", "tokencleaning", "sstoken", "llmlingua1", "llmlingua2",
                                     "llm+tc", "tokenseek-approx"}),
    "bridgecli.builtin.whole_examples": ("register_selectors", "selector", {"example-importance", "rho-loss"}),
    "bridgecli.builtin.eval_tasks": ("register_eval_tasks", "eval_task",
                                     {"gsm8k", "math", "humaneval", "mbpp", "arc_challenge", "arc_easy", "hellaswag", "mmlu",
                                      "heldout-loss", "answer-loss"}),
}


def cli_plugins() -> dict:
    """``bridge plugins`` in-process, parsed."""
    result = CliRunner().invoke(app, ["plugins"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# --- built-ins ------------------------------------------------------------------------------


def test_builtins_register_through_the_hooks(manager):
    out = cli_plugins()
    assert {p["name"]: (p["builtin"], p["hooks"]) for p in out["plugins"]} == {
        name: (True, [hook]) for name, (hook, _, _) in BUILTINS.items()
    }
    for name, (_, kind, registered) in BUILTINS.items():
        assert {n for n, e in out["registered"][kind].items() if e["plugin"] == name} == registered
        assert all(out["registered"][kind][n]["description"] for n in registered)
    assert set(out["registered"]) == set(registry.KINDS)


# --- a fake plugin, registered in-process ---------------------------------------------------


def split_words(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(r"\S+", text)]


class WordsPlugin:
    __name__ = "WordsPlugin"

    @hookimpl
    def register_segmenters(self, register):
        register("words", split_words, "one unit per word")


class SentencePlugin:
    __name__ = "SentencePlugin"

    @hookimpl
    def register_segmenters(self, register):
        register("sentence", split_words)


def test_registered_plugin_is_found(manager):
    manager.register(WordsPlugin(), name="words-plugin")
    entry = registry.get("segmenter", "words")
    assert (entry.obj, entry.description, entry.plugin) == (split_words, "one unit per word", "words-plugin")
    assert "words" in registry.names("segmenter")
    out = cli_plugins()
    assert {"name": "words-plugin", "hooks": ["register_segmenters"], "builtin": False} in out["plugins"]
    assert out["registered"]["segmenter"]["words"]["plugin"] == "words-plugin"


def test_name_collision_names_both_plugins(manager):
    manager.register(SentencePlugin(), name="sentence-plugin")
    with pytest.raises(PluginError) as err:
        registry.get("segmenter", "sentence")
    message = str(err.value)
    assert "'sentence'" in message
    assert "bridgecli.builtin.segmenters" in message and "sentence-plugin" in message
    assert "BRIDGE_LOAD_PLUGINS" in message  # says how to fix it


def test_unknown_name_lists_available(manager):
    available = r"\(available: code, list, math, sentence, step\)"
    with pytest.raises(PluginError, match=r"no segmenter named 'nope' " + available):
        registry.get("segmenter", "nope")
    with pytest.raises(PluginError, match=r"no eval task named 'nope' \(available: answer-loss, arc_challenge, "
                                          r"arc_easy, gsm8k, heldout-loss, hellaswag, humaneval, math, mbpp, mmlu\)"):
        registry.get("eval_task", "nope")


def test_unknown_segmenter_from_the_cli(manager):
    result = CliRunner().invoke(app, ["close", "--segmenter", "nope"], input="")
    assert result.exit_code == PluginError.exit_code
    assert "no segmenter named 'nope' (available: code, list, math, sentence, step)" in result.output


# --- the example package, installed ---------------------------------------------------------


def _can_build_offline() -> bool:
    """pip can build the plugin with no index and no build isolation: pip and setuptools >= 70.1
    (or an older setuptools with wheel) are installed here."""
    if importlib.util.find_spec("pip") is None or importlib.util.find_spec("setuptools") is None:
        return False
    major, minor = (int(n) for n in re.findall(r"\d+", version("setuptools"))[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


def _install_by_hand(source: Path, target: Path) -> None:
    """What pip would put in ``target``: the module and a dist-info with the pyproject's entry points."""
    tomllib = pytest.importorskip("tomllib", reason="needs Python 3.11+ to read pyproject.toml")
    project = tomllib.loads((source / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    target.mkdir()
    shutil.copy(source / "bridge_segmenter_clause.py", target)
    info = target / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n", encoding="utf-8")
    sections = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
                for group, eps in project["entry-points"].items()]
    (info / "entry_points.txt").write_text("".join(sections), encoding="utf-8")


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """A folder holding the example plugin installed with pip (offline), for PYTHONPATH."""
    tmp = tmp_path_factory.mktemp("clause")
    # Build from a copy: pip builds in the source tree and would leave build/ and *.egg-info there.
    source = Path(shutil.copytree(PLUGIN_DIR, tmp / "source", ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", ".pytest_cache")))
    target = tmp / "site"
    if not _can_build_offline():
        _install_by_hand(source, target)
        return target
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INPUT": "1"}
    env.pop("PIP_USER", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--quiet", "--target", str(target), str(source)],
        capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return target


def run_bridge_plugins(site: Path, allow: str | None) -> dict:
    """``bridge plugins`` in a subprocess with ``site`` on PYTHONPATH and BRIDGE_LOAD_PLUGINS=allow."""
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    env.pop("BRIDGE_LOAD_PLUGINS", None)
    if allow is not None:
        env["BRIDGE_LOAD_PLUGINS"] = allow
    script = Path(sys.executable).with_name("bridge")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "bridgecli"]
    proc = subprocess.run([*cmd, "plugins"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


CLAUSE_ENTRY = {"name": "clause", "hooks": ["register_segmenters"], "builtin": False,
                "package": "bridge-segmenter-clause", "version": "0.1.0"}


@pytest.mark.integration  # pip-installs the plugin, starts `bridge plugins`
@pytest.mark.parametrize(("allow", "loaded"), [(None, True), ("", False)])
def test_installed_plugin_is_picked_up(plugin_site, allow, loaded):
    """The real command in a fresh process: autoloaded by default, not loaded with an empty allow-list."""
    out = run_bridge_plugins(plugin_site, allow)
    names = {p["name"] for p in out["plugins"]}
    if loaded:
        assert names >= set(BUILTINS) | {"clause"}  # and whatever else this environment has installed
        assert [p for p in out["plugins"] if p["name"] == "clause"] == [CLAUSE_ENTRY]
        clause = out["registered"]["segmenter"]["clause"]
        assert clause["plugin"] == "clause" and clause["description"]
    else:
        assert names == set(BUILTINS)  # built-ins always load
        assert "clause" not in out["registered"]["segmenter"]


@pytest.mark.integration  # pip-installs the plugin (plugin_site)
@pytest.mark.parametrize(("allow", "loaded"),
                         [("clause", True), (" other , clause ", True), ("other", False)])
def test_allow_list(plugin_site, monkeypatch, allow, loaded):
    """The same installed package, in-process (a subprocess per case would be slow)."""
    monkeypatch.syspath_prepend(str(plugin_site))
    monkeypatch.delitem(sys.modules, "bridge_segmenter_clause", raising=False)  # import the installed copy
    monkeypatch.setenv("BRIDGE_LOAD_PLUGINS", allow)
    plugins.reset()
    try:
        out = cli_plugins()
    finally:
        plugins.reset()
    assert [p for p in out["plugins"] if p["name"] == "clause"] == ([CLAUSE_ENTRY] if loaded else [])
    assert ("clause" in out["registered"]["segmenter"]) is loaded

"""The package's layers: a module imports only its own layer and the ones below it.

Lowest first (README.md, "Layout", says the same):

1. base: the package root (``PRODUCER``), errors, display, optionspec, io, progress, timings, and
   hookspecs (the plugin contracts: declarations only);
2. format and core: the stream format; the pure algorithms (segmenting: the segmenters' text rules);
3. runtime: the machinery the steps share (process pools, ranks, shard merge, resumable output,
   parameter checks), and the plugin machinery (plugins, registry, contracts);
4. the domain: data, artifacts, modeling, training, evaluation, baselines, analysis;
5. builtin: the built-in plugins;
6. steps: one module per pipeline step;
7. cli: the Typer layer (and ``__main__``).

Every import counts, at the top of a module or inside a function; imports under ``if TYPE_CHECKING:``
are for annotations only and do not. (The plugin manager loads the built-ins by name, through the
hooks: that is how a plugin of any layer's choosing is found, not an import.)

Within a layer the imports form no cycle either: not between two modules (``a`` imports ``b``, which
imports ``a``, at the top or inside a function), and not between two parts of the package (modeling
imports artifacts, which imports modeling). The parts of the domain layer are ordered, lowest first:
artifacts -> modeling -> data -> training -> evaluation, baselines, analysis (``DOMAIN_ORDER``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "bridgecli"

LAYERS: list[tuple[str, frozenset[str]]] = [
    ("base", frozenset({"bridgecli", "errors", "display", "optionspec", "io", "progress", "timings", "hookspecs"})),
    ("format and core", frozenset({"format", "core", "segmenting"})),
    ("runtime", frozenset({"runtime", "plugins", "registry", "contracts"})),
    ("domain", frozenset({"data", "artifacts", "modeling", "training", "evaluation", "baselines", "analysis"})),
    ("builtin", frozenset({"builtin"})),
    ("steps", frozenset({"steps"})),
    ("cli", frozenset({"cli", "__main__"})),
]
LEVEL = {part: level for level, (_, parts) in enumerate(LAYERS) for part in parts}
#: the domain layer's parts, lowest first: a part imports only those before it (or at its rank)
DOMAIN_ORDER: list[frozenset[str]] = [
    frozenset({"artifacts"}),
    frozenset({"modeling"}),
    frozenset({"data"}),
    frozenset({"training"}),
    frozenset({"evaluation", "baselines", "analysis"}),
]
DOMAIN_RANK = {part: rank for rank, parts in enumerate(DOMAIN_ORDER) for part in parts}


def part_of(module: str) -> str:
    """The top-level part of ``bridgecli`` that a dotted module name lies in (``bridgecli`` for the root)."""
    names = module.split(".")
    if len(names) == 1:
        return "bridgecli"
    return names[1] if (SRC / names[1]).is_dir() or (SRC / f"{names[1]}.py").exists() else "bridgecli"


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def imports(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, imported bridgecli module) for every import in ``source``, the text of ``module``; an
    import of names from a package counts as an import of each name that is one of its modules."""
    package = module if is_package else module.rsplit(".", 1)[0]
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node):
            for child in getattr(node, "orelse", []):
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "bridgecli")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] == "bridgecli":
                # from PACKAGE import X: X may be a module of its own
                subs = [f"{name}.{a.name}" for a in node.names if _is_module(f"{name}.{a.name}")]
                if name == "bridgecli":  # the root: a name that is no module is the root's (PRODUCER)
                    out.extend((node.lineno, f"bridgecli.{a.name}") for a in node.names)
                else:
                    out.extend((node.lineno, sub) for sub in subs)
                    if len(subs) < len(node.names):
                        out.append((node.lineno, name))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return out


def _is_module(name: str) -> bool:
    """Whether the dotted ``bridgecli`` name ``name`` is a module or package of the source tree."""
    path = SRC.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def upward(source: str, module: str, is_package: bool = False) -> list[str]:
    """Each import of ``source`` (the module ``module``) into a higher layer, as one line of text."""
    own = LEVEL[part_of(module)]
    bad = []
    for line, target in imports(source, module, is_package):
        level = LEVEL.get(part_of(target))
        assert level is not None, f"{module}:{line} imports {target}, which no layer holds"
        if level > own:
            bad.append(f"{module}:{line} imports {target} ({LAYERS[level][0]} is above {LAYERS[own][0]})")
    return bad


def module_of(name: str) -> str:
    """The module an imported name lies in: ``bridgecli.PRODUCER`` -> ``bridgecli``."""
    while not _is_module(name) and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def import_graph() -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports (at the top or inside a function)."""
    graph: dict[str, set[str]] = {}
    for path, name in _modules():
        found = {module_of(t) for _, t in imports(path.read_text(), name, path.name == "__init__.py")}
        graph[name] = found - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each strongly connected set of two or more nodes, as one cycle
    through it (a path that returns to its first node), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = set()
            while True:
                w = stack.pop()
                members.add(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(_one_cycle(graph, members))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _one_cycle(graph: dict[str, set[str]], members: set[str]) -> list[str]:
    """A cycle through the smallest member of the strongly connected set ``members`` (breadth first)."""
    start = min(members)
    came = {start: start}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, ())):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came[path[-1]])
                return [*reversed(path), start]
            if w in members and w not in came:
                came[w] = v
                queue.append(w)
    raise AssertionError("a strongly connected set without a cycle")


def _modules() -> list[tuple[Path, str]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.append((path, name))
    return out


def test_every_part_of_the_package_has_a_layer():
    parts = {
        p.name if p.is_dir() else p.stem for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    parts = {("bridgecli" if p == "__init__" else p) for p in parts}
    assert parts - set(LEVEL) == set(), "give each new part of the package a layer here and in README.md"
    assert set(LEVEL) - parts == set(), "a layer names a part that no longer exists"


def test_no_module_imports_a_layer_above_its_own():
    bad = []
    for path, name in _modules():
        bad += upward(path.read_text(), name, path.name == "__init__.py")
    assert not bad, "\n".join(bad)


def test_the_cli_calls_the_steps_only():
    """cli/ parses, calls a step and reports: of the package it imports only steps/ and the base layer."""
    bad = []
    for module, targets in import_graph().items():
        if part_of(module) in ("cli", "__main__"):
            bad += [f"{module} imports {t}" for t in targets if LEVEL[part_of(t)] not in (0, LEVEL["steps"], LEVEL["cli"])]
    assert not bad, "\n".join(bad)


def test_no_two_modules_import_each_other():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_two_parts_of_the_package_import_each_other():
    parts: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        parts.setdefault(part_of(module), set()).update(part_of(t) for t in targets)
    found = cycles({part: targets - {part} for part, targets in parts.items()})
    assert not found, "import cycles between parts:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_domain_parts_import_only_those_below():
    assert set(DOMAIN_RANK) == LAYERS[LEVEL["data"]][1], "give each domain part its rank in DOMAIN_ORDER"
    bad = []
    for module, targets in import_graph().items():
        own = DOMAIN_RANK.get(part_of(module))
        for target in targets:
            other = DOMAIN_RANK.get(part_of(target))
            if own is not None and other is not None and part_of(target) != part_of(module) and other >= own:
                bad.append(f"{module} imports {target}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "graph, found",
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b", "a"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}, [["a", "b", "c", "a"]]),
        ({"x": {"y"}, "y": {"x"}, "a": {"b"}, "b": {"a"}}, [["a", "b", "a"], ["x", "y", "x"]]),
    ],
)
def test_the_check_finds_a_cycle(graph, found):
    assert cycles(graph) == found


def test_a_function_level_import_of_a_module_by_name_is_an_edge():
    source = "def f():\n    from ..training import checkpoint\n"
    assert imports(source, "bridgecli.artifacts.train_run") == [(2, "bridgecli.training.checkpoint")]
    assert imports("from . import score_torchrun, nothing_here\n", "bridgecli.steps.score") == [
        (1, "bridgecli.steps.score_torchrun"),
        (1, "bridgecli.steps"),
    ]


@pytest.mark.parametrize(
    "module, source, found",
    [
        ("bridgecli.format.merge", "from ..steps.workers import _Pool\n", True),
        ("bridgecli.analysis.tokenclass", "def f():\n    from ..builtin.segmenters import split_math\n", True),
        ("bridgecli.modeling.loading", "from bridgecli.steps import params\n", True),
        ("bridgecli.runtime.ranks", "from .. import registry\n", False),  # the same layer
        ("bridgecli.runtime.ranks", "from .. import PRODUCER\n", False),  # the root: base
        (
            "bridgecli.core.select",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..steps import x\n",
            False,
        ),
        ("bridgecli.steps.score", "from ..cli import app\n", True),
    ],
)
def test_the_check_finds_an_upward_import(module, source, found):
    assert bool(upward(source, module)) is found

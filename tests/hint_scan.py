"""A static scan of the flags that bridge's user-facing texts name, per command (tests/test_hints.py).

For each command, the code it can run is found from its Typer callback by following names through
bridgecli's source: a reachability over the AST at the level of functions, not an import closure
(which would give every command nearly every module):

- a unit is a module-level function, a module-level constant (``NAME = ...``), the rest of a module's
  top level, a class's body or one of its methods;
- a unit reaches what the names in it resolve to: functions, constants and classes of its own module
  and those imported anywhere in it (``from ..x import f``, ``import x``, ``x.f``); ``C.m`` reaches the
  method, a class named bare (made, passed, or an annotation) every method of it, and ``self.m`` in a
  method the class's own (or its bases') ``m``;
- plugins are found by name at run time: a call ``registry.get("KIND", ...)`` reaches the built-in
  hook implementations that register that kind (``register_selectors`` for ``"selector"``, from
  :data:`bridgecli.registry.KINDS`) and what they register; a ``get`` whose kind is not written out
  reaches every kind's. Listing plugins (``collect``, ``names``) runs none of them. The built-in eval
  tasks and scorers import their code by name when called (:data:`DEFERRED`): making one reaches it;
- option declarations (``option(...)``, ``group(...)``, ``Spec(...)``) are not followed: a command
  runs the ``parse``/``build`` functions of the flags it has (:func:`option_entries`), which are
  entries of their own; and their help texts are checked where the command shows them (its
  ``--help``), not here.

The texts of a reachable unit are its string literals (f-strings with their fields left out) that
name a ``--flag``: not docstrings, not a string that is only flags (``"--ro-bind"``, an argument of a
subprocess; ``"--bf16/--no-bf16"``), not an argument of a string method (``.replace("--x ", "")``), not
a constant whose name ends in ``HELP``. A flag a text names is
the command's own, except in a command line written out: ``bridge CMD ... --flag`` (in backticks,
or without them up to the end of its clause) names CMD's flag, and a backticked command line of
another program (```pip install --no-deps ...```, or one of :data:`OTHER_PROGRAMS` without backticks)
names none of bridge's.

What the scan cannot see: a flag built at run time (``f"--{name}"``), and code reached only through
an object whose class no reachable unit names. Elsewhere it over-approximates (a unit reached is taken
to show every text in it): tests/test_hints.py lists, with the reason, each text it reports that the
command cannot show."""

from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "bridgecli"
#: a flag: two dashes, a letter, letters, digits and inner dashes; not part of a longer word, and not
#: followed by an f-string field (``f"--lora-{name}"`` is built at run time)
FLAG = re.compile(r"(?<![\w-])--[a-z](?:[a-z0-9-]*[a-z0-9])?(?![\w\x00-])")
ONLY_FLAGS = re.compile(r"--[a-z][\w-]*(=.*)?(/--[a-z][\w-]*)*", re.S)
BACKTICKS = re.compile(r"`([^`]*)`")
#: a command line written out without backticks: ``bridge reference STREAM --model MODEL``, up to the
#: end of its clause
COMMAND_LINE = re.compile(r"(?<!`)\bbridge ([a-z][a-z -]*?[a-z])(?= |$)([^(;,`]*?)(?= or |[(;,`]|$)")
#: programs whose command lines bridge's texts write out without backticks (``torchrun --nproc-per-node N``)
OTHER_PROGRAMS = ("torchrun", "accelerate", "pip", "python", "python3", "bwrap")
OTHER_LINE = re.compile(rf"\b(?:{'|'.join(OTHER_PROGRAMS)})\b[^(;,`]*?(?= or |[(;,`]|$)")
#: the function through which plugins are looked up by name, and the package of the built-in plugins
PLUGIN_LOOKUP = ("bridgecli.registry", "get")
BUILTIN = "bridgecli.builtin"
#: the classes that import code by name when called (``_Task("gsm8k", "gsm8k_task")`` runs
#: ``bridgecli.evaluation.gsm8k.gsm8k_task``): a call of one reaches ``PACKAGE.<arg 0>.<arg 1>``
DEFERRED = {
    ("bridgecli.builtin.eval_tasks", "_Task"): "bridgecli.evaluation",
    ("bridgecli.builtin.scorers", "_Factory"): "bridgecli.modeling",
}
#: string methods whose arguments are patterns, not texts (``how.replace("--model MODEL ", "")``)
STR_METHODS = {"replace", "startswith", "endswith", "split", "removeprefix", "removesuffix", "partition"}
#: option declarations (not followed; see the module docstring)
DECLARATIONS = {("bridgecli.optionspec", name) for name in ("option", "group", "Spec")}

Unit = tuple[str, str]  # (module, "" | "NAME" (a function) | "=NAME" (a constant) | "C" (a class body) | "C.m")


def module_path(name: str) -> Path | None:
    base = SRC.joinpath(*name.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def all_modules() -> list[str]:
    out = []
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append(".".join(parts))
    return out


@dataclass
class Module:
    name: str
    tree: ast.Module
    imports: dict[str, tuple[str, str | None]]  # local name -> (module, attribute or None)
    units: dict[str, list[ast.AST]]  # unit name -> its nodes
    classes: dict[str, ast.ClassDef]
    docstrings: set[int]


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _imports(name: str, path: Path, tree: ast.Module) -> dict[str, tuple[str, str | None]]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):  # imports anywhere in the module (many are inside functions)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    out[alias.asname or PACKAGE] = (alias.name if alias.asname else PACKAGE, None)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] == PACKAGE:
                for alias in node.names:
                    out[alias.asname or alias.name] = (base, alias.name)
    return out


@cache
def parse(name: str) -> Module:
    path = module_path(name)
    assert path is not None, name
    tree = ast.parse(path.read_text(), str(path))
    units: dict[str, list[ast.AST]] = {"": []}
    classes = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            units[node.name] = [node]
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = node
            units[node.name] = [*node.decorator_list, *node.bases]
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    units[f"{node.name}.{item.name}"] = [item]
                else:
                    units[node.name].append(item)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            for n in names:
                units[f"={n}"] = [node.value]
            if not names:
                units[""].append(node)
        else:
            units[""].append(node)
    return Module(name, tree, _imports(name, path, tree), units, classes, _docstrings(tree))


def _class_units(module: str, cls: str) -> set[Unit]:
    return {(module, u) for u in parse(module).units if u == cls or u.startswith(cls + ".")}


def resolve(module: str, name: str, depth: int = 0) -> set[Unit] | str | None:
    """What ``name`` means in ``module``: units, a module's name (str), or None (not bridgecli's)."""
    if depth > 20 or module_path(module) is None:
        return None
    mod = parse(module)
    if name in mod.classes:
        return _class_units(module, name)
    if name in mod.units and name:
        return {(module, name)}
    if f"={name}" in mod.units:
        return {(module, f"={name}")}
    if name in mod.imports:
        base, attr = mod.imports[name]
        if attr is None:
            return base if module_path(base) else None
        if module_path(f"{base}.{attr}"):
            return f"{base}.{attr}"
        return resolve(base, attr, depth + 1)
    if module_path(f"{module}.{name}"):
        return f"{module}.{name}"
    return None


def _chain(node: ast.AST) -> list[str] | None:
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    names.append(node.id)
    return names[::-1]


def resolve_chain(module: str, chain: list[str]) -> set[Unit] | str | None:
    """``a.b.c`` in ``module``: through modules, and from a class to one of its methods."""
    target = resolve(module, chain[0])
    for attr in chain[1:]:
        if isinstance(target, str):
            target = resolve(target, attr)
        elif isinstance(target, set):
            classes = {u for u in target if "." not in u[1] and u[1] and not u[1].startswith("=")}
            if len(classes) == 1 and parse(next(iter(classes))[0]).classes.get(next(iter(classes))[1]) is not None:
                (mod, cls), = classes
                return method(mod, cls, attr) | {(mod, cls)}
            return target
        else:
            return None
    return target


def method(module: str, cls: str, name: str, depth: int = 0) -> set[Unit]:
    """``cls.name`` (or a base class's, where the base is bridgecli's); empty where none is found."""
    mod = parse(module)
    if f"{cls}.{name}" in mod.units:
        return {(module, f"{cls}.{name}")}
    if depth > 10 or cls not in mod.classes:
        return set()
    for base in mod.classes[cls].bases:
        chain = _chain(base)
        target = resolve_chain(module, chain) if chain else None
        if isinstance(target, set):
            for bmod, bname in target:
                if bname in parse(bmod).classes:
                    found = method(bmod, bname, name, depth + 1)
                    if found:
                        return found
    return set()


def _walk_outside_declarations(module: str, node: ast.AST):
    """ast.walk, less the subtrees of option declarations."""
    todo = [node]
    while todo:
        current = todo.pop()
        if isinstance(current, ast.Call):
            callee = _callee(module, current.func)
            if isinstance(callee, set) and callee & DECLARATIONS:
                continue
        yield current
        todo.extend(ast.iter_child_nodes(current))


def _callee(module: str, func: ast.AST) -> set[Unit] | str | None:
    chain = _chain(func)
    return resolve_chain(module, chain) if chain else None


@cache
def plugin_units(kind: str | None) -> frozenset[Unit]:
    """The built-in hook implementations that register ``kind`` (every kind's for None)."""
    from bridgecli.registry import KINDS

    hooks = set(KINDS.values()) if kind is None else {KINDS[kind]}
    return frozenset(
        (m, n) for m in all_modules() if m.startswith(BUILTIN + ".") for n in parse(m).units if n in hooks
    )


@cache
def edges(unit: Unit) -> frozenset[Unit]:
    """The units that ``unit`` names (see the module docstring)."""
    module, name = unit
    mod = parse(module)
    own_class = name.split(".")[0] if "." in name else None
    out: set[Unit] = set()
    inner: set[int] = set()  # the Name or Attribute under an attribute chain already followed
    for root in mod.units[name]:
        for node in _walk_outside_declarations(module, root):
            if id(node) in inner:
                continue
            target: set[Unit] | str | None = None
            if isinstance(node, ast.Call):
                callee = _callee(module, node.func)
                if callee == {PLUGIN_LOOKUP}:
                    kind = node.args[0] if node.args else None
                    out |= plugin_units(kind.value if isinstance(kind, ast.Constant) else None)
                for key, package in DEFERRED.items():
                    if isinstance(callee, set) and key in callee:
                        where, what = (a.value for a in node.args[:2])
                        found = resolve(f"{package}.{where}", what)
                        assert isinstance(found, set), (key, where, what)
                        out |= found
            if isinstance(node, ast.Name):
                target = resolve(module, node.id)
            elif isinstance(node, ast.Attribute):
                chain = _chain(node)
                if chain is None:
                    continue
                below = node.value
                while isinstance(below, ast.Attribute):
                    inner.add(id(below))
                    below = below.value
                inner.add(id(below))
                if chain[0] in ("self", "cls") and own_class is not None and len(chain) > 1:
                    target = method(module, own_class, chain[1])
                else:
                    target = resolve_chain(module, chain)
            if isinstance(target, set):
                out |= target
            elif isinstance(target, str):
                out.add((target, ""))
    out.discard(unit)
    return frozenset(out)


def reachable(starts: set[Unit]) -> set[Unit]:
    seen: set[Unit] = set()
    todo = list(starts)
    while todo:
        unit = todo.pop()
        if unit in seen:
            continue
        seen.add(unit)
        todo.extend(edges(unit) - seen)
    return seen


def option_entries(options: type) -> set[Unit]:
    """The ``parse`` and ``build`` functions of the flags that the options type ``options`` gives its
    command (as :mod:`bridgecli.cli.build` walks it: groups, ``only``, ``exclude``, switches)."""
    import functools

    from bridgecli.optionspec import Group, Parse

    out: set[Unit] = set()

    def unit_of(fn) -> None:
        if isinstance(fn, Parse):
            unit_of(fn.value)
            unit_of(fn.text)
            return
        while isinstance(fn, functools.partial):
            fn = fn.func
        module = getattr(fn, "__module__", None) or ""
        if module.split(".")[0] != PACKAGE:
            return
        out.add(unit_at(module, fn.__code__.co_firstlineno))

    def walk(cls: type, group: Group) -> None:
        if group.switch is not None:
            unit_of(group.build)
        for f in group.fields(cls):
            if "group" in f.metadata:
                sub = f.metadata["group"]
                kind = f.default_factory.func if isinstance(f.default_factory, functools.partial) else None
                if kind is None and dataclasses.is_dataclass(f.type):
                    kind = f.type
                if kind is not None:
                    walk(kind, sub)
            else:
                unit_of(f.metadata["option"].parse)

    walk(options, Group())
    return out


def unit_at(module: str, line: int) -> Unit:
    """The unit of ``module`` whose code holds ``line`` (a lambda or an inner function: the unit around it)."""
    for name, nodes in parse(module).units.items():
        for node in nodes:
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            if first <= line <= (node.end_lineno or node.lineno):
                return (module, name)
    raise AssertionError(f"{module}: no unit holds line {line}")


@cache
def texts(unit: Unit) -> list[tuple[int, str]]:
    """(line, text) of every string literal of ``unit`` that names a flag (see the module docstring)."""
    module, name = unit
    if name.startswith("=") and name.endswith("HELP"):
        return []
    mod = parse(module)
    found = []
    fields: set[int] = set()  # the parts of f-strings, and the arguments of str methods: not texts
    for root in mod.units[name]:
        for node in _walk_outside_declarations(module, root):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in STR_METHODS:
                fields.update(id(a) for a in node.args)
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "\x00" for v in node.values)
                fields.update(id(v) for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) in fields or id(node) in mod.docstrings:
                    continue
                text = node.value
            else:
                continue
            if FLAG.search(text) and not ONLY_FLAGS.fullmatch(text):
                found.append((node.lineno, text))
    return sorted(found)


@dataclass(frozen=True)
class Named:
    """A flag that a text names, and the command whose flag it must be (None: the command that shows it)."""

    flag: str
    command: str | None
    module: str
    line: int
    text: str


def flags_in(text: str, commands: set[str] | frozenset[str]) -> list[tuple[str, str | None]]:
    """(flag, whose) for each flag ``text`` names: whose is a command path (``analyze fidelity``; "?" for a
    ``bridge`` command line naming none of ``commands``) where the flag is in a command line of bridge,
    None where it is the flag of the command that shows the text. Another program's command line
    (backticked, or starting with one of :data:`OTHER_PROGRAMS`) names none."""
    out: list[tuple[str, str | None]] = []

    def command_of(words: list[str]) -> str:
        found = [" ".join(words[:k]) for k in range(len(words), 0, -1) if " ".join(words[:k]) in commands]
        return found[0] if found else "?"

    rest = text
    for quoted in BACKTICKS.findall(text):
        rest = rest.replace(f"`{quoted}`", " ", 1)
        words = quoted.split()
        if words and words[0] == "bridge":
            out += [(f, command_of(words[1:])) for f in FLAG.findall(quoted)]
    for written in COMMAND_LINE.finditer(rest):
        rest = rest.replace(written.group(0), " ", 1)
        out += [(f, command_of(written.group(0).split()[1:])) for f in FLAG.findall(written.group(0))]
    for written in OTHER_LINE.finditer(rest):
        rest = rest.replace(written.group(0), " ", 1)
    out += [(f, None) for f in FLAG.findall(rest)]
    return out


def named_flags(unit: Unit, commands: set[str] | frozenset[str]) -> list[Named]:
    """The flags that the texts of ``unit`` name (:func:`flags_in`)."""
    return list(_named_flags(unit, frozenset(commands)))


@cache
def _named_flags(unit: Unit, commands: frozenset[str]) -> tuple[Named, ...]:
    return tuple(Named(f, whose, unit[0], line, text) for line, text in texts(unit) for f, whose in flags_in(text, commands))


def path_to(starts: set[Unit], target: Unit) -> list[Unit]:
    """A shortest chain of units from one of ``starts`` to ``target`` (for a failure's message)."""
    parent: dict[Unit, Unit | None] = {s: None for s in starts}
    todo = list(starts)
    while todo:
        unit = todo.pop(0)
        if unit == target:
            chain = [unit]
            while parent[chain[-1]] is not None:
                chain.append(parent[chain[-1]])  # type: ignore[arg-type]
            return chain[::-1]
        for nxt in sorted(edges(unit)):
            if nxt not in parent:
                parent[nxt] = unit
                todo.append(nxt)
    return []

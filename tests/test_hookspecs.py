"""The plugin contracts of hookspecs.py: every built-in is what its Protocol says, a plain selector
function gets the rest of the Selector contract, and the plan of a first pass is explicit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bridgecli import registry
from bridgecli.baselines.selector import Baseline
from bridgecli.core.select import SelectionResult
from bridgecli.errors import FormatError, PluginError, UsageError
from bridgecli.format.records import Array, Example, Scores, Tokens
from bridgecli.format.spec import EOS, PROMPT, RESPONSE, TEMPLATE
from bridgecli.hookspecs import FunctionSelector, Plan, Selector, as_selector
from bridgecli.steps.select import select_example


def example(index: int, m: int, n: int) -> Example:
    kinds = [TEMPLATE] + [PROMPT] * m + [TEMPLATE] + [RESPONSE] * n + [EOS]
    rng = np.random.default_rng(index)
    scores = Scores(scorer="bridge", a=Array.of(rng.normal(size=n)), c=Array.of(rng.random(n) * 0.1),
                    A=Array.of(rng.random((n, m)) / m, "float16"), loss=Array.of(rng.random(n)))
    return Example(id=f"ex{index}", index=index, text="", scores=scores, tokens=Tokens(
        input_ids=list(range(10, 10 + len(kinds))), kinds=bytes(kinds), offsets=[0, 0] * len(kinds)))


def test_every_registered_selector_is_a_selector():
    for name in registry.names("selector"):
        sel = as_selector(registry.get("selector", name).obj, name)
        assert isinstance(sel, Selector) and not isinstance(sel, FunctionSelector), name
    assert as_selector(registry.get("selector", "bridge").obj).surrogate
    assert not as_selector(registry.get("selector", "random").obj).surrogate


def test_a_plain_function_gets_the_defaults():
    calls = []

    def first_tokens(ex, b_p, b_r, options):
        calls.append(dict(options))
        return SelectionResult(prompt=np.arange(b_p), response=np.arange(b_r),
                               response_scores=np.zeros(len(ex.tokens.response_positions())))

    sel = as_selector(first_tokens, "first")
    assert isinstance(sel, Selector) and not sel.protects and not sel.surrogate
    assert not sel.needs_plan({}) and sel.parse({"k": "v"}) == {"k": "v"}
    ex = example(0, 4, 8)
    assert sel.budgets(ex, 0.5, 0.25, {}) == (2, 2)  # ceil(rho * eligible)
    out = select_example(ex, sel, "first", 0.5, 0.25, sel.parse({"k": "v"}))
    assert out.selection.b_p == 2 and out.selection.b_r == 2 and calls == [{"k": "v"}]

    first_tokens.protects = True
    first_tokens.parse = lambda options: {**options, "k": int(options["k"])}
    sel = as_selector(first_tokens)
    assert sel.protects and sel.parse({"k": "3"}) == {"k": 3}


def test_the_old_function_attributes_are_refused_by_name():
    def old(ex, b_p, b_r, options):
        raise AssertionError

    old.prepare = lambda *a: {}
    with pytest.raises(PluginError, match="selector 'old' carries prepare"):
        as_selector(old, "old")
    with pytest.raises(PluginError, match="not callable"):
        as_selector(42, "x")


def test_the_plan_is_explicit_and_parse_runs_once(monkeypatch):
    # a response-side method: its budgets come from matching the total tokens, a first pass
    method = Baseline("toy", "response", response_score=lambda ex, o: -np.arange(len(ex.tokens.response_positions())))
    parsed = method.parse({})
    assert method.needs_plan(parsed)
    examples = [example(i, 6, 10) for i in range(3)]
    plan = method.prepare(iter(examples), 0.5, 0.5, parsed)
    assert isinstance(plan, Plan) and set(plan.budgets) == {0, 1, 2} and plan.summary
    assert "_budgets" not in parsed  # nothing hidden in the options
    calls = []
    real = type(method).parse
    monkeypatch.setattr(type(method), "parse", lambda self, o: calls.append(1) or real(self, o))
    out = [select_example(ex, method, method.name, 0.5, 0.5, parsed, plan=plan) for ex in examples]
    assert calls == []  # the step parsed once; no per-example parse
    assert [(e.selection.b_p, e.selection.b_r) for e in out] == [plan.budgets[i] for i in range(3)]
    with pytest.raises(FormatError, match="first pass"):
        select_example(example(9, 6, 10), method, method.name, 0.5, 0.5, parsed, plan=plan)


def test_bad_options_fail_in_parse():
    with pytest.raises(UsageError, match="no option 'x'"):
        as_selector(registry.get("selector", "bridge").obj).parse({"x": "1", "rounds": 4})


def _imports(path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function, as an absolute name."""
    import ast

    package = ".".join(("bridgecli", *path.relative_to(SRC).with_suffix("").parts[:-1]))
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            name = ".".join(x for x in (base, node.module) if x)
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)
    return out


SRC = Path(__file__).resolve().parents[1] / "src" / "bridgecli"


@pytest.mark.parametrize("files, forbidden", [
    (["plugins.py"], "bridgecli.registry"),  # the registry reads the manager, not the other way round
    (["baselines/*.py"], "bridgecli.steps"),  # the steps use the methods, not the other way round
    (["hookspecs.py", "artifacts/*.py"], "bridgecli.steps"),
])
def test_no_import_back(files, forbidden):
    for pattern in files:
        for path in SRC.glob(pattern):
            bad = sorted(m for m in _imports(path) if m == forbidden or m.startswith(forbidden + "."))
            assert not bad, f"{path.relative_to(SRC)} imports {bad}"


@pytest.mark.integration  # starts a Python process
def test_artifacts_import_no_torch():
    import subprocess
    import sys

    code = ("import sys\nimport bridgecli.artifacts.warmup_run, bridgecli.artifacts.rows_meta, "
            "bridgecli.artifacts.train_run, bridgecli.artifacts.direction_file\nassert 'torch' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

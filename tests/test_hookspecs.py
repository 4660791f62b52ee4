"""The plugin contracts of hookspecs.py: every built-in is what its Protocol says, a plain selector
function gets the rest of the Selector contract, the plan of a first pass is explicit, an object is
checked against its Protocol when it registers, and optional members read as the Protocol's values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bridgecli import registry
from bridgecli.baselines.selector import Baseline
from bridgecli.core.select import SelectionResult
from bridgecli.errors import FormatError, PluginError, UsageError
from bridgecli.evaluation.run import check_summary
from bridgecli.format.records import Array, Example, Scores, Tokens
from bridgecli.format.spec import EOS, PROMPT, RESPONSE, TEMPLATE
from bridgecli.contracts import FunctionSelector, as_eval_task, as_scorer_factory, as_selector, build_scorer
from bridgecli.hookspecs import Plan, Selector
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


def test_hookspecs_holds_declarations_only():
    """Every function in hookspecs.py (a hook, a Protocol's member) has no body beyond its docstring or
    ``...``; the helpers that do something live in contracts.py."""
    import ast

    tree = ast.parse((SRC / "hookspecs.py").read_text())
    bodies = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            code = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            bodies[node.name] = code
    assert bodies and not {name for name, code in bodies.items() if code}


@pytest.mark.integration  # starts a Python process
def test_artifacts_import_no_torch():
    import subprocess
    import sys

    code = ("import sys\nimport bridgecli.artifacts.warmup_run, bridgecli.artifacts.rows_meta, "
            "bridgecli.artifacts.train_run, bridgecli.artifacts.direction_file\nassert 'torch' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --- registration checks against the Protocols, declared optional members ---------------------------


def _plugin(hook: str, name: str, obj):
    from bridgecli import hookimpl

    class Plugin:
        pass

    def register(self, register):
        register(name, obj, "a test plugin's")

    setattr(Plugin, hook, hookimpl(register))
    return Plugin()


class _HalfSelector:
    """Has part of the Selector contract: parse and needs_plan but no budgets, prepare or flags."""

    def parse(self, options):
        return options

    def needs_plan(self, options):
        return False

    def __call__(self, example, b_p, b_r, options):
        raise AssertionError


class _Task:
    def __init__(self, **declared):
        self.__dict__.update(declared)

    def __call__(self, model, tokenizer, options):
        raise AssertionError


@pytest.mark.parametrize("hook, kind, obj, message", [
    ("register_segmenters", "segmenter", "not a function", "the segmenter 'bad', which is not callable"),
    ("register_scorers", "scorer", 42, "the scorer 'bad', which is not callable"),
    ("register_scorers", "scorer", type("F", (), {"warm_kernels": "yes", "__call__": lambda s, ctx: None})(),
     "the scorer 'bad' with warm_kernels = 'yes', not a bool"),
    ("register_selectors", "selector", _HalfSelector(), "the selector 'bad' without 'protects'"),
    ("register_eval_tasks", "eval_task", object(), "the eval task 'bad', which is not callable"),
    ("register_eval_tasks", "eval_task", _Task(engines="lm-eval"),
     "the eval task 'bad' with engines = 'lm-eval', not a tuple of str"),
    ("register_eval_tasks", "eval_task", _Task(runs_code="yes"), "the eval task 'bad' with runs_code = 'yes', not a bool"),
])
def test_registering_checks_the_object_against_its_protocol(manager, hook, kind, obj, message):
    manager.register(_plugin(hook, "bad", obj), name="bad-plugin")
    with pytest.raises(PluginError) as err:
        registry.get(kind, "bad")
    assert "plugin bad-plugin registered " + message in str(err.value)
    assert "bridgecli.hookspecs." in str(err.value)  # where the contract is written


def test_a_plain_function_selector_and_task_still_register(manager):
    def first_tokens(ex, b_p, b_r, options):
        raise AssertionError

    def task(model, tokenizer, options):
        raise AssertionError

    manager.register(_plugin("register_selectors", "first", first_tokens), name="sel-plugin")
    manager.register(_plugin("register_eval_tasks", "plain", task), name="task-plugin")
    assert registry.get("selector", "first").obj is first_tokens
    declared = as_eval_task(registry.get("eval_task", "plain").obj)  # the Protocol's values stand in
    assert (declared.runs_code, declared.engines, declared.metric, declared.default_data) == (
        False, ("bridge",), "accuracy", None)
    task.runs_code = True
    assert as_eval_task(task).runs_code is True


def test_the_builtins_declare_what_they_can_do():
    declared = {n: as_eval_task(registry.get("eval_task", n).obj) for n in registry.names("eval_task")}
    assert {n for n, t in declared.items() if t.runs_code} == {"humaneval", "mbpp"}
    assert {n for n, t in declared.items() if "lm-eval" in t.engines} == {"arc_challenge", "arc_easy", "hellaswag",
                                                                          "mmlu"}
    assert {n for n, t in declared.items() if t.metric == "loss"} == {"heldout-loss", "answer-loss"}
    assert all(isinstance(t.default_data, str) for t in declared.values())
    factories = {n: as_scorer_factory(registry.get("scorer", n).obj) for n in registry.names("scorer")}
    assert {n for n, f in factories.items() if f.warm_kernels} == {"bridge"}


def test_a_built_scorer_gets_the_optional_members_and_errors_name_the_flag():
    from bridgecli.modeling.scoring import DoneScores

    class Plain:
        def score(self, batch):
            return ["s"] * len(batch)

    scorer = build_scorer(lambda ctx: Plain(), None, "--scorer plain", "p")
    assert (scorer.startup_note, scorer.max_tokens_cuda, scorer.launch) == (None, None, None)
    assert scorer.score([1, 2]) == ["s", "s"]

    class Queued(Plain):
        startup_note = "compiling"

        def launch(self, batch):
            return DoneScores(self.score(batch))

    scorer = build_scorer(lambda ctx: Queued(), None, "--scorer q", "p")
    assert scorer.startup_note == "compiling" and scorer.launch([1]).result() == ["s"]

    with pytest.raises(PluginError, match="--scorer none: plugin p built a scorer without 'score'"):
        build_scorer(lambda ctx: object(), None, "--scorer none", "p")

    def refusing(ctx):
        raise UsageError("unknown option 'x' (scorer options: none)")

    with pytest.raises(UsageError, match=r"^--scorer r: unknown option 'x' \(scorer options: none\)$"):
        build_scorer(refusing, None, "--scorer r", "p")


def test_eval_checks_what_a_plugin_task_declares(manager, monkeypatch, tmp_path):
    """A plugin task that runs model-written code says so, and gets the built-in code tasks' opt-in; one
    that declares only bridge's engine is refused by --engine lm-eval; both before any model loads."""
    from bridgecli.steps.eval import check_eval_options
    from bridgecli.steps.options import EvalRunOptions

    monkeypatch.delenv("BRIDGE_ALLOW_CODE_EXECUTION", raising=False)
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    manager.register(_plugin("register_eval_tasks", "coder", _Task(runs_code=True)), name="coder-plugin")
    with pytest.raises(UsageError, match="runs model-written code"):
        check_eval_options(EvalRunOptions(model="m", tasks=["coder"], data=[str(data)]))
    with pytest.raises(UsageError, match="--engine lm-eval runs arc_challenge, arc_easy, hellaswag, mmlu; not coder"):
        check_eval_options(EvalRunOptions(model="m", tasks=["coder"], data=[str(data)], engine="lm-eval"))


def test_a_summary_must_hold_the_declared_metric():
    check_summary({"accuracy": 0.5, "correct": 1}, "accuracy", "t")
    check_summary({"accuracy": 0.5, "correct": 1, "metric": "acc"}, "acc", "t")
    check_summary({"metric": "loss", "loss": 1.0, "ci_low": 0.9, "ci_high": 1.1}, "loss", "t")
    with pytest.raises(PluginError, match="t declares the metric 'loss' but its summary has no number 'loss'"):
        check_summary({"accuracy": 0.5, "correct": 1}, "loss", "t")
    with pytest.raises(PluginError, match="declares the metric 'loss' but its summary says None"):
        check_summary({"loss": 1.0, "ci_low": 0.9, "ci_high": 1.1}, "loss", "t")
    with pytest.raises(PluginError, match="declares the metric 'accuracy' but its summary says 'pass@1'"):
        check_summary({"accuracy": 0.5, "correct": 1, "metric": "pass@1"}, "accuracy", "t")

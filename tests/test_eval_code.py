"""bridge eval --task humaneval/mbpp: the sandbox, program assembly, loading, the tasks with fake generation."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from bridgecli.errors import InputError, UsageError
from bridgecli.evaluation import code_tasks
from bridgecli.evaluation.code_tasks import extract_code, humaneval_program
from bridgecli.evaluation import sandbox
from bridgecli.evaluation.sandbox import Limits, bwrap_problem, isolation
from bridgecli.evaluation.tasks import EvalOptions
from sandbox_probes import EXPECT, FORGED_TEST, FORGERIES

FAST = Limits(timeout=3, memory_mb=512)
UNSAFE = bwrap_problem() is not None  # without bwrap these tests use the unsafe runner (tests/test_sandbox.py skips)


def run_program(source, limits=Limits()):
    return sandbox.run_program(source, limits, unsafe=UNSAFE)


def run_programs(sources, limits=Limits()):
    return sandbox.run_programs(sources, limits, unsafe=UNSAFE)


def opts(**kwargs) -> EvalOptions:
    return EvalOptions(allow_code_execution=True, unsafe_code_execution=UNSAFE, **kwargs)


# -- the sandbox ------------------------------------------------------------------------------

@pytest.mark.integration  # runs programs in the sandbox
def test_passing_and_failing_programs():
    passed, failed, exited = run_programs(["def f(x):\n    return x + 1\nassert f(1) == 2\n",
                                           "assert 1 == 2, 'nope'\n",
                                           "import sys\nsys.exit(0)\n"], FAST)
    assert passed.status == "passed" and passed.passed and passed.error == ""
    assert failed.status == "failed" and failed.error == "AssertionError: nope" and not failed.passed
    assert exited.status == "failed" and "SystemExit" in exited.error  # exiting early is not passing


EARLY_EXITS = {
    "os._exit": "    import os\n    os._exit(0)\n",
    "ctypes _exit": "    import ctypes\n    ctypes.CDLL(None)._exit(0)\n",
    "exec true": "    import os\n    os.execv('/bin/true', ['true'])\n",
}
CHEAT_TEST = "def check(candidate):\n    assert candidate(1) == 999\n"


@pytest.fixture(params=["default", "unsafe"])
def unsafe(request, monkeypatch) -> bool:
    """Each runner in turn: the default one (bwrap, where it works) and the unsafe one, as a machine
    without bwrap falls back to it. True where the unsafe runner runs."""
    if request.param == "unsafe":
        monkeypatch.setattr(sandbox, "_probe", lambda: (None, "bubblewrap (bwrap) is not installed"))
    return UNSAFE or request.param == "unsafe"


@pytest.mark.integration  # runs programs in the sandbox
@pytest.mark.parametrize("how", sorted(EARLY_EXITS))
def test_exiting_0_before_the_asserts_is_not_passing(unsafe, how):
    # issue 30: exit status 0 counted as passed, so a solution that ends the process before the
    # test's asserts run was graded passed; now only the runner's success signal counts
    program = sandbox.Program(f"def inc(x):\n{EARLY_EXITS[how]}\n", f"{CHEAT_TEST}\ncheck(inc)\n")
    outcome = sandbox.run_program(program, FAST, unsafe=unsafe)
    assert outcome.status == "failed" and not outcome.passed, (outcome.status, outcome.error)
    assert unsafe or "no success signal" in outcome.error  # the unsafe runner's guard refuses some of them first
    whole = sandbox.run_program(program.text, FAST, unsafe=unsafe)  # no test of its own
    assert whole.status == "failed" and (unsafe or "no success signal" in whole.error)
    honest = sandbox.run_program("def inc(x):\n    return x + 1\nassert inc(1) == 2\n", FAST, unsafe=unsafe)
    assert honest.passed


@pytest.mark.integration  # runs programs in the sandbox
@pytest.mark.parametrize("how", sorted(FORGERIES))
def test_a_solution_cannot_forge_its_pass(unsafe, how):
    # issue 40: the runner kept the token and the result descriptor as locals of the function that
    # ran the program, which read them (frames, a traceback, gc) and wrote the token before its
    # asserts ran; now the test runs in a process the program cannot reach
    forged = sandbox.run_program(sandbox.Program(FORGERIES[how], FORGED_TEST, "", ("inc",)), FAST, unsafe=unsafe)
    # (a root evaluator's unsafe runner lets a ptrace stop the checker: a timeout)
    assert not forged.passed and forged.status in ("failed", "timeout"), (forged.status, forged.error, forged.stderr)
    if not unsafe:
        assert not {"READ", "OPENED", "ATTACHED"} & set(forged.stdout.split()), forged.stdout  # the checker is out of reach
    honest = sandbox.Program(f"def inc(x):\n    return {EXPECT}\n", FORGED_TEST, "", ("inc",))
    assert sandbox.run_program(honest, FAST, unsafe=unsafe).passed


@pytest.mark.integration  # runs programs in the sandbox
def test_what_crosses_to_the_checker():
    # plain values come back as themselves, objects of the program as handles that the checker can
    # call and ask about, never compare through the program
    source = textwrap.dedent("""
        import collections, enum
        class Color(enum.IntEnum):
            RED = 1
        class Node:
            def __init__(self, value, children=()):
                self.value, self.children = value, list(children)
            def __str__(self):
                return f"Node({self.value})"
        def values():
            return [1, 2.5, "s", b"b", (1, 2), {3}, frozenset({4}), {"k": [None, True]}, 2**80, -2**70, 1j,
                    float("inf"), Color.RED, collections.OrderedDict(a=1)]
        def tree():
            return Node(1, [Node(2), Node(3)])
        def depth(node):
            return 1 + max((depth(c) for c in node.children), default=0)
        def gen(n):
            yield from range(n)
        def raises(kind):
            raise kind("no")
        def sum(a, b):  # shadows the builtin, as MBPP task 126 does
            return a - b
    """)
    test = textwrap.dedent("""
        import math
        assert values() == [1, 2.5, "s", b"b", (1, 2), {3}, frozenset({4}), {"k": [None, True]}, 2**80, -2**70, 1j,
                            math.inf, 1, {"a": 1}]
        t = tree()
        assert t.value == 1 and str(t) == "Node(1)" and len(t.children) == 2 and depth(t) == 2
        assert [str(c) for c in t.children] == ["Node(2)", "Node(3)"] and t.children[1].value == 3
        assert t == t and t != tree() and t is not None
        assert list(gen(3)) == [0, 1, 2] and 2 in gen(3)
        try:
            raises(ValueError)
        except ValueError as exc:
            assert str(exc) == "no"
        else:
            raise AssertionError("no exception")
        assert sum(5, 3) == 2
    """)
    outcome = run_program(sandbox.Program(source, test, "", ("sum",)), FAST)
    assert outcome.passed, outcome.stderr


def _forging_humaneval(tmp_path: Path, names: list[str]) -> str:
    rows = [{"task_id": f"HumanEval/{i}", "prompt": "", "entry_point": "inc", "canonical_solution": "",
             "test": CHEAT_TEST} for i, _ in enumerate(names)]
    return _he_file(tmp_path, rows)


@pytest.mark.integration  # loads a (tiny) model and runs programs in the sandbox
def test_cli_eval_scores_forging_completions_0(tiny_model_dir, tmp_path, monkeypatch):
    # issue 40: through `bridge eval --task humaneval`, a completion that forged its pass scored
    from bridgecli.cli.app import app
    from typer.testing import CliRunner

    names = ["frame", "traceback", "gc", "equal to anything"]
    monkeypatch.setattr("bridgecli.evaluation.generate.generate",
                        lambda m, t, prompts, **kw: [FORGERIES[n] for n in names][:len(prompts)])
    out = tmp_path / "eval-humaneval.json"
    args = ["eval", str(tiny_model_dir), "--task", "humaneval", "--data", _forging_humaneval(tmp_path, names),
            "--allow-code-execution", "--device", "cpu", "--code-timeout", "5", "-o", str(out)]
    if UNSAFE:
        args.append("--unsafe-code-execution")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    run = json.loads(out.read_text())
    assert run["summary"]["pass@1"] == 0.0 and run["summary"]["n"] == len(names)
    assert [i["status"] for i in run["items"]] == ["failed"] * len(names)


@pytest.mark.integration  # runs programs in the sandbox
def test_infinite_loop_times_out():
    outcome = run_program("while True:\n    pass\n", Limits(timeout=1.5))
    assert outcome.status == "timeout" and not outcome.passed
    assert outcome.seconds < 10


@pytest.mark.integration  # runs programs in the sandbox
def test_memory_bomb_is_stopped():
    outcome = run_program("chunks = []\nwhile True:\n    chunks.append(' ' * 10**7)\n", FAST)
    assert outcome.status in ("memory", "killed") and not outcome.passed
    big = run_program("x = bytearray(10**10)\n", FAST)
    assert big.status == "memory"


@pytest.mark.integration  # runs programs in the sandbox
def test_output_flood_is_cut():
    outcome = run_program("import sys\nwhile True:\n    sys.stdout.write('x' * 10**6)\n", Limits(timeout=3, file_size_mb=1))
    assert not outcome.passed and outcome.status in ("failed", "killed")


@pytest.mark.integration  # runs programs in the sandbox
def test_writes_outside_the_work_folder_are_refused(tmp_path):
    target = tmp_path / f"escape-{uuid.uuid4().hex}.txt"
    outcome = run_program(f"open({str(target)!r}, 'w').write('x')\n", FAST)
    # the unsafe runner's guard refuses; in the bwrap sandbox the host folder does not exist
    assert outcome.status == "failed" and ("PermissionError" in outcome.error or "FileNotFoundError" in outcome.error)
    assert not target.exists()
    inside = run_program("open('scratch.txt', 'w').write('x')\nassert open('scratch.txt').read() == 'x'\n", FAST)
    assert inside.passed
    removal = run_program(f"import shutil\nshutil.rmtree({str(tmp_path)!r})\n", FAST)
    assert removal.status == "failed" and tmp_path.exists()


KILLER = textwrap.dedent('''
    import os, signal, sys
    from bridgecli.evaluation.sandbox import Limits, bwrap_problem, run_program
    src = sys.argv[1].replace("PARENT", str(os.getpid()))
    outcome = run_program(src, Limits(timeout=3), unsafe=bwrap_problem() is not None)
    print("SURVIVED", outcome.status)
''')


@pytest.mark.integration  # starts a Python process that runs the sandbox
@pytest.mark.parametrize("attack", [
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(PARENT, signal.SIGKILL)\n",
    "import importlib, os\nimportlib.reload(os)\nos.kill(PARENT, 9)\n",
    "import ctypes\nctypes.CDLL(None).kill(PARENT, 9)\nimport os\nos.killpg(0, 9)\n",
])
def test_program_cannot_kill_the_evaluator(attack):
    # The evaluator runs in a throwaway process, so a containment failure cannot take pytest down.
    if "ctypes" in attack and isolation() not in ("bwrap", "unsafe: pid+net namespaces"):
        pytest.skip("without namespaces a program using ctypes can signal processes of the same user")
    done = subprocess.run([sys.executable, "-c", KILLER, attack], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "SURVIVED" in done.stdout


@pytest.mark.integration  # runs programs in the sandbox
def test_no_network_with_namespaces():
    if isolation() not in ("bwrap", "unsafe: pid+net namespaces"):
        pytest.skip("network isolation needs bwrap or unshare")
    outcome = run_program("import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=2)\n", FAST)
    assert outcome.status == "failed" and "unreachable" in outcome.error.lower()


# -- program assembly -------------------------------------------------------------------------

PROBLEM = code_tasks.Problem(
    0, "HumanEval/0",
    'from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    """Sum of xs."""\n',
    "add",
    "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n",
)


def test_extract_code():
    assert extract_code("Here:\n```python\nx = 1\n```\nbye") == "x = 1\n"
    assert extract_code("```\ny = 2\n```") == "y = 2\n"
    assert extract_code("```text\nnot code\n```\n```py\nz = 3\n```") == "z = 3\n"
    assert extract_code("```python\nunterminated = 1\n") == "unterminated = 1\n"
    assert extract_code("plain") == "plain"
    # a reply that closes a block it never opened (models fine-tuned on plain-text answers write the code,
    # then the closing fence): the code before the fence, whatever follows it
    assert extract_code("def f():\n    return 1\n```") == "def f():\n    return 1\n"
    assert extract_code("def f():\n    return 1\n```\nThis returns one.") == "def f():\n    return 1\n"
    # balanced fences, or an odd count whose first fence opens a block, keep the earlier rules
    assert extract_code("Intro\n```python\nx = 1\n```\nthen ```") == "x = 1\n"
    assert extract_code("```\ny = 2\n```\n```") == "y = 2\n"
    assert extract_code("```\n") == ""


@pytest.mark.integration  # runs programs in the sandbox
@pytest.mark.parametrize("completion, chat, passes", [
    ("    return sum(xs)\n", False, True),  # base-model continuation of the body
    ("    return 0\n", False, False),
    ("Sure:\n```python\ndef add(xs):\n    return sum(xs)\n```\n", True, True),  # whole function, prompt imports kept
    ("```python\n    return sum(xs)\n```", True, True),  # body only
    ("```python\ndef add(xs):\n    while True:\n        pass\n```", True, False),
])
def test_humaneval_program(completion, chat, passes):
    program = humaneval_program(PROBLEM, completion, chat=chat)
    assert program.text.endswith("check(add)\n") and program.test.endswith("check(add)\n")
    assert "check" not in program.source and program.names == ("add",)
    assert program.helpers == "from typing import List"  # the prompt but the function to write
    assert run_program(program, FAST).passed is passes


def _he_file(tmp_path: Path, rows) -> str:
    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


HE_ROW = {"task_id": "HumanEval/0", "prompt": PROBLEM.prompt, "entry_point": "add",
          "canonical_solution": "    return sum(xs)\n", "test": PROBLEM.test}


def test_load_humaneval_errors(tmp_path):
    assert code_tasks.load_humaneval(_he_file(tmp_path, [HE_ROW]))[0] == PROBLEM
    with pytest.raises(InputError) as info:
        code_tasks.load_humaneval(_he_file(tmp_path, [HE_ROW, {**HE_ROW, "test": None}]))
    assert "line 2" in str(info.value) and "field 'test'" in str(info.value)
    with pytest.raises(InputError, match="entry_point"):
        code_tasks.load_humaneval(_he_file(tmp_path, [{**HE_ROW, "entry_point": "not a name"}]))


class _Tok:
    chat_template = None


@pytest.mark.integration  # runs programs in the sandbox
def test_humaneval_task_with_fake_generation(tmp_path, monkeypatch):
    rows = [HE_ROW, {**HE_ROW, "task_id": "HumanEval/1"}, {**HE_ROW, "task_id": "HumanEval/2"}]
    seen = {}

    def fake_generate(model, tokenizer, prompts, **kwargs):
        seen.update(kwargs, prompts=prompts)
        return ["    return sum(xs)\n", "    return 1\n", "    while True:\n        pass\n"]

    monkeypatch.setattr("bridgecli.evaluation.generate.generate", fake_generate)
    run = code_tasks.humaneval_task(object(), _Tok(), opts(data=_he_file(tmp_path, rows), progress=False,
                                                           code_timeout=1.5))
    s = run["summary"]
    assert [i["status"] for i in run["items"]] == ["passed", "failed", "timeout"]
    assert s["pass@1"] == s["accuracy"] == pytest.approx(1 / 3) and s["correct"] == 1 and s["n"] == 3
    assert s["statuses"] == {"passed": 1, "failed": 1, "timeout": 1}
    assert seen["stop"] == code_tasks.HUMANEVAL_STOP and seen["prompts"][0] == PROBLEM.prompt
    assert s["settings"]["sandbox"]["timeout_s"] == 1.5
    json.dumps(run)
    with pytest.raises(UsageError, match="zero-shot"):
        code_tasks.humaneval_task(object(), _Tok(), opts(data=_he_file(tmp_path, rows), few_shot=1))


@pytest.mark.integration  # runs programs in the sandbox
def test_humaneval_item_that_exits_early_is_not_passed(tmp_path, monkeypatch):
    # issue 30: one such item in a two-item file read pass@1 50%, though its test asserts inc(1) == 999
    rows = [HE_ROW, {"task_id": "HumanEval/1", "prompt": "def inc(x):\n", "entry_point": "inc",
                     "canonical_solution": "    return x + 1\n", "test": CHEAT_TEST}]
    monkeypatch.setattr("bridgecli.evaluation.generate.generate",
                        lambda m, t, prompts, **kw: ["    return sum(xs)\n", "    import os\n    os._exit(0)\n"])
    run = code_tasks.humaneval_task(object(), _Tok(), opts(data=_he_file(tmp_path, rows), progress=False))
    assert [i["status"] for i in run["items"]] == ["passed", "failed"]
    assert run["summary"]["pass@1"] == 0.5 and "no success signal" in run["items"][1]["error"]


@pytest.mark.integration  # runs programs in the sandbox
def test_mbpp_task_with_fake_generation(tmp_path, monkeypatch):
    rows = [{"task_id": k, "text": f"Write a function f returning {k}.", "code": f"def f():\r\n    return {k}",
             "test_list": [f"assert f() == {k}"], "test_setup_code": "", "challenge_test_list": []}
            for k in range(1, 4)]
    path = tmp_path / "mbpp.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    monkeypatch.setattr("bridgecli.evaluation.generate.generate",
                        lambda m, t, prompts, **kw: ["def f():\n    return 1\n", "```python\ndef f():\n    return 2\n```",
                                                     "def f():\n    return 0\n"][:len(prompts)])
    run = code_tasks.mbpp_task(object(), _Tok(), opts(data=str(path), progress=False))
    assert [i["correct"] for i in run["items"]] == [True, True, False]
    assert run["summary"]["settings"]["split"] == "every record"  # not the full 974-record file
    prompt = code_tasks.mbpp_prompt(code_tasks.load_mbpp(path)[1], code_tasks.load_mbpp(path)[:1], chat=False)
    assert prompt.startswith("You are an expert Python programmer, and here is your task: Write a function f returning 1.")
    assert "[BEGIN]\ndef f():\n    return 1\n[DONE]\n" in prompt and prompt.endswith("assert f() == 2\n[BEGIN]\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**rows[0], "test_list": []}) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 1.*test_list"):
        code_tasks.load_mbpp(bad)


def test_code_tasks_need_the_opt_in(tmp_path, monkeypatch):
    monkeypatch.delenv(sandbox.ALLOW_ENV, raising=False)
    monkeypatch.setattr("bridgecli.evaluation.generate.generate", lambda *a, **k: pytest.fail("generated"))
    with pytest.raises(UsageError, match="--allow-code-execution"):
        code_tasks.humaneval_task(object(), _Tok(), EvalOptions(data=_he_file(tmp_path, [HE_ROW])))
    with pytest.raises(UsageError, match="--allow-code-execution"):
        code_tasks.mbpp_task(object(), _Tok(), EvalOptions(data=str(tmp_path / "absent.jsonl")))
    with pytest.raises(UsageError, match="code-timeout"):
        code_tasks.humaneval_task(object(), _Tok(), opts(data=_he_file(tmp_path, [HE_ROW]), code_timeout=float("nan")))


def test_cli_refuses_code_tasks_without_the_opt_in(monkeypatch):
    from bridgecli.cli.app import app
    from typer.testing import CliRunner

    monkeypatch.delenv(sandbox.ALLOW_ENV, raising=False)
    result = CliRunner().invoke(app, ["eval", "no-such-model-folder", "--task", "humaneval", "--data", "x.jsonl.gz"])
    assert result.exit_code == 2
    assert "--allow-code-execution" in result.output and "Traceback" not in result.output

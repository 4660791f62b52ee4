"""Code generation tasks: ``humaneval`` and ``mbpp``, pass@1 with greedy decoding.

The model's code and the task's tests run in a bubblewrap sandbox (:mod:`.sandbox`), and only
when the caller opted in (``EvalOptions.allow_code_execution``, ``--allow-code-execution`` or
``BRIDGE_ALLOW_CODE_EXECUTION=1``); nothing generated runs in this process.

HumanEval (``HumanEval.jsonl[.gz]``: task_id, prompt, entry_point, canonical_solution, test):

- plain (no chat template): the prompt as is; the completion stops at ``\\nclass``, ``\\ndef``,
  ``\\n#``, ``\\nif`` or ``\\nprint`` (the Codex paper's stop set); program = prompt + completion.
- chat: one user turn asking to complete the function, the prompt in a ``python`` fence; the
  code is the reply's first fenced block (the whole reply when there is none; the text before a lone
  closing fence when the reply closes a block it never opened). When it defines
  the entry point it is appended after the prompt (so the prompt's imports and helpers stay
  available); otherwise it is taken as the function body and appended to the prompt.
- then the task's ``test`` and ``check(<entry_point>)``, run in the sandbox's checker process, apart
  from the program's (:class:`.sandbox_outcome.Program`): the test's helpers are the prompt's
  definitions but the entry point, and ``check`` gets the program's entry point; passed = the
  checker's success signal (written only once ``check`` has returned) within the limits.

MBPP (``mbpp.jsonl``: task_id, text, code, test_list, test_setup_code): the standard test split
(task_ids 11-510) when the file holds it, else every record; the lm-evaluation-harness prompt
("You are an expert Python programmer, and here is your task: ... Your code should pass these
tests:" + the three asserts); few-shot examples from task_ids 2, 3, 4 (then the rest of 1-10);
plain mode ends the prompt with ``[BEGIN]`` and stops at ``[DONE]``; program = code +
test_setup_code, and the asserts are the test (the reference code's function and class names are
looked up in the program first, before the builtins: task 126 defines ``sum``); passed as for
HumanEval (the last assert returned).
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, UsageError
from .readers import Where, check_limit, field, iter_jsonl
from .sandbox_outcome import Program
from .tasks import EvalOptions, EvalRun, model_name

MAX_NEW_TOKENS = 512
HUMANEVAL_STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
MBPP_STOP = ("[DONE]",)
HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function in a ```python code block."
)

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


_FENCE_MARK = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)")


def extract_code(text: str) -> str:
    """The first fenced code block (a python one preferred; an unterminated fence runs to the end);
    the whole text when there is no fence. A reply that closes a block it never opened (an odd number of
    fences, the first a bare one after some text: code, then a lone closing fence) is code up to that
    fence, the mirror of an unterminated one."""
    marks = list(_FENCE_MARK.finditer(text))
    if len(marks) % 2 == 1 and not marks[0].group(1) and text[: marks[0].start()].strip():
        return text[: marks[0].start()]
    blocks = _FENCE_RE.findall(text)
    if not blocks:
        return text
    for lang, body in blocks:
        if lang.lower() in ("python", "py", "python3"):
            return body
    return blocks[0][1]


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", code, re.M) is not None


# -- HumanEval --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    index: int
    task_id: str
    prompt: str
    entry_point: str
    test: str


def load_humaneval(path: str | Path) -> list[Problem]:
    hint = "HumanEval records have task_id, prompt, entry_point and test"
    problems: list[Problem] = []
    for n, obj in iter_jsonl(
        path, hint="pass HumanEval.jsonl(.gz) with --data (e.g. data/humaneval/HumanEval.jsonl.gz)"
    ):
        where = Where(file=str(path), line=n, hint=hint)
        values = [field(obj, key, str, **where) for key in ("task_id", "prompt", "entry_point", "test")]
        if not values[2].isidentifier():
            raise InputError(
                f"{values[2]!r} is not a function name", file=str(path), record=f"line {n}", field="entry_point"
            )
        problems.append(Problem(len(problems), *values))
    return problems


def humaneval_program(problem: Problem, completion: str, *, chat: bool) -> Program:
    """What runs: the solution (see the module docstring), and the test + check(entry_point) with
    the prompt's other definitions as its helpers."""
    if chat:
        code = extract_code(completion)
        solution = problem.prompt + "\n" + code if _defines(code, problem.entry_point) else problem.prompt + code
    else:
        solution = problem.prompt + completion
    test = f"{problem.test}\n\ncheck({problem.entry_point})\n"
    return Program(solution, test, _prompt_helpers(problem), (problem.entry_point,))


def _prompt_helpers(problem: Problem) -> str:
    """The prompt without the entry point's definition: its imports and helper functions, which
    the test may use (HumanEval/32's ``poly``); "" when the prompt does not parse."""
    try:
        tree = ast.parse(problem.prompt)
    except (SyntaxError, ValueError):
        return ""
    tree.body = [
        node
        for node in tree.body
        if not (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == problem.entry_point)
    ]
    return ast.unparse(tree)


def _top_level_names(code: str) -> tuple[str, ...]:
    """The functions and classes ``code`` defines at its top level (none when it does not parse)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return ()
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return tuple(node.name for node in tree.body if isinstance(node, kinds))


def humaneval_prompt(problem: Problem, *, chat: bool) -> str:
    if chat:
        return f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{problem.prompt.strip()}\n```"
    return problem.prompt


# -- MBPP -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MbppTask:
    index: int
    task_id: int
    text: str
    code: str
    tests: list[str]
    setup: str


MBPP_TEST_IDS = range(11, 511)
MBPP_SHOT_IDS = (2, 3, 4, 1, 5, 6, 7, 8, 9, 10)


def load_mbpp(path: str | Path) -> list[MbppTask]:
    hint = "MBPP records have task_id, text, code, test_list (and test_setup_code)"
    tasks: list[MbppTask] = []
    for n, obj in iter_jsonl(path, hint="pass mbpp.jsonl with --data (e.g. data/mbpp/mbpp.jsonl)"):
        where = Where(file=str(path), line=n, hint=hint)
        task_id = field(obj, "task_id", int, **where)
        text = field(obj, "text", str, **where)
        code = field(obj, "code", str, **where)
        tests = field(obj, "test_list", list, **where)
        if not tests or not all(isinstance(t, str) for t in tests):
            raise InputError(
                "expected a non-empty list of assert strings", file=str(path), record=f"line {n}", field="test_list"
            )
        setup = field(obj, "test_setup_code", str, optional=True, **where) or ""
        tasks.append(MbppTask(len(tasks), task_id, text, code.replace("\r\n", "\n"), tests, setup))
    return tasks


def mbpp_question(task: MbppTask) -> str:
    tests = "\n".join(task.tests[:3])
    return (
        f"You are an expert Python programmer, and here is your task: {task.text} "
        f"Your code should pass these tests:\n\n{tests}\n"
    )


def mbpp_prompt(task: MbppTask, shots: list[MbppTask], *, chat: bool) -> str | list[dict[str, str]]:
    if chat:
        messages: list[dict[str, str]] = []
        for shot in shots:
            messages.append({"role": "user", "content": mbpp_question(shot)})
            messages.append({"role": "assistant", "content": f"```python\n{shot.code}\n```"})
        messages.append({"role": "user", "content": mbpp_question(task)})
        return messages
    blocks = [f"{mbpp_question(s)}[BEGIN]\n{s.code}\n[DONE]\n" for s in shots]
    return "\n".join(blocks + [f"{mbpp_question(task)}[BEGIN]\n"])


def mbpp_program(task: MbppTask, completion: str, *, chat: bool) -> Program:
    """What runs: the code and the task's setup code; the asserts are the test."""
    code = extract_code(completion) if chat or "```" in completion else completion
    return Program(f"{code}\n\n{task.setup}", "\n".join(task.tests) + "\n", "", _top_level_names(task.code))


# -- running ----------------------------------------------------------------------------------


_WARNED: set[str] = set()


def check_code_options(options: EvalOptions) -> bool:
    """Before anything is generated: the opt-in and a usable sandbox (:class:`UsageError` otherwise),
    and a sane timeout. True when the code will run without the bubblewrap sandbox."""
    from .sandbox import code_execution_mode

    timeout = options.code_timeout
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and 0 < timeout <= 86400):
        raise UsageError(f"--code-timeout must be a number of seconds in (0, 86400] (got {timeout})")
    unsafe = code_execution_mode(options.allow_code_execution, options.unsafe_code_execution) == "unsafe"
    if not unsafe:
        from ..progress import note
        from .sandbox import sandbox_warnings

        for warning in sandbox_warnings():
            if warning not in _WARNED:  # once per process
                _WARNED.add(warning)
                note(f"sandbox: {warning}")
    return unsafe


def _execute(programs: list[Program], options: EvalOptions) -> list[Any]:
    from .sandbox import Limits, run_programs

    unsafe = check_code_options(options)
    return run_programs(programs, Limits(timeout=options.code_timeout), unsafe=unsafe)


def _summary(task: str, records: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    n = len(records)
    passed = sum(r["correct"] for r in records)
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {
        "task": task,
        "n": n,
        "accuracy": passed / n,
        "correct": passed,
        "metric": "pass@1",
        "pass@1": passed / n,
        "statuses": statuses,
        "settings": settings,
    }


def _generation_settings(options: EvalOptions, chat: bool, stop: tuple[str, ...], max_new: int, model: Any) -> dict:
    from .sandbox import Limits, sandbox_info

    limits = Limits(timeout=options.code_timeout)
    return {
        **options.to_dict(),
        "chat_template_used": chat,
        "stop": list(stop),
        "max_new_tokens": max_new,
        "decoding": "greedy",
        "sandbox": {
            **sandbox_info(),
            "timeout_s": limits.timeout,
            "memory_mb": limits.memory_mb,
            "file_size_mb": limits.file_size_mb,
            "processes": limits.processes,
            "disk_mb": limits.disk_mb,
        },
        "model": model_name(model),
    }


def _generate_and_run(
    model: Any,
    tokenizer: Any,
    options: EvalOptions,
    items: list,
    plain_stop: tuple[str, ...],
    description: str,
    *,
    prompt,
    program,
) -> tuple[list[dict], dict]:
    """What the code tasks share: greedy completions of ``prompt(item, chat)``, the programs
    ``program(item, completion, chat)`` run in the sandbox, one record per item, and the settings."""
    from .generate import generate, generation_mode

    use_template, chat, stop = generation_mode(tokenizer, options, plain_stop)
    max_new = options.max_new_tokens or MAX_NEW_TOKENS
    completions = generate(
        model,
        tokenizer,
        [prompt(item, chat) for item in items],
        max_new_tokens=max_new,
        batch_size=options.batch_size,
        stop=stop,
        chat_template=use_template,
        progress=options.progress,
        description=description,
    )
    programs = [program(item, c, chat) for item, c in zip(items, completions)]
    outcomes = _execute(programs, options)
    records = [
        {
            "index": item.index,
            "task_id": item.task_id,
            "completion": c,
            "program": prog.text,
            "status": o.status,
            "error": o.error,
            "seconds": o.seconds,
            "correct": o.passed,
        }
        for item, c, prog, o in zip(items, completions, programs, outcomes)
    ]
    return records, _generation_settings(options, chat, stop, max_new, model)


def humaneval_task(model: Any, tokenizer: Any, options: EvalOptions) -> EvalRun:
    """The ``humaneval`` eval task (see the module docstring)."""
    check_code_options(options)
    check_limit(options.limit, options.few_shot)
    if options.few_shot:
        raise UsageError("humaneval is zero-shot; --few-shot does not apply")
    problems = load_humaneval(options.data)
    evaluated = problems if options.limit is None else problems[: options.limit]
    if not evaluated:
        raise InputError("no items to evaluate", file=options.data)
    records, settings = _generate_and_run(
        model,
        tokenizer,
        options,
        evaluated,
        HUMANEVAL_STOP,
        "humaneval",
        prompt=lambda p, chat: humaneval_prompt(p, chat=chat),
        program=lambda p, c, chat: humaneval_program(p, c, chat=chat),
    )
    return {"summary": _summary("humaneval", records, settings), "items": records}


def mbpp_task(model: Any, tokenizer: Any, options: EvalOptions) -> EvalRun:
    """The ``mbpp`` eval task (see the module docstring)."""
    check_code_options(options)
    check_limit(options.limit, options.few_shot)
    tasks = load_mbpp(options.data)
    by_id = {t.task_id: t for t in tasks}
    standard = all(i in by_id for i in MBPP_TEST_IDS)
    pool_tasks = tasks if not standard else [by_id[i] for i in MBPP_TEST_IDS]
    evaluated = pool_tasks if options.limit is None else pool_tasks[: options.limit]
    if not evaluated:
        raise InputError("no items to evaluate", file=options.data)
    if options.few_shot:
        source = load_mbpp(options.few_shot_data) if options.few_shot_data else tasks
        source_ids = {t.task_id: t for t in source}
        shots = [source_ids[i] for i in MBPP_SHOT_IDS if i in source_ids][: options.few_shot]
        if len(shots) < options.few_shot:
            raise UsageError(
                f"--few-shot {options.few_shot}: MBPP few-shot examples are task_ids 1-10; "
                f"{options.few_shot_data or options.data} has {len(shots)} of them"
            )
    else:
        shots = []
    records, settings = _generate_and_run(
        model,
        tokenizer,
        options,
        evaluated,
        MBPP_STOP,
        "mbpp",
        prompt=lambda t, chat: mbpp_prompt(t, shots, chat=chat),
        program=lambda t, c, chat: mbpp_program(t, c, chat=chat),
    )
    settings["split"] = "test (task_ids 11-510)" if standard else "every record"
    settings["few_shot_ids"] = [s.task_id for s in shots]
    return {"summary": _summary("mbpp", records, settings), "items": records}

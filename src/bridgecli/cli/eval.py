from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from ..errors import UsageError
from ..progress import note


def _split(values: Optional[list[str]]) -> list[str]:
    out: list[str] = []
    for value in values or []:
        out.extend(v.strip() for v in value.split(",") if v.strip())
    return out


def _data_paths(tasks: list[str], data: list[str], data_dir: Optional[Path]) -> dict[str, str]:
    """Each task's data: ``--data TASK=PATH``, a bare ``--data PATH`` (one task only), else
    ``--data-dir`` joined with the task's default location."""
    from ..evaluation.run import default_data

    named: dict[str, str] = {}
    bare: list[str] = []
    for value in data:
        task, sep, path = value.partition("=")
        if sep and task in tasks:
            named[task] = path
        elif sep and task.isidentifier() and not Path(value).exists():
            raise UsageError(f"--data {value}: '{task}' is not one of the tasks asked for ({', '.join(tasks)})")
        else:
            bare.append(value)
    if bare:
        unnamed = [t for t in tasks if t not in named]
        if len(bare) > 1 or len(unnamed) != 1:
            raise UsageError("a bare --data PATH needs exactly one task without its own data",
                             hint="with several tasks write --data TASK=PATH for each, or use --data-dir")
        named[unnamed[0]] = bare[0]
    for task in tasks:
        if task in named:
            continue
        rel = default_data(task)
        if data_dir is None:
            raise UsageError(f"no data for task '{task}' (no downloads here)",
                             hint="pass --data PATH (or TASK=PATH), or --data-dir DIR")
        if rel is None:
            raise UsageError(f"task '{task}' has no default file under --data-dir; pass --data {task}=PATH")
        named[task] = str(data_dir / rel)
    return named


def _output_for(task: str, output: Optional[Path], model: str, several: bool) -> Optional[Path]:
    if output is not None:
        if output.suffix == ".json" and not output.is_dir():
            if several:
                raise UsageError(f"-o {output}: with several tasks, -o names a folder (one eval-TASK.json each)")
            return output
        return output / f"eval-{task}.json"
    if Path(model).is_dir():
        return Path(model) / f"eval-{task}.json"
    return None


def _keep_or_remove(book, task: str) -> None:
    """A failed task: remove its journal when it holds nothing; otherwise keep it and say how to resume."""
    book.close(remove=not book.entries)
    if book.entries:
        note(f"{task}: kept {len(book.entries)} computed results in {book.path} (pass --resume to continue)")


def eval(
    model: Annotated[list[str], typer.Argument(
        help="Model folder (e.g. runs/final), .gguf file, HF id, or 'smollm2'; with --compare, run folders "
             "(or eval-*.json files).", show_default=False)],
    task: Annotated[list[str], typer.Option(
        help="Eval task(s), comma-separated or repeated (`bridge plugins` lists them).")] = ["gsm8k"],  # noqa: B006
    data: Annotated[Optional[list[str]], typer.Option(
        help="Task data: PATH (one task) or TASK=PATH, repeatable (e.g. data/gsm8k/test.jsonl).")] = None,
    data_dir: Annotated[Optional[Path], typer.Option(
        help="Folder holding each task's data in its standard place (gsm8k/test.jsonl, ...; see docs/eval.md): "
             "tasks without --data read their file there.")] = None,
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="Result JSON (one task) or folder for eval-TASK.json files (default: MODEL/ "
                               "when MODEL is a folder).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="Evaluate only the first N items (MMLU: per subject).")] = None,
    few_shot: Annotated[int, typer.Option(help="Worked examples prepended to each prompt.")] = 0,
    few_shot_data: Annotated[Optional[str], typer.Option(
        help="Where few-shot examples come from (default: the data past the evaluated items; MMLU: dev/).")] = None,
    batch_size: Annotated[int, typer.Option(help="Prompts per generation batch / inputs per scoring forward.")] = 8,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        help="Generation length limit (default: the task's: gsm8k 256, math 512, humaneval/mbpp 512).")] = None,
    chat_template: Annotated[Optional[bool], typer.Option(
        "--chat-template/--no-chat-template",
        help="Use the tokenizer's chat template (default: yes for generation tasks and heldout-loss, no for "
             "multiple choice).")] = None,
    code_timeout: Annotated[float, typer.Option(help="Seconds per generated program (humaneval, mbpp).")] = 10.0,
    allow_code_execution: Annotated[bool, typer.Option(
        "--allow-code-execution", help="Let humaneval/mbpp run model-written code (in a bubblewrap sandbox; "
                                       "or set BRIDGE_ALLOW_CODE_EXECUTION=1).")] = False,
    unsafe_code_execution: Annotated[bool, typer.Option(
        "--unsafe-code-execution", help="Where no bubblewrap sandbox works: run model-written code anyway, "
                                        "with process limits only (not a security boundary).")] = False,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, ...")] = "auto",
    dtype: Annotated[Optional[str], typer.Option(help="float32 (default), bfloat16, float16.")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue an interrupted run: keep each task's result already written by the same request "
                         "(model, data, settings), and what an interrupted task had generated or scored.")] = False,
    compare: Annotated[bool, typer.Option(
        "--compare", help="Don't evaluate: print the paper's Table 1 for the given run folders (and their "
                          "held-out losses with intervals).")] = False,
    target: Annotated[Optional[str], typer.Option(
        help="--compare: the target task column (default: gsm8k if present, else math).")] = None,
    general: Annotated[Optional[str], typer.Option(
        help="--compare: general-capability columns (default: arc_challenge,hellaswag,mmlu,humaneval present).")] = None,
    metric: Annotated[Optional[str], typer.Option(
        help="--compare: summary field to show where a task has it, e.g. acc_norm (default: accuracy).")] = None,
    engine: Annotated[str, typer.Option(
        help="Who runs the tasks: bridge, or lm-eval (lm-evaluation-harness on the same model and local files: "
             "arc_challenge, arc_easy, hellaswag, mmlu; needs bridgecli[lm-eval]).")] = "bridge",
):
    """Evaluate a model on tasks from local files (one model load; eval-TASK.json each), or compare runs."""
    if compare:
        from ..evaluation.compare import compare as build, load_run, render

        comparison = build([load_run(m) for m in model], general=_split([general]) if general else None,
                           target=target, metric=metric)
        # a pipe or file gets the whole table, however many columns
        Console(stderr=False, width=None if sys.stdout.isatty() else 200).print(render(comparison))
        return
    if len(model) != 1:
        raise UsageError(f"give one model (got {len(model)}); several run folders go with --compare")
    import torch

    from ..evaluation.journal import Journal
    from ..evaluation.run import render_table, reusable, write_result
    from ..modeling.loading import DTYPES, fingerprint, load_model, load_tokenizer, resolve, resolve_device

    spec = model[0]
    tasks = _split(task)
    if not tasks:
        raise UsageError("--task names no task")
    if len(set(tasks)) != len(tasks):
        raise UsageError(f"--task names a task twice: {','.join(tasks)}")
    from .. import registry
    from ..evaluation.code_tasks import CODE_TASKS, check_code_options

    for name in tasks:
        registry.get("eval_task", name)  # unknown names fail before the model loads
    from ..evaluation.lm_eval_engine import engine_evaluate

    evaluate = engine_evaluate(engine, tasks)  # checked (engine, its tasks, installed) before the model loads
    from ..evaluation.run import check_numbers

    check_numbers(limit=limit, few_shot=few_shot, batch_size=batch_size, max_new_tokens=max_new_tokens,
                  code_timeout=code_timeout)
    code = [t for t in tasks if t in CODE_TASKS]
    if code:  # before the model loads
        from ..evaluation.tasks import EvalOptions

        check_code_options(EvalOptions(data="", code_timeout=code_timeout, allow_code_execution=allow_code_execution,
                                       unsafe_code_execution=unsafe_code_execution))
    paths = _data_paths(tasks, data or [], data_dir)
    outputs = {t: _output_for(t, output, spec, len(tasks) > 1) for t in tasks}
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
    if resume and any(out is None for out in outputs.values()):
        raise UsageError("--resume needs results on disk: pass -o, or give a model folder")
    from ..io import check_input

    for name in tasks:  # missing data: one line before the model loads
        check_input(paths[name], hint=f"pass the {name} data with --data {name}=PATH")
    dev = resolve_device(device)
    ref = resolve(spec)
    model_id = fingerprint(ref)
    # what decides a result (batch size and device change speed, not answers, so they are left out)
    requests = {t: {"model": model_id, "task": t, "data": str(Path(paths[t]).resolve()), "limit": limit,
                    "few_shot": few_shot, "few_shot_data": few_shot_data, "max_new_tokens": max_new_tokens,
                    "chat_template": chat_template, "code_timeout": code_timeout, "dtype": dtype,
                    **({"engine": engine} if engine != "bridge" else {})} for t in tasks}
    done = {t: r for t in tasks if resume and (r := reusable(outputs[t], requests[t])) is not None}
    results = []
    todo = [t for t in tasks if t not in done]
    if todo:
        note(f"evaluating {ref.spec} on {', '.join(todo)} on {dev}"
             + (f" (kept: {', '.join(done)})" if done else ""))
        tok = load_tokenizer(ref)
        mdl = load_model(ref, device=dev, dtype=getattr(torch, dtype) if dtype else None)
        mdl.eval()
    for name in tasks:
        if name in done:
            note(f"{name}: kept {outputs[name]}")
            results.append(done[name])
            continue
        note(f"{name}: {paths[name]}")
        book = None
        if outputs[name] is not None:  # continuations and log-likelihoods are journaled as they come
            path = outputs[name].with_name(outputs[name].name + ".partial.jsonl")
            if path.exists() and not resume:
                note(f"replacing {path.name} left by an interrupted run (pass --resume to continue it)")
            book = Journal.open(path, requests[name], resume)
            if book.entries:
                note(f"{name}: resuming with {len(book.entries)} journaled results from {path.name}")
        try:
            result = evaluate(mdl, tok, name, paths[name], limit=limit, few_shot=few_shot,
                              few_shot_data=few_shot_data, batch_size=batch_size, max_new_tokens=max_new_tokens,
                              chat_template=chat_template, code_timeout=code_timeout,
                              allow_code_execution=allow_code_execution,
                              unsafe_code_execution=unsafe_code_execution, journal=book)
        except BaseException:
            if book is not None:
                _keep_or_remove(book, name)
            raise
        result["model"] = ref.spec
        result["device"] = dev
        result["request"] = requests[name]
        if outputs[name] is not None:
            write_result(result, outputs[name])
            book.close(remove=True)
            note(f"wrote {outputs[name]}")
        results.append(result)
    Console(stderr=False).print(render_table(results))

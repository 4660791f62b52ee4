"""``bridge eval``: one model on one or more tasks from local files, with one model load, an
eval-TASK.json result each, ``--resume`` and the per-task journal; and ``bridge compare``: the
paper's Table 1 for finished runs. Every check runs before the model loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..io import real_path
from ..optionspec import check, names
from ..progress import note
from .options import CompareOptions, EvalRunOptions


def render_table(results: list[dict[str, Any]]):
    """The table ``bridge eval`` prints of its results (:func:`bridgecli.evaluation.run.render_table`)."""
    from ..evaluation.run import render_table as table

    return table(results)


def render_comparison(comparison, differences, title: str) -> list:
    """The tables ``bridge compare`` prints: the runs side by side and, with ``--paired``, each run's
    differences from the first (:mod:`bridgecli.evaluation.compare`)."""
    from ..evaluation.compare import render, render_paired

    tables = [render(comparison, title=title)]
    if differences is not None:
        tables.append(render_paired(differences, comparison.rows[0]["name"], title=title))
    return tables


__all__ = [
    "CompareOptions",
    "EvalRunOptions",
    "data_paths",
    "names",
    "one_model",
    "output_for",
    "run_compare",
    "run_eval",
    "run_paired",
]


def one_model(models: list[str]) -> str:
    """``bridge eval`` takes one model; several go to ``bridge compare``."""
    if len(models) != 1:
        raise UsageError(
            f"give one model (got {len(models)}); several run folders go with --compare (or `bridge compare`)"
        )
    return models[0]


def data_paths(tasks: list[str], data: list[str], data_dir: Path | None) -> dict[str, str]:
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
            raise UsageError(
                "a bare --data PATH needs exactly one task without its own data",
                hint="with several tasks write --data TASK=PATH for each, or use --data-dir",
            )
        named[unnamed[0]] = bare[0]
    for task in tasks:
        if task in named:
            continue
        rel = default_data(task)
        if data_dir is None:
            raise UsageError(
                f"no data for task '{task}' (no downloads here)",
                hint="pass --data PATH (or TASK=PATH), or --data-dir DIR",
            )
        if rel is None:
            raise UsageError(f"task '{task}' has no default file under --data-dir; pass --data {task}=PATH")
        named[task] = str(Path(data_dir) / rel)
    return named


def output_for(task: str, output: Path | None, model: str, several: bool) -> Path | None:
    """Where a task's result goes: ``-o FILE.json`` (one task), ``-o FOLDER/eval-TASK.json``, else
    ``MODEL/eval-TASK.json`` when the model is a folder (None: nowhere, the table only)."""
    if output is not None:
        output = Path(output)
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


def check_eval_options(opts: EvalRunOptions) -> tuple[dict[str, str], dict[str, Path | None]]:
    """Every check that can fail before the model loads; returns each task's data and output paths."""
    from .. import registry
    from ..contracts import as_eval_task
    from ..evaluation.code_tasks import check_code_options
    from ..io import check_input, check_output, is_stdio

    tasks = opts.tasks
    if not tasks:
        raise UsageError("--task names no task")
    if len(set(tasks)) != len(tasks):
        raise UsageError(f"--task names a task twice: {','.join(tasks)}")
    # unknown names fail before the model loads; what each task can do is what it declares
    declared = {name: as_eval_task(registry.get("eval_task", name).obj) for name in tasks}
    from ..evaluation.lm_eval_engine import check_engine

    check_engine(opts.engine)  # the engine exists and is installed
    _check_engines(opts.engine, declared)  # and every task asked for declares it
    check(opts.settings)
    check(opts)  # --dtype
    if any(task.runs_code for task in declared.values()):
        check_code_options(opts.settings)
    paths = data_paths(tasks, opts.data, opts.data_dir)
    outputs = {t: output_for(t, opts.output, opts.model, len(tasks) > 1) for t in tasks}
    if opts.resume and any(out is None for out in outputs.values()):
        raise UsageError("--resume needs results on disk: pass -o, or give a model folder")
    for name in tasks:  # missing data: one line before the model loads
        check_input(paths[name], hint=f"pass the {name} data with --data {name}=PATH")
    if opts.output is not None and is_stdio(opts.output):  # a file or a folder of results; the table goes there
        raise UsageError(f"-o {opts.output}: eval writes result files", hint="pass -o FILE.json or -o FOLDER")
    for out in outputs.values():
        check_output(out, inputs=paths.values())
    return paths, outputs


def _check_engines(engine: str, declared: dict[str, Any]) -> None:
    """Every task asked for declares ``engine`` among its ``engines``."""
    from .. import registry
    from ..contracts import as_eval_task

    other = [name for name, task in declared.items() if engine not in task.engines]
    if other:
        runs = [
            n for n in registry.names("eval_task") if engine in as_eval_task(registry.get("eval_task", n).obj).engines
        ]
        raise UsageError(
            f"--engine {engine} runs {', '.join(runs) or 'no task'}; not {', '.join(other)}",
            hint="run the other tasks with bridge's own engine: leave out --engine",
        )


def run_eval(opts: EvalRunOptions) -> list[dict[str, Any]]:
    """Evaluate ``opts.model`` on each task (one model load); write each result where
    :func:`output_for` says, journaling work as it comes, and return the results in task order."""
    paths, outputs = check_eval_options(opts)
    import torch

    from ..evaluation.journal import Journal
    from ..evaluation.lm_eval_engine import engine_evaluate
    from ..evaluation.run import reusable, write_result
    from ..modeling.loading import fingerprint, load_model, load_tokenizer, resolve, resolve_device

    tasks, settings = opts.tasks, opts.settings
    dev = resolve_device(opts.device)
    ref = resolve(opts.model)
    model_id = fingerprint(ref)
    # what decides a result (batch size, batch tokens, --compile and device change speed, not answers,
    # so they are left out)
    requests = {
        t: {
            "model": model_id,
            "task": t,
            "data": str(Path(paths[t]).resolve()),
            "limit": settings.limit,
            "few_shot": settings.few_shot,
            "few_shot_data": settings.few_shot_data,
            "max_new_tokens": settings.max_new_tokens,
            "chat_template": settings.chat_template,
            "code_timeout": settings.code_timeout,
            "dtype": opts.dtype,
            **({"engine": opts.engine} if opts.engine != "bridge" else {}),
        }
        for t in tasks
    }
    evaluate = engine_evaluate(opts.engine)
    # --resume: every output is a file (check_eval_options)
    done = {
        t: r
        for t in tasks
        if opts.resume and (kept := outputs[t]) is not None and (r := reusable(kept, requests[t])) is not None
    }
    results = []
    todo = [t for t in tasks if t not in done]
    if todo:
        note(f"evaluating {ref.spec} on {', '.join(todo)} on {dev}" + (f" (kept: {', '.join(done)})" if done else ""))
        tok = load_tokenizer(ref)
        mdl = load_model(ref, device=dev, dtype=getattr(torch, opts.dtype) if opts.dtype else None)
        mdl.eval()
    for name in tasks:
        if name in done:
            note(f"{name}: kept {outputs[name]}")
            results.append(done[name])
            continue
        note(f"{name}: {paths[name]}")
        out = outputs[name]
        book = None
        if out is not None:  # continuations and log-likelihoods are journaled as they come
            real = real_path(out)  # next to the real file: one lock for every name of it
            path = real.with_name(real.name + ".partial.jsonl")
            if path.exists() and not opts.resume:
                note(f"replacing {path.name} left by an interrupted run (pass --resume to continue it)")
            book = Journal.open(path, requests[name], opts.resume)
            if book.entries:
                note(f"{name}: resuming with {len(book.entries)} journaled results from {path.name}")
        try:
            result = evaluate(mdl, tok, name, paths[name], journal=book, **task_settings(settings))
        except BaseException:
            if book is not None:
                _keep_or_remove(book, name)
            raise
        result["model"] = ref.spec
        result["device"] = dev
        result["request"] = requests[name]
        if out is not None:
            assert book is not None  # opened above for every output file
            write_result(result, out)
            book.close(remove=True)
            note(f"wrote {out}")
        results.append(result)
    return results


def task_settings(settings) -> dict[str, Any]:
    """An :class:`~bridgecli.evaluation.tasks.EvalOptions` as the keywords of ``evaluate`` (its data aside)."""
    return {key: value for key, value in settings.to_dict().items() if key != "data"}


def run_compare(opts: CompareOptions):
    """The comparison table's data (:class:`bridgecli.evaluation.compare.Comparison`) for ``opts.runs``."""
    from ..evaluation.compare import compare, load_run

    if not opts.runs:
        raise UsageError("give at least one run folder (or eval-*.json file) to compare")
    return compare(
        [load_run(r) for r in opts.runs],
        general=names([opts.general]) if opts.general else None,
        target=opts.target,
        metric=opts.metric,
    )


def run_paired(opts: CompareOptions):
    """Each run's paired differences from the first (:func:`bridgecli.evaluation.compare.paired_rows`)."""
    from ..evaluation.compare import load_run, paired_rows

    return paired_rows([load_run(r) for r in opts.runs], metric=opts.metric)

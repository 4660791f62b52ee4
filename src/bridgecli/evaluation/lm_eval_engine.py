"""``bridge eval --engine lm-eval``: the multiple-choice tasks run by lm-evaluation-harness.

The same model object ``bridge eval`` loaded (the embedded GGUF default model too) is wrapped in
lm-eval's ``HFLM`` with its tokenizer; lm-eval builds the prompts, scores the choices and grades
them. Only the data comes from bridge: each task reads the SAME local file ``bridge eval`` reads
(checked by the same loaders, so bad data fails with the same one-line errors) and hands lm-eval
the records in the layout of the Hugging Face dataset its task expects (``allenai/ai2_arc``,
``Rowan/hellaswag``, ``cais/mmlu``) through a ``custom_dataset`` (:mod:`.lm_eval_docs`). Nothing
is downloaded.

Task configs are lm-eval's own YAML files as installed (``lm_eval/tasks/arc/arc_easy.yaml``,
``hellaswag/hellaswag.yaml`` with its ``process_docs``, ``mmlu/default/*``): prompt template,
choices, target, description, delimiters and metrics are lm-eval's; bridge replaces only the
dataset (``custom_dataset``, a ``test`` split, and a ``fewshot`` split when ``--few-shot`` asks for
examples) and the few-shot sampler (``first_n``, so the examples are the ones ``bridge eval`` uses:
MMLU's first dev rows, ARC/HellaSwag's items past the evaluated ones or ``--few-shot-data``).

The result has the shape ``bridge eval`` writes (``summary`` with ``accuracy``/``acc``/``acc_norm``,
one record per item with ``loglik``, ``pred``, ``pred_norm``, ``correct``, ``correct_norm``), so
``--compare`` and per-item comparisons work across engines. Where the engines differ by design,
lm-eval's rule is kept: ``acc_norm`` divides by the choice's length without the leading space.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import UsageError
from . import multiple_choice as mc
from .lm_eval_docs import arc_docs, dataset, hellaswag_docs, mmlu_doc, mmlu_docs
from .readers import check_limit
from .tasks import EvalOptions, model_name, task_options

ENGINES = ("bridge", "lm-eval")
INSTALL_HINT = "pip install 'bridgecli[lm-eval]' (lm-evaluation-harness), or drop --engine"
# the YAML file of lm-eval's task, under lm_eval/tasks/, for each task that declares "lm-eval" among its
# engines (builtin/eval_tasks.py; which tasks an engine runs is only what the tasks declare)
LM_EVAL_YAML = {
    "arc_challenge": "arc/arc_challenge.yaml",
    "arc_easy": "arc/arc_easy.yaml",
    "hellaswag": "hellaswag/hellaswag.yaml",
    "mmlu": "mmlu/default/_default_template_yaml",
}
# what bridge replaces in lm-eval's config: where the documents come from, and the few-shot sampler
DATASET_KEYS = (
    "dataset_path",
    "dataset_name",
    "dataset_kwargs",
    "training_split",
    "validation_split",
    "test_split",
    "fewshot_split",
    "custom_dataset",
    "tag",
    "include",
)


def check_engine(engine: str) -> None:
    """Before the model loads: the engine exists and is installed (which tasks it runs is what each task
    declares in its ``engines``, checked by the eval step)."""
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine}: choose one of {', '.join(ENGINES)}")
    if engine != "bridge":
        lm_eval_version()


def lm_eval_version() -> str:
    """The installed lm-evaluation-harness version; a one-line error saying how to install it if absent."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("lm_eval")
    except PackageNotFoundError:
        raise UsageError(
            "--engine lm-eval needs lm-evaluation-harness, which is not installed", hint=INSTALL_HINT
        ) from None


def engine_evaluate(engine: str) -> Callable[..., dict[str, Any]]:
    """What ``bridge eval`` calls to run one task: :func:`bridgecli.evaluation.run.evaluate` for the
    bridge engine, :func:`evaluate` of this module for lm-eval (checked first, see :func:`check_engine`)."""
    check_engine(engine)
    if engine == "bridge":
        from .run import evaluate as bridge_evaluate

        return bridge_evaluate
    return evaluate


# -- task configs ------------------------------------------------------------------------------


def lm_eval_yaml(relative: str) -> dict[str, Any]:
    """One of lm-eval's installed task YAML files, loaded by lm-eval (``include`` and ``!function`` resolved)."""
    import lm_eval
    from lm_eval.tasks._yaml_loader import load_yaml

    path = Path(lm_eval.__file__).parent / "tasks" / relative
    if not path.is_file():
        raise UsageError(f"lm-eval {lm_eval_version()} has no task file {relative}", hint=INSTALL_HINT)
    return load_yaml(path)


def task_config(
    base: dict[str, Any],
    name: str,
    data: str,
    test: list[dict[str, Any]],
    fewshot: list[dict[str, Any]] | None,
    few_shot: int,
) -> dict[str, Any]:
    """lm-eval's config ``base`` reading ``test`` (and ``fewshot``) instead of its hub dataset."""
    config = {k: v for k, v in base.items() if k not in DATASET_KEYS}
    config.update(
        task=name,
        dataset_path=str(data),
        test_split="test",
        num_fewshot=few_shot,
        custom_dataset=partial(dataset, test, fewshot),
    )
    if fewshot is not None:
        config.update(
            fewshot_split="fewshot", fewshot_config={**(base.get("fewshot_config") or {}), "sampler": "first_n"}
        )
    return config


def _pool(
    docs: list[dict[str, Any]],
    evaluated: int,
    k: int,
    few_shot_data: str | None,
    reader: Callable[[str], list[dict[str, Any]]],
) -> list[dict[str, Any]] | None:
    """Few-shot documents as ``bridge eval`` takes them: ``--few-shot-data``, else the items past the evaluated ones."""
    if k <= 0:
        return None
    pool = reader(few_shot_data) if few_shot_data else docs[evaluated:]
    return mc.take_shots(pool, k, few_shot_data or "the data file past the evaluated items")


def task_configs(task: str, options: EvalOptions) -> list[dict[str, Any]]:
    """The lm-eval task configs for ``task`` on ``options.data``: one, or one per MMLU subject
    (``mmlu_<subject>``, in file order, as ``bridge eval`` reads them)."""
    check_limit(options.limit, options.few_shot)
    if task not in LM_EVAL_YAML:  # a task that declares the engine without a configuration for it here
        raise UsageError(f"--engine lm-eval has no configuration for the task {task}")
    base = lm_eval_yaml(LM_EVAL_YAML[task])
    if task != "mmlu":
        reader = hellaswag_docs if task == "hellaswag" else arc_docs
        docs = reader(options.data)
        evaluated = docs if options.limit is None else docs[: options.limit]
        pool = _pool(docs, len(evaluated), options.few_shot, options.few_shot_data, reader)
        return [task_config(base, task, options.data, evaluated, pool, options.few_shot)]
    tests, devs = mc.mmlu_files(options.data)
    if options.few_shot_data:
        devs = mc.mmlu_files(options.few_shot_data)[0]
    configs = []
    for subject, path in tests.items():
        docs = mmlu_docs(path)
        evaluated = docs if options.limit is None else docs[: options.limit]
        shots = None
        if options.few_shot:
            shots = [mmlu_doc(item) for item in mc.mmlu_shots(devs, subject, options.few_shot)]
        config = task_config(base, f"mmlu_{subject}", str(path), evaluated, shots, options.few_shot)
        config["task_alias"] = subject
        config["description"] = _mmlu_description(subject)
        configs.append(config)
    return configs


def _mmlu_description(subject: str) -> str:
    """lm-eval's description for the subject: its YAML's when lm-eval has the subject, else the same sentence."""
    import lm_eval

    own = Path(lm_eval.__file__).parent / "tasks" / "mmlu" / "default" / f"mmlu_{subject}.yaml"
    if own.is_file():
        description = lm_eval_yaml(f"mmlu/default/mmlu_{subject}.yaml").get("description")
        if isinstance(description, str):
            return description
    return mc.mmlu_description(subject)


# -- running -----------------------------------------------------------------------------------


@contextmanager
def _quiet(progress: bool) -> Iterator[None]:
    """lm-eval's INFO/WARNING logging held back (bridge notes what it does itself); its tqdm bars
    (stderr) off unless ``progress``; no dataset download attempted."""
    import datasets
    import tqdm

    loggers = [logging.getLogger(n) for n in ("lm_eval", "lm-eval")]
    levels = [lg.level for lg in loggers]
    bars = datasets.is_progress_bar_enabled()
    saved = {k: os.environ.get(k) for k in ("HF_DATASETS_OFFLINE",)}
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    if not progress:
        datasets.disable_progress_bars()
        tqdm_init = tqdm.tqdm.__init__

        def silent(self: Any, *args: Any, **kwargs: Any) -> None:  # TQDM_DISABLE is read at import only
            tqdm_init(self, *args, **{**kwargs, "disable": True})

        tqdm.tqdm.__init__ = silent
    try:
        yield
    finally:
        if not progress:
            tqdm.tqdm.__init__ = tqdm_init
        if bars:
            datasets.enable_progress_bars()
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def wrap_model(model: Any, tokenizer: Any, batch_size: int) -> Any:
    """lm-eval's ``HFLM`` around the already loaded model (not a copy) and a copy of its tokenizer
    (HFLM may set a pad token on the tokenizer it is given)."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=model, tokenizer=copy.deepcopy(tokenizer), batch_size=batch_size)


def run_lm_eval(
    lm: Any, configs: list[dict[str, Any]], *, chat: bool, progress: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``lm_eval.evaluator.evaluate`` on ``configs`` with every sample logged: its results dict, and
    the task objects by name."""
    from lm_eval import evaluator
    from lm_eval.api.task import ConfigurableTask

    with _quiet(progress):
        tasks = {}
        for config in configs:
            task = ConfigurableTask(config=config)
            task.set_fewshot_seed(seed=1234)  # lm-eval's default; the first_n sampler does not use it
            tasks[config["task"]] = task
        results = evaluator.evaluate(
            lm,
            {"tasks": tasks, "groups": {}, "group_map": {}},
            log_samples=True,
            bootstrap_iters=0,
            apply_chat_template=chat,
            fewshot_as_multiturn=False,
        )
    return results, tasks


def item_record(sample: dict[str, Any], query: str, subject: str | None, delimiter: str) -> dict[str, Any]:
    """One of lm-eval's logged samples as a ``bridge eval`` item record. ``correct``/``correct_norm``
    are lm-eval's own ``acc``/``acc_norm``; ``pred_norm`` follows lm-eval's normalisation (the
    choice's characters, the target delimiter left out)."""
    contexts = [a[0] for a in sample["arguments"]]
    continuations = [a[1] for a in sample["arguments"]]
    logliks = [float(r[0]) for r in sample["filtered_resps"]]
    greedy = [bool(r[1]) for r in sample["filtered_resps"]]
    lengths = [max(1, len(c[len(delimiter) :] if c.startswith(delimiter) else c)) for c in continuations]
    pred = max(range(len(logliks)), key=logliks.__getitem__)
    pred_norm = max(range(len(logliks)), key=lambda k: logliks[k] / lengths[k])
    doc = sample["doc"]
    return {
        "index": int(sample["doc_id"]),
        "id": str(doc.get("id", sample["doc_id"])),
        **({"subject": subject} if subject else {}),
        "query": query,
        "context": contexts[0],
        "choices": continuations,
        "gold": int(sample["target"]),
        "loglik": logliks,
        "greedy": greedy,
        "pred": pred,
        "pred_norm": pred_norm,
        "correct": float(sample["acc"]) == 1.0,
        # lm-eval's verdict where its task computes acc_norm (ARC, HellaSwag); MMLU's computes acc alone
        "correct_norm": float(sample["acc_norm"]) == 1.0
        if "acc_norm" in sample
        else pred_norm == int(sample["target"]),
    }


def _config_record(config: Any) -> dict[str, Any]:
    """The prompt-building part of a task's effective config (lm-eval's defaults filled in), for the
    result's settings."""
    keys = (
        "description",
        "doc_to_text",
        "doc_to_choice",
        "doc_to_target",
        "target_delimiter",
        "fewshot_delimiter",
        "num_fewshot",
        "output_type",
    )
    out = {k: getattr(config, k) for k in keys if isinstance(getattr(config, k, None), (str, int, list))}
    sampler = getattr(getattr(config, "fewshot_config", None), "sampler", None)
    if isinstance(sampler, str) and getattr(config, "fewshot_split", None):
        out["fewshot_sampler"] = sampler
    fn = getattr(config, "process_docs", None)
    if callable(fn):
        out["process_docs"] = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    return out


def run_task(model: Any, tokenizer: Any, task: str, options: EvalOptions, lm: Any = None) -> dict[str, Any]:
    """``{"summary", "items"}`` of ``task`` run by lm-eval, in ``bridge eval``'s result shape."""
    from .generate import uses_chat_template

    configs = task_configs(task, options)
    chat = uses_chat_template(tokenizer, options.chat_template is True)
    if lm is None:
        with _quiet(options.progress):
            lm = wrap_model(model, tokenizer, options.batch_size)
    results, tasks = run_lm_eval(lm, configs, chat=chat, progress=options.progress)
    records: list[dict[str, Any]] = []
    for config in configs:
        name = config["task"]
        task_obj = tasks[name]
        samples = sorted(results["samples"][name], key=lambda s: s["doc_id"])
        subject = config.get("task_alias") if task == "mmlu" else None
        for sample in samples:
            query = _doc_to_text(task_obj, sample["doc"])
            records.append(item_record(sample, query, subject, task_obj.config.target_delimiter))
    if not records:
        raise UsageError(f"{task}: lm-eval evaluated no items")
    settings = {
        **options.to_dict(),
        "engine": "lm-eval",
        "lm_eval_version": lm_eval_version(),
        "chat_template_used": chat,
        "normalisation": "loglik / len(choice chars), target delimiter excluded (lm-eval)",
        "model": model_name(model),
        "task_config": _config_record(tasks[configs[0]["task"]].config),
        "lm_eval_tasks": [c["task"] for c in configs],
    }
    if task == "mmlu":
        settings.update(limit_applies_to="each subject", subjects=len(configs))
    summary = mc.summarize(task, records, settings)
    summary["engine"] = "lm-eval"
    summary["lm_eval"] = {
        name: {k.split(",")[0]: v for k, v in r.items() if k.split(",")[0] in ("acc", "acc_norm")}
        for name, r in results["results"].items()
    }
    if task == "mmlu":
        mc.add_subject_metrics(summary, records)
    return {"summary": summary, "items": records}


def _doc_to_text(task_obj: Any, doc: dict[str, Any]) -> str:
    """The item's own question block as lm-eval renders it (no description, no few-shot examples)."""
    text = task_obj.doc_to_text(doc)
    return text if isinstance(text, str) else str(text)


def evaluate(
    model: Any, tokenizer: Any, task: str, data: str, *, journal: Any = None, **settings: Any
) -> dict[str, Any]:
    """:func:`bridgecli.evaluation.run.evaluate`'s signature and result (``{"task", "summary", "items"}``),
    with lm-eval running the task. ``settings`` are fields of :class:`~bridgecli.evaluation.tasks.EvalOptions`
    (:func:`~bridgecli.evaluation.tasks.task_options`, as for the bridge engine); lm-eval reads ``limit``,
    ``few_shot``, ``few_shot_data``, ``batch_size``, ``chat_template`` and ``progress``, and the fields that
    only generation or code tasks use change nothing; nor does ``journal`` (lm-eval's scores are not
    journaled: ``--resume`` keeps finished tasks only)."""
    options = task_options(data, settings)
    start = time.perf_counter()
    run = run_task(model, tokenizer, task, options)
    summary = dict(run["summary"])
    summary["seconds"] = round(time.perf_counter() - start, 3)
    return {"task": task, "engine": "lm-eval", "summary": summary, "items": run["items"]}

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from ..errors import UsageError
from ..modeling.loading import load_model, load_tokenizer, resolve, resolve_device
from ..progress import note


def eval(
    model: Annotated[str, typer.Argument(help="Model folder (e.g. runs/final), .gguf file, HF id, or 'smollm2'.")],
    task: Annotated[str, typer.Option(help="Eval task (`bridge plugins` lists them).")] = "gsm8k",
    data: Annotated[Optional[str], typer.Option(help="Task data file (e.g. ../shared/data/gsm8k/test.jsonl).")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Result JSON (default: MODEL/eval-TASK.json for folders).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="Evaluate only the first N items.")] = None,
    few_shot: Annotated[int, typer.Option(help="Worked examples prepended to each prompt.")] = 0,
    batch_size: Annotated[int, typer.Option(help="Prompts per generation batch.")] = 8,
    max_new_tokens: Annotated[int, typer.Option(help="Generation length limit.")] = 256,
    chat_template: Annotated[bool, typer.Option("--chat-template/--no-chat-template")] = True,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, ...")] = "auto",
):
    """Evaluate a model on a task from local files; write a JSON result and print a table."""
    from ..evaluation.run import evaluate, render_table, write_result

    if data is None:
        raise UsageError("--data is required (no downloads here): point it at the task's local file")
    dev = resolve_device(device)
    ref = resolve(model)
    note(f"evaluating {ref.spec} on {task} ({data}) on {dev}")
    tok = load_tokenizer(ref)
    mdl = load_model(ref, device=dev)
    mdl.eval()
    result = evaluate(mdl, tok, task, data, limit=limit, few_shot=few_shot, batch_size=batch_size,
                      max_new_tokens=max_new_tokens, chat_template=chat_template)
    result["model"] = ref.spec
    if output is None and Path(model).is_dir():
        output = Path(model) / f"eval-{task}.json"
    if output is not None:
        write_result(result, output)
        note(f"wrote {output}")
    Console(stderr=False).print(render_table([result]))

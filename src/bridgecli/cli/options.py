"""Option bundles shared by several subcommands: a flag means the same thing everywhere."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..data.examples import DataOptions

InputArg = Annotated[str, typer.Argument(help="Input bridge stream ('-' for stdin).", show_default=True)]
StreamOut = Annotated[str, typer.Option("--output", "-o", help="Output bridge stream ('-' for stdout).")]
Device = Annotated[str, typer.Option(help="auto (cuda if present), cpu, cuda, cuda:1, ...")]
Model = Annotated[Optional[str], typer.Option(
    "--model", help="HF model folder, .gguf file or HF id (default: the embedded SmolLM2-135M-Instruct).")]
Seed = Annotated[int, typer.Option(help="Random seed (data order, splits).")]
PromptField = Annotated[Optional[str], typer.Option(help="Record field holding the prompt (overrides shape detection).")]
ResponseField = Annotated[Optional[str], typer.Option(help="Record field holding the response.")]
ChatTemplate = Annotated[bool, typer.Option(
    "--chat-template/--no-chat-template", help="Render with the tokenizer's chat template when it has one.")]
MaxLength = Annotated[Optional[int], typer.Option(
    help="Skip (and report) examples longer than this many tokens (score, warmup: default and upper bound "
         "the model's limit, max_position_embeddings).")]
Split = Annotated[Optional[str], typer.Option(help="Split of a save_to_disk DatasetDict.")]
AllowEmpty = Annotated[bool, typer.Option(
    "--allow-empty", help="Accept an empty input or result (0 examples or rows) instead of failing.")]
Limit = Annotated[Optional[int], typer.Option(help="Use only the first N records.")]


def data_options(prompt_field, response_field, chat_template, max_length, split, limit) -> DataOptions:
    return DataOptions(prompt_field=prompt_field, response_field=response_field, chat_template=chat_template,
                       max_length=max_length, split=split, limit=limit)



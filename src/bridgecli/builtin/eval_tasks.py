"""Built-in eval tasks, registered through the plugin hook exactly as a third-party plugin would."""

from __future__ import annotations

from bridgecli.hookspecs import hookimpl


def gsm8k_task(model, tokenizer, options):
    # Imported on use: loading plugins must stay cheap for every other command.
    from bridgecli.evaluation.gsm8k import gsm8k_task as run

    return run(model, tokenizer, options)


@hookimpl
def register_eval_tasks(register):
    register("gsm8k", gsm8k_task, "GSM8K: greedy generation, exact match on the final number")

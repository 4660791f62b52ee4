"""Built-in eval tasks, registered through the plugin hook exactly as a third-party plugin would.

Each wrapper imports its task on use (loading plugins must stay cheap for every other command) and
declares what :class:`bridgecli.hookspecs.EvalTask` asks: ``default_data`` (where the task's data lies
under a data folder such as data/, for ``bridge eval --data-dir``), whether it runs model-written code,
the engines that run it, and its metric. A plugin task declares the same attributes.
"""

from __future__ import annotations

from bridgecli.hookspecs import hookimpl


#: the tasks that lm-evaluation-harness can run too (``--engine lm-eval``)
BOTH_ENGINES = ("bridge", "lm-eval")


class _Task:
    """An eval task that imports ``bridgecli.evaluation.<module>`` and calls its ``name`` on use."""

    def __init__(
        self,
        module: str,
        name: str,
        default_data: str,
        *,
        metric: str = "accuracy",
        runs_code: bool = False,
        engines: tuple[str, ...] = ("bridge",),
    ) -> None:
        self.module = module
        self.__name__ = name
        self.default_data = default_data
        self.metric = metric
        self.runs_code = runs_code
        self.engines = engines

    def __call__(self, model, tokenizer, options):
        import importlib

        return getattr(importlib.import_module(f"bridgecli.evaluation.{self.module}"), self.__name__)(
            model, tokenizer, options
        )


gsm8k_task = _Task("gsm8k", "gsm8k_task", "gsm8k/test.jsonl")
math_task = _Task("math_task", "math_task", "math/math500_test.jsonl", metric="exact_match")
humaneval_task = _Task("code_tasks", "humaneval_task", "humaneval/HumanEval.jsonl.gz", metric="pass@1", runs_code=True)
mbpp_task = _Task("code_tasks", "mbpp_task", "mbpp/mbpp.jsonl", metric="pass@1", runs_code=True)
arc_challenge_task = _Task(
    "multiple_choice", "arc_challenge_task", "arc/ARC-Challenge-Test.jsonl", metric="acc", engines=BOTH_ENGINES
)
arc_easy_task = _Task("multiple_choice", "arc_easy_task", "arc/ARC-Easy-Test.jsonl", metric="acc", engines=BOTH_ENGINES)
hellaswag_task = _Task(
    "multiple_choice", "hellaswag_task", "hellaswag/hellaswag_val_full.txt.bz2", metric="acc", engines=BOTH_ENGINES
)
mmlu_task = _Task("multiple_choice", "mmlu_task", "mmlu", metric="acc", engines=BOTH_ENGINES)
heldout_loss_task = _Task("heldout", "heldout_loss_task", "gsm8k/test.jsonl", metric="loss")
answer_loss_task = _Task("answer_loss", "answer_loss_task", "gsm8k/test.jsonl", metric="loss")


@hookimpl
def register_eval_tasks(register):
    register("gsm8k", gsm8k_task, "GSM8K: greedy generation, exact match on the final number")
    register("math", math_task, "MATH / MATH-500: greedy generation, \\boxed{} answer graded by math-verify")
    register("humaneval", humaneval_task, "HumanEval: greedy generation, tests run in a sandboxed subprocess, pass@1")
    register("mbpp", mbpp_task, "MBPP (test split): greedy generation, tests run in a sandboxed subprocess, pass@1")
    register("arc_challenge", arc_challenge_task, "ARC-Challenge: multiple choice by log-likelihood (acc, acc_norm)")
    register("arc_easy", arc_easy_task, "ARC-Easy: multiple choice by log-likelihood (acc, acc_norm)")
    register("hellaswag", hellaswag_task, "HellaSwag: multiple choice by log-likelihood (acc, acc_norm)")
    register("mmlu", mmlu_task, "MMLU (57 subjects): multiple choice by log-likelihood of the letter (acc)")
    register(
        "heldout-loss",
        heldout_loss_task,
        "Held-out loss: token-mean loss of the reference responses given "
        "their prompts (any input shape score reads), 95% bootstrap interval",
    )
    register(
        "answer-loss",
        answer_loss_task,
        "Answer-span loss: mean loss of the final answer's tokens (#### N, \\boxed{...}) given the "
        "prompt and the reference reasoning, per item then over items, 95% bootstrap interval",
    )

"""``bridge eval``: batched greedy generation, log-likelihood scoring and the tasks built on them.

Tasks are plugins (hook ``register_eval_tasks``), registered by :mod:`bridgecli.builtin.eval_tasks`:
``gsm8k`` (:mod:`.gsm8k`), ``math`` (:mod:`.math_task`, graded by math-verify through
:mod:`.math_verify_grader`), ``humaneval`` and ``mbpp`` (:mod:`.code_tasks`, executed by
:mod:`.sandbox`), ``arc_challenge``, ``arc_easy``, ``hellaswag`` and ``mmlu``
(:mod:`.multiple_choice`, scored by :mod:`.loglik`), ``heldout-loss`` (:mod:`.heldout`, with the
interval of :mod:`.bootstrap`) and ``answer-loss`` (:mod:`.answer_loss`, on the same machinery).
``bridge compare`` (and its paired differences) is :mod:`.compare`. docs/eval.md
describes every task and metric. This package imports torch only when a model actually runs.
"""

from .run import evaluate, render_table, write_result
from .tasks import EvalOptions, EvalRun, EvalTask

__all__ = ["EvalOptions", "EvalRun", "EvalTask", "evaluate", "render_table", "write_result"]

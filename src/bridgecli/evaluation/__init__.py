"""``bridge eval``: batched greedy generation and the evaluation tasks built on it.

Tasks are plugins (hook ``register_eval_tasks``); the built-in GSM8K task lives in
:mod:`bridgecli.evaluation.gsm8k` and is registered by :mod:`bridgecli.builtin.eval_tasks`.
This package imports torch only when generation actually runs.
"""

from .run import evaluate, render_table, write_result
from .tasks import EvalOptions, EvalRun, EvalTask

__all__ = ["EvalOptions", "EvalRun", "EvalTask", "evaluate", "render_table", "write_result"]

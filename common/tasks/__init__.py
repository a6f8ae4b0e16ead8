"""Tasks, rewards and data: what the rollout worker rewards and the coordinator streams.

    from stabledrl.common.config.task import parse_task_config
    from stabledrl.common.sandbox.scorer import RewardScorer
    from stabledrl.common.tasks import PromptStream, load_task_data

    cfg = parse_task_config({"name": "arithmetic", "held_out": 200})
    data = load_task_data(cfg)                      # TaskData(task, train, held_out, reports)
    stream = PromptStream(data.train, seed=0)       # coordinator: stream.next(), state_dict()
    row = stream.next()
    prompt = data.task.render_prompt(row)            # e.g. "23+41="
    with RewardScorer(cfg) as scorer:               # rollout worker
        result = scorer.score("64", row)            # RewardResult(total, parts), or None = dropped

Importing this package registers every task in ``TASKS``; it does not import torch.
"""
from stabledrl.common.tasks import arithmetic, countdown, generic, gsm8k, hendrycks_math, sudoku  # noqa: F401
from stabledrl.common.tasks.base import TASKS, BadRow, NonNumericReward, RewardResult, Row, Task, stable_hash
from stabledrl.common.tasks.build import build_task, load_reward_function
from stabledrl.common.tasks.data import (
    DataError,
    LoadReport,
    TaskData,
    generate_rows,
    load_task_data,
    prompt_length,
    read_records,
    rows_from_records,
    split_rows,
)
from stabledrl.common.tasks.stream import DataCursor, PromptStream

__all__ = [
    "TASKS",
    "BadRow",
    "DataCursor",
    "DataError",
    "LoadReport",
    "NonNumericReward",
    "PromptStream",
    "RewardResult",
    "Row",
    "Task",
    "TaskData",
    "build_task",
    "generate_rows",
    "load_reward_function",
    "load_task_data",
    "prompt_length",
    "read_records",
    "rows_from_records",
    "split_rows",
    "stable_hash",
]

"""Child side of the reward sandbox: ``python -m common.tasks.sandbox_child``.

Reads the task config from stdin, builds the task (importing a custom reward), replies
("ready", None) or ("error", message), then answers each (completion, row) request with
("ok", (total, parts)) or (failure kind, message) until stdin closes. Fd 1 is re-pointed at
stderr first, so whatever the reward code prints cannot corrupt the reply pipe.
"""
from __future__ import annotations

import os
import sys
from multiprocessing.connection import Connection

from common.tasks.sandbox import outcome_of


def _serve() -> None:
    """Child side: read the task config, then answer (completion, row) requests until EOF."""
    requests = Connection(os.dup(0), writable=False)
    replies = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)  # user prints must not corrupt the reply pipe
    sys.stdout = sys.stderr
    try:
        from common.config.task import parse_task_config
        from common.tasks.build import CustomReward, build_task

        task = build_task(parse_task_config(requests.recv()))
        if isinstance(task.correctness, CustomReward):
            task.correctness.load()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises ConfigError
        replies.send(("error", f"{type(e).__name__}: {e}"))
        return
    replies.send(("ready", None))
    while True:
        try:
            completion, row = requests.recv()
        except EOFError:
            return
        try:
            result = task.reward(completion, row)
            replies.send(("ok", (result.total, dict(result.parts))))
        except Exception as e:
            replies.send((outcome_of(e), repr(e)))


if __name__ == "__main__":
    _serve()

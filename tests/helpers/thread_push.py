"""A weight push between two ranks of one process, for the tests of the collective push over gloo:
rank 0 sends from a thread, the test receives as rank 1."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch

from ports import HOST
from stabledrl.common.transport import WeightPushConfig, setup_weight_push


@contextmanager
def sending_thread(cfg: WeightPushConfig, port: int, source: Sequence[tuple[str, torch.Tensor]],
                   versions: Sequence[int]) -> Iterator:
    """Rank 0 (a thread) sends ``source`` at each of ``versions`` over the store at ``port``; yields
    rank 1's push for the test to receive them. On leaving: rank 1's push closed, the thread joined,
    and nothing it raised."""
    errors: list[BaseException] = []

    def sender() -> None:
        try:
            push = setup_weight_push(cfg, rank=0, world_size=2, master_addr=HOST, master_port=port)
            for version in versions:
                push.send(iter(source), version)
            push.close()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    thread = threading.Thread(target=sender)
    thread.start()
    push = setup_weight_push(cfg, rank=1, world_size=2, master_addr=HOST, master_port=port)
    yield push
    push.close()
    thread.join(timeout=60)
    assert not errors, errors

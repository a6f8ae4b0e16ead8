"""Ranks of a gloo group in spawned processes of their own, for the tests of what ranks send one
another: the test binds the store's port (tests/helpers/ports.py) and hands it to rank 0; each rank
joins the group, runs the test's ``body`` and reports."""
from __future__ import annotations

import multiprocessing
from typing import Any, Callable, Optional

from ports import join_group, rendezvous


def run_ranks(body: Callable[..., None], world: int, *args: Any) -> dict[int, Optional[str]]:
    """``body(rank, world, *args)`` on each of ``world`` ranks (a module-level function: spawned
    processes import it); returns every rank's error (its repr), None for a rank that completed."""
    # spawned, not forked: a child forked from a test process that has run hundreds of tests (their
    # threads inherited mid-lock) crashed once with a double free before it reported (make test)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    listener, port = rendezvous()  # bound here, handed to rank 0: no other process can take the port
    procs = [ctx.Process(target=_rank, args=(body, r, world, port, args, results) + ((listener,) if r == 0 else ()))
             for r in range(world)]
    for p in procs:
        p.start()
    listener.close()  # rank 0 holds its own copy
    got = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    return got


def _rank(body: Callable[..., None], rank: int, world: int, port: int, args: tuple, results, listener=None) -> None:
    import torch
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        join_group("gloo", rank, world, port, listener)
        body(rank, world, *args)
        dist.destroy_process_group()
        results.put((rank, None))
    except BaseException as e:  # noqa: BLE001 - reported by the test
        results.put((rank, repr(e)))

"""With a reward taking its whole timeout on every call, Ctrl-C did not end the driver
within 15 s: closing the pool waited grace_s for each busy worker's close, then grace_s again for
its exit. A worker whose close does not answer is killed at once."""
from __future__ import annotations

import stabledrl.coordinator.runtime.pool as pool_module
from stabledrl.coordinator.runtime.pool import Process, RolloutPool


class _Method:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def remote(self) -> tuple:
        self.log.append(self.name)
        return (self.name,)


class _Actor:
    def __init__(self, name: str, log: list) -> None:
        self.close = _Method(log, f"{name}.close")
        self.__ray_terminate__ = _Method(log, f"{name}.terminate")


def test_a_busy_worker_is_killed_without_a_second_wait(monkeypatch):
    log: list = []
    waits: list = []
    busy, idle = _Actor("busy", log), _Actor("idle", log)

    def wait(refs, num_returns, timeout):
        waits.append((list(refs), timeout))
        return [r for r in refs if not r[0].startswith("busy")], [r for r in refs if r[0].startswith("busy")]

    monkeypatch.setattr(pool_module.ray, "wait", wait)
    monkeypatch.setattr(pool_module.ray, "kill", lambda actor, no_restart: log.append(f"kill {actor is busy}"))
    pool = RolloutPool(None, None)
    pool.processes = {0: Process(busy, None), 1: Process(idle, None)}
    pool.shutdown(grace_s=10.0)
    assert "idle.terminate" in log and "busy.terminate" not in log  # the busy one is not asked again
    assert waits[1][0] == [("idle.terminate",)]  # the second wait covers only workers that closed
    assert log.count("kill True") == 1 and not pool.processes

"""The rollout workers of a running job: started, replaced, added and retired while it runs.

A worker is known by its index ("rollout worker 3"), which a replacement keeps and a new worker
never reuses. Its life: ``starting`` (actor created, model loading) -> ``active`` (gets requests;
with a broadcast weight push it first waits in ``syncing`` until a push includes it) ->
``retiring`` (no new requests; removed once its queued ones are back). A worker whose process
died leaves the pool or is replaced in place (``replace``).

Placement: the workers the job starts with share one placement group (``cluster.rollout``
bundles, ``cluster.rollout_strategy``), reserved all at once as before. A replacement takes its
predecessor's bundle (Ray moves a bundle whose node died when another node has room). A worker
added later takes a bundle freed by a retired or lost worker, else a placement group of its own
(one bundle), removed with it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from common.config.job import JobConfig
from coordinator.actors import bundle, in_group, reserve, rollout_model


@dataclass
class Placement:
    group: PlacementGroup
    bundle: int
    owned: bool  # a group of the worker's own, removed with it


@dataclass
class Worker:
    index: int
    actor: Any
    placement: Optional[Placement]  # None: started outside the pool (RolloutPool.adopt)
    state: str = "starting"  # starting | syncing | active | retiring
    restarts: int = 0  # how many times this index was replaced after its process died
    version: int = 0  # weights version held (acknowledged)
    info: dict[str, Any] = field(default_factory=dict)  # RolloutWorker.ready(): node_id, pid, device, ...

    @property
    def name(self) -> str:
        return f"rollout worker {self.index}"


class RolloutPool:
    def __init__(self, cfg: Optional[JobConfig], rollout_cls: Optional[type], log: Callable[[str], None] = print) -> None:
        self.cfg = cfg
        self.actor_cls = None
        if cfg is not None:
            res = cfg.cluster.rollout
            # "weights": a worker stages a broadcast push on a thread of its own while it generates
            self.actor_cls = ray.remote(num_cpus=res.num_cpus, num_gpus=res.num_gpus,
                                        concurrency_groups={"weights": 1})(rollout_cls)
        self.log = log
        self.workers: dict[int, Worker] = {}
        self.free: list[Placement] = []  # bundles of the start group whose worker left
        self.groups: list[PlacementGroup] = []
        self.next_index = 0

    @classmethod
    def adopt(cls, actors: list[Any]) -> "RolloutPool":
        """A fixed pool of workers started elsewhere (a study lane's warm actors): all active, none
        can be added or replaced (a death fails the job)."""
        pool = cls(None, None)
        for index, actor in enumerate(actors):
            pool.workers[index] = Worker(index, actor, placement=None, state="active")
        pool.next_index = len(actors)
        return pool

    # ---- views ----------------------------------------------------------------------------
    def active(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.state == "active"]

    def live(self) -> list[Worker]:
        """Workers that count towards the job's size: starting, syncing or active."""
        return [w for w in self.workers.values() if w.state != "retiring"]

    def __getitem__(self, index: int) -> Worker:
        return self.workers[index]

    def get(self, index: int) -> Optional[Worker]:
        return self.workers.get(index)

    # ---- starting -------------------------------------------------------------------------
    def start(self, n: int) -> list[Worker]:
        """The job's first ``n`` workers in one placement group (all or nothing, in time)."""
        r = self.cfg.cluster
        group = reserve("stabledrl-rollout", r.rollout, n, r.rollout_strategy, r.start_timeout_s)
        self.groups.append(group)
        return [self._launch(Placement(group, i, owned=False)) for i in range(n)]

    def add(self) -> Worker:
        """One more worker: a freed bundle of the start group, else a placement group of its own
        (the worker's start then waits for the cluster to place it; ``cluster.start_timeout_s``)."""
        if self.free:
            placement = self.free.pop(0)
        else:
            index = self.next_index
            group = placement_group([bundle(self.cfg.cluster.rollout)], strategy="STRICT_PACK",
                                    name=f"stabledrl-rollout-{index}")
            placement = Placement(group, 0, owned=True)
        return self._launch(placement)

    def replace(self, worker: Worker) -> Worker:
        """A new process for ``worker``'s index on its placement, after the old one died."""
        ray.kill(worker.actor, no_restart=True)
        new = self._launch(worker.placement, index=worker.index)
        new.restarts = worker.restarts + 1
        return new

    def _launch(self, placement: Placement, index: Optional[int] = None) -> Worker:
        if self.cfg is None:
            raise RuntimeError("this pool holds workers started elsewhere: it cannot start or replace one")
        cfg, a = self.cfg, self.cfg.algorithm
        if index is None:
            index, self.next_index = self.next_index, self.next_index + 1
        actor = self.actor_cls.options(scheduling_strategy=in_group(placement.group, placement.bundle)).remote(
            index, rollout_model(cfg), cfg.sampler, cfg.estimator, cfg.task, group_size=a.group_size, seed=cfg.run.seed)
        worker = Worker(index, actor, placement)
        self.workers[index] = worker
        return worker

    # ---- leaving --------------------------------------------------------------------------
    def remove(self, worker: Worker) -> None:
        """Stop ``worker`` and give its placement back (a start-group bundle is kept for reuse)."""
        ray.kill(worker.actor, no_restart=True)
        self.workers.pop(worker.index, None)
        if worker.placement is None:
            return
        if worker.placement.owned:
            remove_placement_group(worker.placement.group)
        else:
            self.free.append(worker.placement)

    def node_alive(self, worker: Worker) -> bool:
        node = worker.info.get("node_id")
        if node is None:
            return True
        return any(n["NodeID"] == node and n["Alive"] for n in ray.nodes())

    def has_room(self) -> bool:
        """A freed bundle, or free resources for one more worker's bundle somewhere in the cluster."""
        if self.free:
            return True
        if self.cfg is None:
            return False
        need = bundle(self.cfg.cluster.rollout)
        available = ray.available_resources()
        return all(available.get(k, 0.0) >= v for k, v in need.items())

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Close every worker (reward sandbox, push channel) and let its process exit; ``ray.kill``
        takes any that has not answered within ``grace_s`` (a killed worker with live threads
        aborts noisily in its log)."""
        workers = list(self.workers.values())
        closing = [w.actor.close.remote() for w in workers]
        ray.wait(closing, num_returns=len(closing), timeout=grace_s)
        exiting = [w.actor.__ray_terminate__.remote() for w in workers]
        ray.wait(exiting, num_returns=len(exiting), timeout=grace_s)
        for worker in workers:
            ray.kill(worker.actor, no_restart=True)
            if worker.placement is not None and worker.placement.owned:
                remove_placement_group(worker.placement.group)
        self.workers.clear()
        for group in self.groups:
            remove_placement_group(group)
        self.groups.clear()

    def status(self) -> dict[str, Any]:
        states = [w.state for w in self.workers.values()]
        return {"workers": len(self.live()), "active": states.count("active"), "starting": states.count("starting"),
                "retiring": states.count("retiring")}

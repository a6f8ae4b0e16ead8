"""The rollout workers' processes: Ray actors and their placements, by worker index; whether a
node (``node_alive``) and the cluster's head (``gcs_alive``) are still there.

The scheduler decides which worker starts, is replaced or leaves (coordinator/decisions/fleet.py holds
their states); this pool carries it out. The workers the job starts with share one placement
group (``cluster.rollout`` bundles, ``cluster.rollout_strategy``), reserved all at once. A
replacement takes its predecessor's bundle (Ray moves a bundle whose node died when another node
has room). A worker added later takes a bundle freed by a retired or lost worker, else a
placement group of its own (one bundle), removed with it. With ``cluster.colocate`` the start
workers take the bundles of the learner's shared group instead (coordinator/runtime/placement.py), and a
replacement or a worker on a freed one of them shares that learner rank's GPU as well; where the job's
push plan makes the workers view their ranks' parameters (``weights.ipc: view``), each worker in such a
bundle is told so, and loads its policy on the host until its first push (rollout/worker.py).
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group

from stabledrl.common.config.job import JobConfig
from stabledrl.common.config.model import ModelConfig
from stabledrl.coordinator.runtime.placement import bundle, has_room, in_group, reserve, shared_gpus


@dataclass
class Placement:
    group: PlacementGroup
    bundle: int
    owned: bool  # a group of the worker's own, removed with it
    shared: bool = False  # a bundle of cluster.colocate: the worker takes half its GPU, beside a learner rank


@dataclass
class Process:
    """A worker's current process."""

    actor: Any
    placement: Optional[Placement]  # None: started outside the pool (RolloutPool.adopt)


def rollout_model(cfg: JobConfig) -> ModelConfig:
    """The rollout copy: the same weights, no activation checkpointing (inference only)."""
    return cfg.model.model_copy(update={"gradient_checkpointing": False})


class RolloutPool:
    def __init__(self, cfg: Optional[JobConfig], rollout_cls: Optional[type], views: bool = False) -> None:
        """``views``: the job's push plan makes every worker's parameters views of its learner rank's
        (``PushPlan.views``): a worker beside its rank loads its policy on the host until the first push."""
        self.cfg = cfg
        self.actor_cls = None
        self.views = views
        if cfg is not None:
            res = cfg.cluster.rollout
            # "weights": a worker stages a broadcast push on a thread of its own while it generates
            self.actor_cls = ray.remote(num_cpus=res.num_cpus, num_gpus=res.num_gpus,
                                        concurrency_groups={"weights": 1})(rollout_cls)
        self.processes: dict[int, Process] = {}
        self.free: list[Placement] = []  # bundles of the start group whose worker left
        self.groups: list[PlacementGroup] = []

    @classmethod
    def adopt(cls, actors: list[Any]) -> "RolloutPool":
        """A fixed pool of workers started elsewhere (a study lane's warm actors): none can be added
        or replaced (a loss stops the job)."""
        pool = cls(None, None)
        pool.processes = {index: Process(actor, None) for index, actor in enumerate(actors)}
        return pool

    def __getitem__(self, index: int) -> Any:
        """Worker ``index``'s actor handle."""
        return self.processes[index].actor

    def __contains__(self, index: int) -> bool:
        return index in self.processes

    # ---- starting -------------------------------------------------------------------------
    def start(self, n: int, shared: Optional[PlacementGroup] = None) -> list[Any]:
        """The job's first ``n`` workers (indices 0..n-1) in one placement group (all or nothing, in
        time); ``shared``: worker i in bundle i of the learner's group (cluster.colocate), which the
        learner's side reserved and removes."""
        r = self.cfg.cluster
        if shared is None:
            group = reserve("stabledrl-rollout", r.rollout, n, r.rollout_strategy, r.start_timeout_s)
            self.groups.append(group)
        else:
            group = shared
        return [self._launch(index, Placement(group, index, owned=False, shared=shared is not None))
                for index in range(n)]

    def launch(self, index: int, replaces: bool) -> Any:
        """A process for worker ``index``: in place of its dead or hung one (``replaces``: killed,
        its bundle reused), else on a freed bundle of the start group or a placement group of its
        own (its start then waits for the cluster to place it)."""
        if replaces:
            old = self.processes[index]
            ray.kill(old.actor, no_restart=True)
            return self._launch(index, old.placement)
        if self.free:
            return self._launch(index, self.free.pop(0))
        group = placement_group([bundle(self.cfg.cluster.rollout)], strategy="STRICT_PACK",
                                name=f"stabledrl-rollout-{index}")
        return self._launch(index, Placement(group, 0, owned=True))

    def _launch(self, index: int, placement: Placement) -> Any:
        if self.cfg is None:
            raise RuntimeError("this pool holds workers started elsewhere: it cannot start or replace one")
        cfg, a = self.cfg, self.cfg.algorithm
        options = {"scheduling_strategy": in_group(placement.group, placement.bundle)}
        if placement.shared:
            options["num_gpus"] = shared_gpus(cfg.cluster.rollout)
        actor = self.actor_cls.options(**options).remote(
            index, rollout_model(cfg), cfg.sampler, cfg.estimator, cfg.task, group_size=a.group_size, seed=cfg.run.seed,
            share_gpu=placement.shared, view_weights=placement.shared and self.views)
        self.processes[index] = Process(actor, placement)
        return actor

    # ---- leaving --------------------------------------------------------------------------
    def remove(self, index: int) -> None:
        """Stop worker ``index`` and give its placement back (a start-group bundle is kept for reuse)."""
        process = self.processes.pop(index, None)
        if process is None:
            return
        ray.kill(process.actor, no_restart=True)
        if process.placement is None:
            return
        if process.placement.owned:
            remove_placement_group(process.placement.group)
        else:
            self.free.append(process.placement)

    def has_room(self) -> bool:
        """A freed bundle, or free resources for one more worker's bundle somewhere in the cluster."""
        return bool(self.free) or (self.cfg is not None and has_room(self.cfg.cluster.rollout))

    def can_place(self, reserved: Sequence[PlacementGroup] = ()) -> bool:
        """Whether some alive node could hold one more worker's bundle with its total resources less
        the bundles of ``reserved`` placed on it (the learner's group, which never moves): False
        when the nodes that could have left, so a replacement cannot be placed until a node joins."""
        if self.cfg is None:
            return True
        return can_hold(bundle(self.cfg.cluster.rollout), reserved)

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Close every worker (reward sandbox, push channel) and let its process exit; ``ray.kill``
        takes any that has not answered within ``grace_s`` (a killed worker with live threads
        aborts noisily in its log). A worker whose close did not answer is still busy (a request
        of slow rewards): it is killed at once, not asked to exit after the busy call too, so a
        Ctrl-C ends the job within ``grace_s`` (its reward sandbox ends on its own, its directory
        is removed by the next job's sandbox)."""
        processes = list(self.processes.values())
        closing = [p.actor.close.remote() for p in processes]
        closed, _ = ray.wait(closing, num_returns=len(closing), timeout=grace_s)
        exiting = [p.actor.__ray_terminate__.remote() for p, ref in zip(processes, closing) if ref in closed]
        ray.wait(exiting, num_returns=len(exiting), timeout=grace_s)
        for process in processes:
            ray.kill(process.actor, no_restart=True)
            if process.placement is not None and process.placement.owned:
                remove_placement_group(process.placement.group)
        self.processes.clear()
        for group in self.groups:
            remove_placement_group(group)
        self.groups.clear()


def node_alive(node_id: Optional[str]) -> bool:
    """Whether the Ray node ``node_id`` is still in the cluster (unknown: assumed alive)."""
    if node_id is None:
        return True
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())


def gcs_alive(address: Optional[str] = None, timeout_s: float = 2.0) -> bool:
    """Whether the Ray cluster's GCS (``address``, default this process's) accepts a connection;
    True when this process is not on Ray."""
    if address is None and not ray.is_initialized():
        return True
    host, _, port = (address or ray.get_runtime_context().gcs_address).rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def can_hold(need: dict[str, float], reserved: Sequence[PlacementGroup] = ()) -> bool:
    """Whether an alive node of the cluster has the resources ``need`` asks for in total, less the
    bundles of the ``reserved`` placement groups that are placed on it."""
    taken: dict[str, dict[str, float]] = {}
    for group in reserved:
        table = placement_group_table(group)
        for index, node in table.get("bundles_to_node_id", {}).items():
            for name, amount in table["bundles"][index].items():
                taken.setdefault(node, {})[name] = taken.get(node, {}).get(name, 0.0) + amount
    return any(n["Alive"] and all(n.get("Resources", {}).get(k, 0.0) - taken.get(n["NodeID"], {}).get(k, 0.0) >= v
                                  for k, v in need.items()) for n in ray.nodes())

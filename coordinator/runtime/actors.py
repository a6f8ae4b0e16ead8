"""Building the actors from one validated JobConfig, and waiting on them with named timeouts.

Each role gets a placement group (coordinator/runtime/placement.py): M learner ranks that must all exist
to form their process group, N rollout workers (coordinator/runtime/pool.py); with ``cluster.colocate``
one group holds both, worker i beside rank i on its GPU. Every component receives
only its own config sections. ``wait`` is how the runtime blocks on actors while it sets the job
up, saves or exports: a timeout or a dead actor becomes an error that names what was waited for
(the loop itself never blocks on one call: coordinator/runtime/executor.py).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

from stabledrl.common.config.job import JobConfig
from stabledrl.common.transport.plan import PushPlan
from stabledrl.common.types import Group
from stabledrl.coordinator.decisions.events import ActorFailure
from stabledrl.coordinator.runtime.placement import in_group, reserve, shared_bundle, shared_gpus
from stabledrl.coordinator.runtime.pool import RolloutPool

log = logging.getLogger(__name__)

__all__ = ["ActorFailure", "Actors", "first_line", "start_actors", "wait"]


def first_line(error: BaseException, limit: int = 500) -> str:
    """The first line of ``error``'s message (a Ray error's later lines are a traceback), cut at a
    word boundary with "…" past ``limit`` characters."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def wait(refs: Sequence[ray.ObjectRef], timeout_s: float, what: str | Sequence[str]) -> list[Any]:
    """ray.get(refs) within ``timeout_s``; ``what`` names the call (one name, or one per ref).

    Fails fast: the first call that fails (its actor died, it raised) ends the wait at once, with
    the calls still running named, instead of waiting for a collective that can no longer finish."""
    names = [what] * len(refs) if isinstance(what, str) else list(what)
    name_of = dict(zip(refs, names))
    deadline = time.monotonic() + timeout_s
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            missing = dict.fromkeys(name_of[r] for r in pending)
            raise ActorFailure(f"waited {timeout_s:.0f} s for {', '.join(missing)}; no answer")
        try:
            ray.get(ready[0])
        except ray.exceptions.RayError as e:
            still = dict.fromkeys(name_of[r] for r in pending)
            running = f" (still running: {', '.join(still)})" if still else ""
            raise ActorFailure(
                f"{name_of[ready[0]]} failed: {first_line(getattr(e, 'cause', None) or e)}{running}"
            ) from e
    return ray.get(list(refs))


@dataclass
class Actors:
    """Handles of one job's actors; ``learners[r]`` is learner rank r, ``pool`` the rollout workers."""

    learners: list[Any]
    pool: Any  # RolloutPool, or a list of worker handles to adopt as a fixed pool
    groups: list[PlacementGroup] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.pool, list):
            self.pool = RolloutPool.adopt(self.pool)

    @property
    def rollouts(self) -> list[Any]:
        """The rollout workers' handles, by index."""
        return [self.pool[index] for index in sorted(self.pool.processes)]

    def call_learners(self, method: str, *args: Any, **kwargs: Any) -> list[ray.ObjectRef]:
        """The same call on every rank (the collective methods of LearnerWorker)."""
        return [getattr(a, method).remote(*args, **kwargs) for a in self.learners]

    def train(self, groups: Sequence[Group], version: int) -> list[ray.ObjectRef]:
        """Whole groups to each rank, contiguous and balanced by count (rank r gets groups
        offset_r .. offset_r + n_r - 1 of the step: group indices are unique over the step)."""
        m = len(self.learners)
        sizes = [len(groups) // m + (r < len(groups) % m) for r in range(m)]
        refs, offset = [], 0
        for rank, n in enumerate(sizes):
            refs.append(self.learners[rank].train.remote(list(groups[offset : offset + n]), version, offset))
            offset += n
        return refs

    def shutdown(self) -> None:
        for actor in self.learners:
            ray.kill(actor)
        self.pool.shutdown()
        for group in self.groups:
            remove_placement_group(group)


def start_actors(cfg: JobConfig, plan: PushPlan, *, rollout_cls: type, learner_cls: type) -> Actors:
    """Reserve both roles, start every actor, form the learner group and build its engine; ``plan``:
    the job's weight push at its start (whether the workers will view their ranks' parameters)."""
    t0 = time.perf_counter()
    timeout = cfg.cluster.start_timeout_s
    m, n = cfg.learner.num_ranks, cfg.rollout.num_workers
    c = cfg.cluster
    if c.colocate:  # rank i and worker i in bundle i, half its GPU each (cluster.colocate)
        learner_pg = reserve("stabledrl-colocated", shared_bundle(c.learner, c.rollout), m, c.learner_strategy, timeout)
    else:
        learner_pg = reserve("stabledrl-learner", c.learner, m, c.learner_strategy, timeout)
    pool = RolloutPool(cfg, rollout_cls, views=plan.views)
    try:
        workers = pool.start(n, shared=learner_pg if c.colocate else None)
    except ActorFailure:
        remove_placement_group(learner_pg)
        raise
    learner_actor = ray.remote(num_cpus=c.learner.num_cpus,
                               num_gpus=shared_gpus(c.learner) if c.colocate else c.learner.num_gpus)(learner_cls)
    a = cfg.algorithm
    learner = cfg.learner  # host memory for background saves is reserved only where the run makes them
    if not (cfg.run.async_checkpoint and cfg.run.checkpoint_every > 0) and learner.checkpoint.reserve:
        learner = learner.model_copy(update={"checkpoint": learner.checkpoint.model_copy(update={"reserve": False})})
    learners = [
        learner_actor.options(scheduling_strategy=in_group(learner_pg, r)).remote(
            r, m, cfg.model, learner, cfg.estimator, cfg.loss, inner_iterations=a.inner_iterations,
            advantage_scale=a.advantage_scale, micro_batch_size=a.micro_batch_size, share_gpu=c.colocate)
        for r in range(m)
    ]
    actors = Actors(learners, pool, [learner_pg])
    try:
        addr, port = wait([learners[0].rendezvous_address.remote()], timeout, "learner rank 0 (rendezvous address)")[0]
        starts = [a.start.remote(addr, port) for a in learners]
        readies = [w.ready.remote() for w in workers]
        infos = wait(starts + readies, timeout, [f"learner rank {r} (start)" for r in range(m)]
                     + [f"rollout worker {i} (model load)" for i in range(n)])
    except BaseException:
        actors.shutdown()  # a half-started job leaves no actors or reservations behind
        raise
    actors.info = {"learners": infos[:m], "rollouts": infos[m:], "start_s": time.perf_counter() - t0}
    beside = ", each beside its learner rank (cluster.colocate)" if c.colocate else ""
    log.info(f"actors: {m} learner ranks on {infos[0]['device']} ({infos[0]['dtype']}), {n} rollout workers on "
             f"{infos[m]['device']} ({infos[m]['parameters'] / 1e6:.2f}M parameters){beside}, "
             f"up in {actors.info['start_s']:.1f} s")
    log.info(f"reward sandbox: {infos[m].get('reward_sandbox', 'n/a')}")  # how reward code is confined, once
    return actors

"""What the driver does when rollout workers come, go or die, and how weights reach them.

Faults. A call on a worker whose process died (SIGKILL, OOM, its node gone) raises
``RayActorError``. Every call of that worker is forgotten, its rollout requests go back to the
front of the queue under their uids (the staleness bound releases their places; re-admitted,
they are sampled with the same seeds, and the buffer accepts a uid once, so no sample is lost or
counted twice), and the worker is replaced in place, at most ``rollout.max_restarts`` times: one
more death fails the job naming the worker and the last cause. A worker lost *with its node* is
dropped instead while at least ``rollout.min_workers`` remain (the cluster shrank). A worker that
cannot start within ``cluster.start_timeout_s`` is given up the same way.

Elasticity. Between steps the driver reports its status to the job's control actor
(coordinator/control.py) and takes a requested worker count (``stabledrl scale``); with
``rollout.autoscale`` it asks for one more worker whenever the cluster has room for one, up to
``rollout.max_workers`` (an explicit request turns autoscale off: the user took over). Extra
workers retire newest first: they take no new requests and leave once their queued ones are back.

Weights for a new worker. Object store: its first calls are ``setup_weight_push`` and
``receive_weights`` of the newest version, queued before any request (Ray runs an actor's calls
in order), so it never samples with stale weights. Broadcast (NCCL / gloo): it waits in
``syncing`` until the next push, for which the group is rebuilt with every current member; a push
during which a receiver dies is retried once with the group rebuilt without it.
"""
from __future__ import annotations

from typing import Any, Optional

import ray

from common.transport.weights import WeightHandle
from coordinator.actors import ActorFailure, wait
from coordinator.control import start_control
from coordinator.inflight import Pending
from coordinator.pool import Worker


class WorkerEvents:
    """Mixed into Driver: it reads ``cfg``, ``pool``, ``inflight``, ``staleness``, ``requeue``,
    ``actors`` and ``log`` of the driver."""

    def __init__(self) -> None:
        self.latest: Optional[WeightHandle] = None  # newest object-store push, for a worker that joins
        self.push_members: Optional[list[int]] = None  # broadcast group members, in rank order
        self.target_workers = self.cfg.rollout.num_workers
        self.autoscale = self.cfg.rollout.autoscale
        self.control = None
        self.versions_at_close: list[int] = []
        self.counts = {"faults/rollout_worker_deaths": 0, "faults/rollout_workers_replaced": 0,
                       "faults/rollout_workers_dropped": 0, "elastic/workers_added": 0, "elastic/workers_retired": 0}

    @property
    def pool(self) -> Any:
        return self.actors.pool

    @property
    def worker_versions(self) -> list[int]:
        """Weights version each active worker acknowledged, by index (as at close once closed)."""
        if self.actors is None:
            return list(self.versions_at_close)
        return [w.version for w in sorted(self.pool.active(), key=lambda w: w.index)]

    @worker_versions.setter
    def worker_versions(self, versions: list[int]) -> None:
        for worker, version in zip(sorted(self.pool.active(), key=lambda w: w.index), versions):
            worker.version = version

    def worker_metrics(self) -> dict[str, float]:
        versions = self.worker_versions
        return {"rollout/workers": float(len(self.pool.live())),
                "rollout/worker_version_min": float(min(versions)) if versions else -1.0,
                **{k: float(v) for k, v in self.counts.items()}}

    # ---- results and deaths -----------------------------------------------------------------
    def on_worker_result(self, ref: ray.ObjectRef, job: Pending) -> None:
        try:
            value = ray.get(ref)
        except ray.exceptions.RayActorError as e:  # the process died: not the request's fault
            self.on_worker_lost(job, e)
            return
        except ray.exceptions.RayError as e:
            raise ActorFailure(f"{job.what} failed: {e}") from e
        if job.kind == "rollout":
            self.on_rollout(job, value)
        elif job.kind == "ack":
            worker = self.pool.get(job.worker)
            if worker is not None and worker.restarts == job.incarnation:
                worker.version = value
        elif job.kind == "start":
            self.on_started(job, value)

    def on_worker_lost(self, job: Pending, cause: Exception) -> None:
        worker = self.pool.get(job.worker)
        current = worker is not None and worker.restarts == job.incarnation
        lost = [job] + (self.inflight.pop_worker(worker.index) if current else [])
        requests = [r for j in lost if j.kind == "rollout" for r in j.requests]
        if requests:
            self.staleness.abort(len(requests))
            self.requeue = sorted(self.requeue + requests, key=lambda r: r.uid)
        if not current:  # a second call of a death already handled
            return
        self.counts["faults/rollout_worker_deaths"] += 1
        reason = _first_line(cause)
        uids = ", ".join(str(r.uid) for r in requests) or "none"
        remaining = len(self.pool.live()) - 1
        if worker.state == "retiring":
            self.pool.remove(worker)
            self.log(f"{worker.name} died while retiring ({reason}); prompts {uids} re-queued")
        elif not self.pool.node_alive(worker) and remaining >= self.cfg.rollout.min_workers:
            self.drop(worker, f"lost with its node ({reason}); prompts {uids} re-queued")
        elif worker.restarts >= self.cfg.rollout.max_restarts:
            raise ActorFailure(f"{worker.name} died {worker.restarts + 1} times, the last time: {reason}; giving up "
                               f"(rollout.max_restarts = {self.cfg.rollout.max_restarts})")
        else:
            new = self.pool.replace(worker)
            self.watch_start(new, f"{new.name} (replacement {new.restarts})")
            self.counts["faults/rollout_workers_replaced"] += 1
            self.log(f"{worker.name} died ({reason}); prompts {uids} re-queued; replacement {new.restarts} of at "
                     f"most {self.cfg.rollout.max_restarts} starting")

    def drop(self, worker: Worker, why: str) -> None:
        self.pool.remove(worker)
        self.target_workers = min(self.target_workers, len(self.pool.live()))
        self.counts["faults/rollout_workers_dropped"] += 1
        self.log(f"{worker.name} {why}; continuing with {len(self.pool.live())} workers")

    # ---- starting -----------------------------------------------------------------------------
    def watch_start(self, worker: Worker, what: str) -> None:
        self.inflight.add(worker.actor.ready.remote(),
                          Pending("start", what, worker=worker.index, incarnation=worker.restarts))

    def on_started(self, job: Pending, info: dict[str, Any]) -> None:
        worker = self.pool.get(job.worker)
        if worker is None or worker.restarts != job.incarnation:
            return
        worker.info = info
        if worker.state == "retiring":
            self.pool.remove(worker)
            return
        if self.cfg.weights.resolved_backend == "object_store":
            worker.actor.setup_weight_push.remote(self.cfg.weights, partial=self.partial_push)  # before the receive
            if self.latest is not None:
                self.watch_ack(worker, self.latest)
            worker.state = "active"
        else:
            worker.state = "syncing"  # the next push rebuilds the group with it
        self.log(f"{worker.name} started on node {info['node_id'][:12]} (pid {info['pid']}, "
                 f"{'weights version ' + str(self.latest.version) if self.latest else 'initial weights'})")

    def on_start_timeout(self, ref: ray.ObjectRef, job: Pending) -> None:
        self.inflight.jobs.pop(ref)
        worker = self.pool.get(job.worker)
        if worker is None or worker.restarts != job.incarnation:
            return
        why = (f"did not start within cluster.start_timeout_s = {self.cfg.cluster.start_timeout_s:.0f} s "
               f"(the cluster has {ray.available_resources()} free)")
        if len(self.pool.live()) - 1 < self.cfg.rollout.min_workers:
            raise ActorFailure(f"{job.what} {why}")
        self.drop(worker, why)

    # ---- between steps: the requested size ------------------------------------------------------
    def start_control(self) -> None:
        r = self.cfg.rollout
        self.control = start_control(self.cfg.run.job_name, r.min_workers, r.worker_limit)

    def stop_control(self) -> None:
        if self.control is not None:
            ray.kill(self.control)
            self.control = None

    def between_steps(self) -> None:
        status = {"state": "training", "step": self.step, "version": self.staleness.version,
                  "target": self.target_workers, **self.pool.status()}
        requested = None
        if self.control is not None:  # a driver on actors it did not start has none
            try:
                requested = ray.get(self.control.poll.remote(status), timeout=30)
            except ray.exceptions.RayError as e:
                self.log(f"control actor did not answer ({_first_line(e)}); `stabledrl scale` is unavailable")
        if requested is not None:
            if self.autoscale:
                self.log("autoscale off: `stabledrl scale` set the size")
            self.autoscale, self.target_workers = False, requested
        live = len(self.pool.live())
        if self.autoscale and live < self.cfg.rollout.worker_limit and self.pool.has_room():
            self.target_workers = max(self.target_workers, live + 1)
        self.reconcile()

    def reconcile(self) -> None:
        """Start or retire workers until ``target_workers`` count (retiring the newest first)."""
        live = self.pool.live()
        for _ in range(self.target_workers - len(live)):
            worker = self.pool.add()
            self.watch_start(worker, f"{worker.name} (added)")
            self.counts["elastic/workers_added"] += 1
            self.log(f"{worker.name} starting ({len(live) + 1} of {self.target_workers} workers)")
            live.append(worker)
        for worker in sorted(live, key=lambda w: w.index, reverse=True)[: max(0, len(live) - self.target_workers)]:
            worker.state = "retiring"
            self.log(f"{worker.name} retiring ({self.target_workers} workers requested)")

    def retire_idle(self) -> None:
        for worker in [w for w in self.pool.workers.values() if w.state == "retiring"]:
            if not self.inflight.of_worker(worker.index):
                self.pool.remove(worker)
                self.counts["elastic/workers_retired"] += 1
                self.log(f"{worker.name} retired; {len(self.pool.live())} workers")

    # ---- weights ------------------------------------------------------------------------------
    def push_targets(self) -> list[Worker]:
        return sorted((w for w in self.pool.workers.values() if w.state in ("active", "syncing")), key=lambda w: w.index)

    @property
    def partial_push(self) -> bool:
        """A LoRA learner pushes only the adapted matrices; workers keep their other weights."""
        return self.cfg.learner.lora is not None

    def setup_weight_push(self) -> None:
        cfg, actors = self.cfg.weights, self.actors
        timeout = self.cfg.cluster.start_timeout_s
        members = self.push_targets()
        if cfg.resolved_backend == "object_store":
            refs = actors.call_learners("setup_weight_push", cfg) + [
                w.actor.setup_weight_push.remote(cfg, partial=self.partial_push) for w in members]
        else:
            addr, port = wait([actors.learners[0].rendezvous_address.remote()], timeout, "learner rank 0 (address)")[0]
            world = 1 + len(members)
            refs = actors.call_learners("setup_weight_push", cfg, rank=0, world_size=world, master_addr=addr,
                                        master_port=port, peer_names=[w.name for w in members])
            refs += [w.actor.setup_weight_push.remote(cfg, rank=i + 1, world_size=world, master_addr=addr,
                                                      master_port=port, partial=self.partial_push)
                     for i, w in enumerate(members)]
        wait(refs, timeout, "weight push set-up on every learner rank and rollout worker")
        self.push_members = [w.index for w in members]

    def push_weights(self, version: int) -> float:
        """Learner rank 0 -> every rollout worker as ``version``. Object store: the learner puts
        the weights once, each worker loads them before its next request and acknowledges later
        (tracked by the loop, with the push timeout); a broadcast runs on all of them at once."""
        import time

        t0 = time.perf_counter()
        if self.cfg.weights.resolved_backend == "object_store":
            self.latest = wait(self.actors.call_learners("push_weights", version), self.cfg.weights.timeout_s,
                               f"learner ranks (weights version {version})")[0]
            for worker in self.pool.active():
                self.watch_ack(worker, self.latest)
        else:
            self.broadcast(version)
        return time.perf_counter() - t0

    def watch_ack(self, worker: Worker, handle: WeightHandle) -> None:
        self.inflight.add(worker.actor.receive_weights.remote(handle),
                          Pending("ack", f"{worker.name} (weights version {handle.version})", worker=worker.index,
                                  incarnation=worker.restarts))

    def broadcast(self, version: int, attempt: int = 0) -> None:
        members = self.push_targets()
        if [w.index for w in members] != self.push_members:
            self.setup_weight_push()
        handle = WeightHandle(version, self.cfg.weights.resolved_backend)
        sends = self.actors.call_learners("push_weights", version)
        staging = self.cfg.weights.staging
        if staging:  # received beside the running request; applied below, in order with the requests
            receives = [w.actor.stage_weights.remote(handle, self.cfg.algorithm.in_order) for w in members]
        else:
            receives = [w.actor.receive_weights.remote(handle) for w in members]
        names = [f"learner rank {r} (weights version {version})" for r in range(len(sends))]
        try:
            wait(sends + receives, 10 * self.cfg.weights.timeout_s, names + [f"{w.name} (weights version {version})"
                                                                               for w in members])
        except ActorFailure:
            dead = [(w, ref) for w, ref in zip(members, receives) if _died(ref)]
            if not dead or attempt > 0:
                raise
            for worker, ref in dead:
                self.on_worker_lost(Pending("ack", worker.name, worker=worker.index, incarnation=worker.restarts),
                                    RuntimeError("died during a weight push"))
            self.push_members = None  # rebuild the group without them, push again
            self.broadcast(version, attempt + 1)
            return
        for worker in members:
            worker.state = "active"
            if staging:
                self.watch_ack(worker, handle)
            else:
                worker.version = version


def _died(ref: ray.ObjectRef) -> bool:
    ready, _ = ray.wait([ref], timeout=0)
    if not ready:
        return False
    try:
        ray.get(ref)
    except ray.exceptions.RayActorError:
        return True
    except ray.exceptions.RayError:
        return False
    return False


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__

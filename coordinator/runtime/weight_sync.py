"""The driver's end of the weight push: it carries out the plan ``plan_push`` makes
(common/transport/plan.py: transport, sending ranks, staging, LoRA) as the Ray calls of the
set-up and of each push; common/transport does the transfer itself.

Object store: learner rank 0's ``push_weights`` returns a handle to the object it put; each
worker's ``receive_weights`` is called with the *reference* to that handle, so it is queued at
once behind the worker's earlier requests and runs as soon as the object exists; the driver never
waits for the put. A worker that starts later sets up its end and loads the newest handle before
its first request.

Collective (nccl / gloo / peer): every receiver must take part in every push, so a push is a
barrier across its receivers, explicit in the Push command (the scheduler sends them no new
requests until it is over). The group is built with its members; a push to another set of
members, or after a failed push (a broken communicator cannot be trusted), builds it again, in
the same order of calls on each actor, so nothing blocks but the rendezvous address. Each build
asks ``plan_push`` again, telling it whether every learner rank and member runs on one Ray node
(the start-up reports' and each started worker's ``node_id``): ``auto`` pulls over peer there and
broadcasts otherwise, and the job's log says which, once per change. A push over such a peer group
that fails falls back (``failed``): every later plan is the broadcast, and the push is made again.

Sharded (``plan.sources`` S >= 1): the group's ranks 0..S-1 are the learner ranks that hold
partitions, each calling ``send_shards`` from its ``push_weights``; the workers are ranks S.. .

ipc with ``weights.ipc: view`` (common/transport/views.py): the set-up also makes a push of version 0,
so every worker points its parameters at its learner rank's before its first request and frees the
copy it loaded (on the host, on a GPU: rollout/worker.py); every later push is a version check.

Staging (``plan.staged``): each receiver takes the push with ``stage_weights``, in its "weights"
concurrency group, into a second copy of its weights while it generates, so the push does not
wait for the request it is running; a later ``receive_weights`` of that version (a LoadWeights)
swaps the copy in, in order with its requests. With ``keep_order`` (in-order runs) a staged
version is never replaced before it is applied. A push that rebuilds the group is not staged: the
members' set-up runs in order with their requests, and a stage on the other thread could start
before it.

LoRA (``plan.partial``): the learner pushes only the matrices it adapts, merged, or their
adapters A and B (``plan.adapters``), which every worker holds unmerged (common/models/lora.py);
every worker's end is set up to accept a push that carries only some of its parameters (and
stages only those).
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Optional, Sequence

import ray

from stabledrl.common.transport import WeightHandle
from stabledrl.common.transport.plan import PULL, PushInputs, PushPlan, plan_push
from stabledrl.coordinator.runtime.actors import Actors, wait

log = logging.getLogger(__name__)


def push_calls(backend: str, learners: Sequence[Any], workers: Sequence[Any], version: int,
               stage: Optional[bool] = None, partners: Optional[Sequence[int]] = None
               ) -> tuple[list[ray.ObjectRef], list[ray.ObjectRef]]:
    """(every learner rank's ``push_weights``, every worker's ``receive_weights``) of one push.
    Object store: the receivers get the reference of rank 0's handle; ipc: worker j the reference
    of the handle of the learner rank on its device (``partners[j]``); collective: a handle naming
    the version, the data arriving through the group. ``stage`` (collective; its value is
    ``keep_order``): the workers' ``stage_weights`` instead."""
    sends = [a.push_weights.remote(version) for a in learners]
    if backend == "ipc":
        return sends, [w.receive_weights.remote(sends[p]) for w, p in zip(workers, partners)]
    handle = sends[0] if backend == "object_store" else WeightHandle(version, backend)
    if stage is not None:
        return sends, [w.stage_weights.remote(handle, stage) for w in workers]
    return sends, [w.receive_weights.remote(handle) for w in workers]


class WeightSync:
    """The driver's end of the push: carries out the plan ``plan_push`` makes (common/transport/plan.py)
    at the job's start and at each build of a push group."""

    def __init__(self, inputs: PushInputs, actors: Actors, timeout_s: float,
                 plan: Optional[PushPlan] = None) -> None:
        self.inputs, self.actors, self.timeout_s = inputs, actors, timeout_s
        self.peer_failed = False  # a pull that auto chose failed: every later group is broadcast
        # the job's start (the driver's, else planned here); each group built replaces it with its own
        self.plan = plan if plan is not None else plan_push(inputs)
        self.learner_nodes = {info.get("node_id") for info in actors.info.get("learners", [])}
        self.members: Optional[tuple[int, ...]] = None  # the collective group as built, in rank order
        self.built: Optional[str] = None  # the transport of the last group built
        # object store: version -> [rank 0's handle]; ipc: every rank's (the newest version only)
        self.handles: dict[int, list[ray.ObjectRef]] = {}

    @property
    def receiving(self) -> dict[str, Any]:
        """The workers' end: partial pushes, and the LoRA adapters they hold unmerged."""
        return {"partial": self.plan.partial, "lora": self.plan.adapters}

    def setup(self, nodes: Mapping[int, Optional[str]]) -> None:
        """Set up every learner rank and every worker of the job's start (blocking, named timeouts);
        ``nodes``: each worker's Ray node (the runtime's, from their start-up reports)."""
        plan, pool = self.plan, self.actors.pool
        if not plan.collective:
            refs = self.actors.call_learners("setup_weight_push", plan.transport, sources=plan.sources)
            refs += [pool[i].setup_weight_push.remote(plan.transport, **self.receiving) for i in sorted(pool.processes)]
            wait(refs, self.timeout_s, "weight push set-up on every learner rank and rollout worker")
            if plan.views:  # every worker views its rank's parameters before its first request, and frees its copy
                sends, receives, _ = self.push(0, sorted(pool.processes))
                wait([ref for _, ref in sends + receives], self.timeout_s,
                     "the first push in place (weights.ipc view) on every learner rank and rollout worker")
            return
        members = tuple(sorted(pool.processes))
        wait(self._setup_group(members, nodes), self.timeout_s,
             "weight push set-up on every learner rank and rollout worker")

    def on_one_host(self, members: Sequence[int], nodes: Mapping[int, Optional[str]]) -> bool:
        """Every learner rank and member (worker index -> Ray node in ``nodes``) runs on one known node."""
        hosts = self.learner_nodes | {nodes.get(i) for i in members}
        known = bool(self.learner_nodes) and None not in hosts  # every learner rank reported its node
        return known and len(hosts) == 1

    def _setup_group(self, members: tuple[int, ...], nodes: Mapping[int, Optional[str]]) -> list[ray.ObjectRef]:
        """Every member's ``setup_weight_push`` for a group of the sending learner ranks (rank 0,
        or sharded ranks 0..sources-1) and ``members`` (the learner ranks' calls first, one each,
        then the workers' in ``members`` order), over the transport the group's plan names."""
        one_host = self.on_one_host(members, nodes)
        self.plan = plan = plan_push(self.inputs, one_host=one_host, peer_failed=self.peer_failed)
        cfg = plan.transport
        if plan.by_host and cfg.backend != self.built:
            where = ("every learner rank and rollout worker runs on one host" if one_host else
                     "the learner ranks and rollout workers run on more than one host")
            log.info(f"weights: the push group of rollout workers {list(members)} is built over {cfg.backend} "
                     f"(auto: {where})")
        self.built = cfg.backend
        learners, pool = self.actors.learners, self.actors.pool
        addr, port = wait([learners[0].rendezvous_address.remote()], self.timeout_s, "learner rank 0 (address)")[0]
        first = max(plan.sources, 1)  # the first worker's rank in the group
        world = first + len(members)
        refs = self.actors.call_learners("setup_weight_push", cfg, rank=0, world_size=world, master_addr=addr,
                                         master_port=port, peer_names=[f"rollout worker {i}" for i in members],
                                         sources=plan.sources)
        refs += [pool[index].setup_weight_push.remote(cfg, rank=first + r, world_size=world, master_addr=addr,
                                                      master_port=port, sources=plan.sources, **self.receiving)
                 for r, index in enumerate(members)]
        self.members = members
        return refs

    def push(self, version: int, receivers: Sequence[int], nodes: Optional[Mapping[int, Optional[str]]] = None
             ) -> tuple[list[tuple[int, ray.ObjectRef]], list[tuple[int, ray.ObjectRef]], bool]:
        """The calls of one push: ([(learner rank, call)], [(worker index, call)], staged): a rebuilt
        group's set-up calls, then the sends and the receives; ``staged``: the receivers staged it
        (each applies it with ``load``). ``nodes``: each worker's Ray node (a rebuilt group's transport)."""
        pool, m = self.actors.pool, len(self.actors.learners)
        learner_calls: list[tuple[int, ray.ObjectRef]] = []
        worker_calls: list[tuple[int, ray.ObjectRef]] = []
        staged = self.plan.staged
        if self.plan.collective and tuple(receivers) != self.members:
            setup = self._setup_group(tuple(receivers), nodes or {})
            learner_calls += list(enumerate(setup[:m]))
            worker_calls += list(zip(receivers, setup[m:]))
            staged = False  # the set-up runs in order with the requests; the stage would not wait for it
        backend = self.plan.backend
        partners = [self.partner(i) for i in receivers] if backend == "ipc" else None
        sends, receives = push_calls(backend, self.actors.learners, [pool[i] for i in receivers], version,
                                     stage=self.plan.keep_order if staged else None, partners=partners)
        if not self.plan.collective:  # an older version is never loaded again: its object may go
            self.handles = {version: sends}
        return learner_calls + list(enumerate(sends)), worker_calls + list(zip(receivers, receives)), staged

    def partner(self, index: int) -> int:
        """ipc: the learner rank whose device worker ``index`` shares (its bundle of the colocated group)."""
        process = self.actors.pool.processes.get(index)
        placement = process.placement if process is not None else None
        if placement is None or not placement.shared:
            raise RuntimeError(f"weights.backend ipc: rollout worker {index} shares no GPU with a learner rank (a "
                               "worker added beyond cluster.colocate's shared GPUs); use weights.backend object_store")
        return placement.bundle

    def failed(self, detail: str = "", died: bool = False) -> bool:
        """A collective push failed: the group is rebuilt before the next one. A group that ``auto``
        built over peer, where no member died (a death is retried without the dead, over the same
        transport): every later group is built over the broadcast (CUDA IPC may be refused between
        these processes or GPUs); True: it falls back now, and the push is made again."""
        self.members = None
        if died or not self.plan.by_host or self.built != PULL:
            return False
        self.peer_failed = True
        short = detail if len(detail) <= 300 else detail[:300].rsplit(" ", 1)[0] + " …"  # every member's error
        spread = plan_push(self.inputs, peer_failed=True).backend
        log.info(f"weights: the push over peer failed ({short}); auto builds every push group over "
                 f"{spread} from now on")
        return True

    def setup_worker(self, index: int) -> ray.ObjectRef:
        """Object store: a worker that started later sets up its end (before its first load)."""
        return self.actors.pool[index].setup_weight_push.remote(self.plan.transport, **self.receiving)

    def load(self, index: int, version: int) -> ray.ObjectRef:
        """Worker ``index`` holds ``version`` before its next request. Object store: it loads that
        version's object (a LoadWeights follows its Push at once, so it is the newest); a staged
        push: it applies the copy of that version it staged."""
        if self.plan.collective:
            handle = WeightHandle(version, self.plan.backend)
        elif version in self.handles:
            handle = self.handles[version][self.partner(index) if self.plan.backend == "ipc" else 0]
        else:
            raise ValueError(f"weights version {version} was not pushed through the object store (newest: "
                             f"{max(self.handles, default=None)}); LoadWeights must follow its Push")
        return self.actors.pool[index].receive_weights.remote(handle)

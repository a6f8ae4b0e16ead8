"""The weight push as one plan: what carries the weights from the learner ranks to the rollout
workers, from which ranks, staged or not, and what of a LoRA learner travels.

``plan_push`` is the one place this is decided: at the job's start, at each build of a push group
(where ``auto`` looks at the hosts the group's members run on) and after a pull that ``auto``
chose has failed. The driver's end (coordinator/runtime/weight_sync.py) carries the plan out, every
actor builds its end from ``plan.transport`` (``setup_weight_push``), and the dry run prints the
plans of the same function.

The rules, in the order ``plan_push`` applies them:

1. transport. ``weights.backend`` named outright is kept. ``auto``: colocated workers (sharing
   their learner ranks' GPUs, where NCCL cannot hold both) read their rank's weights over ipc when
   rank and worker take turns (``in_turns``), else through the object store; otherwise the NCCL
   broadcast when every learner rank and rollout worker holds a GPU (the actors' resources, not
   this process's devices), else the object store. ipc: the worker views its rank's parameters in
   place (``weights.ipc`` view) where it can (``views`` is None), else copies them.
2. sources. The learner ranks that send their own partitions, read where they lie: every ZeRO-3
   rank or rank 0 alone for a collective push; under ipc every ZeRO-3 rank of several. 0 (the
   object store): learner rank 0 gathers the full parameters and sends them. A LoRA learner's adapters travel as
   the parameters do; its merged matrices (W + s·B·A of gathered parameters), or any LoRA push over
   ipc, gather.
3. one host. ``auto``'s broadcast, sharded and in the learner's dtype, becomes the peer pull for a
   group whose learner ranks and members all run on one host (each worker reads the ranks' memory
   with its copy engines; the broadcast's kernels take the SMs of a worker that is generating:
   BENCHMARKS.md). A gathered push stays broadcast (a pull would keep a whole copy on rank 0's GPU).
   Once such a pull has failed, every later group is broadcast.
4. staging. A collective push (nccl, gloo, peer) is staged into a second copy of the weights beside
   the worker's generation where ``weights.staging`` says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from stabledrl.common.config.job import JobConfig
from stabledrl.common.config.learner import LearnerConfig, LoraConfig
from stabledrl.common.config.weights import WeightPushConfig

PULL = "peer"  # auto's transport for a group on one host


@dataclass(frozen=True)
class PushInputs:
    """What the plan is decided from: the job's config and where its actors run."""

    weights: WeightPushConfig  # the ``weights`` section as configured (backend may be auto)
    learner: LearnerConfig
    gpus: bool = False  # every learner rank and rollout worker holds a GPU of its own (cluster.*.num_gpus)
    colocated: bool = False  # every worker shares its learner rank's device (cluster.colocate)
    in_turns: bool = False  # colocated, and rank and worker take turns (JobConfig.in_turns)
    views: Optional[str] = None  # why a worker could not view its rank's parameters (None: it can)
    keep_order: bool = False  # in-order runs: a staged version is never replaced before it is applied

    @classmethod
    def of(cls, cfg: JobConfig) -> "PushInputs":
        c = cfg.cluster
        gpus = c.learner.num_gpus > 0 and c.rollout.num_gpus > 0
        return cls(cfg.weights, cfg.learner, gpus, c.colocate, cfg.in_turns, cfg.ipc_view_problem(gpus),
                   cfg.algorithm.in_order)


@dataclass(frozen=True)
class PushPlan:
    """One push group's weight push, as every end of it is set up."""

    transport: WeightPushConfig  # backend and ipc resolved: every end of the push is built from it
    sources: int  # learner ranks 0..S-1 send their partitions; 0: rank 0 gathers and sends
    staged: bool  # receivers take the push into a second copy while they generate
    lora: Literal["none", "adapters", "merged"]  # what of a LoRA learner travels
    adapters: Optional[LoraConfig]  # the adapters the workers hold unmerged (lora adapters)
    keep_order: bool
    by_host: bool  # auto chooses this group's transport by where its members run (rule 3)

    @property
    def backend(self) -> str:
        return self.transport.backend

    @property
    def collective(self) -> bool:
        """Every receiver takes part in every push, set up as a group (nccl, gloo, peer)."""
        return self.transport.collective

    @property
    def partial(self) -> bool:
        """A push carries only some of the workers' parameters (a LoRA learner's)."""
        return self.lora != "none"

    @property
    def views(self) -> bool:
        """Every worker's parameters are views of its learner rank's (ipc view): a push is a version check."""
        return self.backend == "ipc" and self.transport.ipc == "view"


def plan_push(inputs: PushInputs, one_host: bool = False, peer_failed: bool = False) -> PushPlan:
    """The plan of a push group: ``one_host``, its learner ranks and members are known to run on
    one host; ``peer_failed``, a pull that ``auto`` chose has failed in this job. The job's start,
    before any group is built, is planned with neither."""
    w, lora = inputs.weights, inputs.learner.lora
    backend = w.backend
    if backend == "auto":
        if inputs.colocated:
            backend = "ipc" if inputs.gpus and inputs.in_turns else "object_store"
        else:
            backend = "nccl" if inputs.gpus else "object_store"
    ipc = w.ipc if w.ipc != "auto" else "copy" if inputs.views else "view"
    transport = w if (backend, ipc) == (w.backend, w.ipc) else w.model_copy(update={"backend": backend, "ipc": ipc})
    mode = "none" if lora is None else lora.push
    sources = _sources(transport, inputs.learner)
    by_host = w.backend == "auto" and backend == "nccl" and sources > 0 and w.dtype == "keep" and not peer_failed
    if by_host and one_host:
        transport = transport.model_copy(update={"backend": PULL})
    return PushPlan(transport, sources, transport.collective and w.staging, mode,
                    lora if mode == "adapters" else None, inputs.keep_order, by_host)


def _sources(transport: WeightPushConfig, learner: LearnerConfig) -> int:
    """Rule 2 for a resolved ``transport``: the learner ranks that send their own partitions."""
    lora = learner.lora
    if lora is not None and (lora.push != "adapters" or transport.backend == "ipc"):
        return 0
    zero3 = learner.deepspeed.zero_stage == 3
    if transport.backend == "ipc":  # one all-gather fills each rank's buffer (common/transport/ipc.py)
        return learner.num_ranks if zero3 and learner.num_ranks > 1 else 0
    if not transport.collective:
        return 0
    return learner.num_ranks if zero3 else 1

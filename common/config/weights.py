"""The weight push's config section (``weights``); the transports are in common/transport/."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from stabledrl.common.config.base import MAX_SECONDS, StrictModel


# options that are gone, with what to do instead (a config that sets one is refused, saying so)
REMOVED = {
    "source": "every push that can read the learner ranks' partitions where they lie does so (each ZeRO-3 "
              "rank sends its own; ZeRO-1/2: rank 0 its whole parameters), and the others gather (the object "
              "store, a merged LoRA push, LoRA over ipc); delete weights.source",
}


class WeightPushConfig(StrictModel):
    """How weights travel from learner rank 0 to the rollout workers."""

    backend: Literal["auto", "object_store", "nccl", "gloo", "ipc", "peer"] = Field(
        "auto",
        description="auto = when the learner ranks and rollout workers have GPUs (cluster.*.num_gpus) of their "
        "own: peer for a push group whose members all run on the learner's host, where the push sends each rank's "
        "own partitions in the learner's dtype (weights.dtype keep; a LoRA job's adapters too, not its merged "
        "push), the nccl broadcast "
        "otherwise, chosen again each time the group is rebuilt (a worker added on another host; a pull that "
        "fails makes the push again over nccl, and nccl from then on); with "
        "cluster.colocate on GPUs, ipc where rank and worker take turns "
        "(algorithm.max_staleness 0, no workers beyond the shared GPUs), else the Ray object store; gloo = the "
        "broadcast on CPU; ipc = every worker maps its learner rank's weights on their shared device (CUDA IPC; "
        "shared memory on CPUs) and copies them device to device (cluster.colocate only); peer = every worker reads "
        "the learner ranks' weights from their GPUs' memory with its copy engines (CUDA IPC over NVLink, no SM of "
        "the worker's used: a push beside its generation keeps its speed), scheduled as the broadcast is; every "
        "rollout worker must run on the learner's host",
    )
    timeout_s: float = Field(300.0, gt=0.0, le=MAX_SECONDS, description="longest any one wait of a transfer may take")
    bucket_mb: float = Field(512.0, gt=0.0, description="broadcast bucket size in MiB (one flat byte buffer each)")
    dtype: Literal["keep", "bf16", "fp16", "fp32"] = Field(
        "keep", description="dtype on the wire; keep = the learner's parameter dtype (bf16 on GPU). bf16 or fp16 "
        "halves the bytes of each push of a learner that trains in fp32 (learner.deepspeed.dtype fp32) to workers "
        "that sample in 16 bits; the workers then sample the learner's weights rounded"
    )
    ipc: Literal["auto", "view", "copy"] = Field(
        "auto", description="the ipc push: view = the rollout worker's parameters become views of its learner rank's "
        "parameters where they lie (CUDA IPC; shared memory on CPUs), exported once and checked by version at every "
        "push: no buffer, no copy, one copy of the weights on the shared GPU (ZeRO-1/2 and ZeRO-3 on one rank; "
        "ZeRO-3 over several ranks all-gathers every parameter into one buffer per rank, which the worker's "
        "parameters view); needs the worker's model.dtype equal to the learner's parameter dtype, full-parameter "
        "training (no learner.lora), weights.dtype keep and no parameter offload. copy = every rank copies its "
        "weights into a buffer of its own and the worker copies them into its model (three copies on the GPU): "
        "set it where the first push refuses a view (its error says so: a learner parameter that is not one "
        "contiguous run, a worker that cannot bind views). auto = view where the config allows it, else copy"
    )
    staging: bool = Field(
        True, description="broadcast and peer pushes: each rollout worker receives the new version into a second "
        "copy of its weights while it generates and swaps it in before its next request, so a push never waits for "
        "the request a worker is running (costs one more copy of the weights in the worker's memory); false: the "
        "worker receives between requests and the push waits for it"
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_removed(cls, data: Any) -> Any:
        for key in sorted(REMOVED.keys() & (data.keys() if isinstance(data, dict) else set())):
            raise ValueError(f"weights.{key} was removed: {REMOVED[key]}")
        return data

    @property
    def collective(self) -> bool:
        """Every receiver takes part in every push, set up as a group: a broadcast through a process
        group of its own (nccl, gloo) or a pull from the learner ranks' memory (peer)."""
        return self.backend in ("nccl", "gloo", "peer")

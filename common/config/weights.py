"""The weight push's config section (``weights``); the transports are in common/transport/."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from common.config.base import StrictModel


class WeightPushConfig(StrictModel):
    """How weights travel from learner rank 0 to the rollout workers."""

    backend: Literal["auto", "object_store", "nccl", "gloo"] = Field(
        "auto",
        description="auto = the nccl broadcast when the learner ranks and rollout workers have GPUs "
        "(cluster.*.num_gpus), else the Ray object store; gloo = the broadcast on CPU",
    )
    timeout_s: float = Field(300.0, gt=0.0, description="longest any one wait of a transfer may take")
    bucket_mb: float = Field(512.0, gt=0.0, description="broadcast bucket size in MiB (one flat byte buffer each)")
    dtype: Literal["keep", "bf16", "fp16", "fp32"] = Field(
        "keep", description="dtype on the wire; keep = the learner's parameter dtype (bf16 on GPU)"
    )
    source: Literal["shards", "gather"] = Field(
        "shards", description="collective pushes: shards = every learner rank broadcasts its own ZeRO-3 partition "
        "of each parameter straight from the learner's memory and the workers put the full parameters together "
        "(ZeRO-1/2: learner rank 0 broadcasts its parameters as they lie); gather = learner rank 0 gathers the "
        "full parameters (the ZeRO-3 all-gather) and packs them into buckets first (the earlier path). LoRA jobs "
        "always gather"
    )
    staging: bool = Field(
        True, description="broadcast push: each rollout worker receives the new version into a second copy of its "
        "weights while it generates and swaps it in before its next request, so a push never waits for the request "
        "a worker is running (costs one more copy of the weights in the worker's memory); false: the worker "
        "receives between requests and the push waits for it"
    )

    def resolve(self, actors_have_gpus: bool, colocated: bool = False) -> "WeightPushConfig":
        """This config with ``auto`` replaced by a transport: nccl when every learner rank and
        rollout worker holds a GPU (``cluster.*.num_gpus``: the actors' resources, not this
        process's devices) of its own, else the object store (``colocated``: workers share their
        learner ranks' GPUs, where NCCL cannot hold both). The driver resolves once and passes the
        result to every actor, so all ends of a push agree."""
        if self.backend != "auto":
            return self
        nccl = actors_have_gpus and not colocated
        return self.model_copy(update={"backend": "nccl" if nccl else "object_store"})

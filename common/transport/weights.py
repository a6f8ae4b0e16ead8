"""Weight push from the learner to the rollout workers: one interface, two transports.

- ``object_store`` (CPU): learner rank 0 puts the full parameters in the Ray object store once;
  every rollout worker fetches that one object.
- ``nccl`` / ``gloo`` (collective broadcast, ``common.transport.broadcast``): a process group of
  its own between learner rank 0 (rank 0) and the rollout workers (ranks 1..N), apart from the
  learner's default group; the weights go out as flat byte buckets, loaded bucket by bucket.
  NCCL on GPU; gloo runs the same code on CPU (that is how the tests exercise it).

Every transfer carries the policy version and every wait has a timeout whose error names who or
what it waited for. Roles: the learner side calls ``send`` on rank 0 (other learner ranks drain
``LearnerEngine.named_parameters_for_push()`` alongside: the ZeRO-3 gathers are collective); each
rollout worker calls ``receive``. ``transfer_weights`` drives one push from the coordinator.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Optional, Protocol, Sequence, Union

import torch
from pydantic import Field
from torch import nn

from common.config.base import StrictModel

NamedTensors = Iterable[tuple[str, torch.Tensor]]
LoadFn = Callable[[list[tuple[str, torch.Tensor]]], None]

WIRE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class WeightPushConfig(StrictModel):
    """How weights travel from learner rank 0 to the rollout workers."""

    backend: Literal["auto", "object_store", "nccl", "gloo"] = Field(
        "auto", description="auto = nccl broadcast with CUDA, the Ray object store on CPU; gloo = the broadcast on CPU"
    )
    timeout_s: float = Field(300.0, gt=0.0, description="longest any one wait of a transfer may take")
    bucket_mb: float = Field(512.0, gt=0.0, description="broadcast bucket size in MiB (one flat byte buffer each)")
    dtype: Literal["keep", "bf16", "fp16", "fp32"] = Field(
        "keep", description="dtype on the wire; keep = the learner's parameter dtype (bf16 on GPU)"
    )
    staging: bool = Field(
        True, description="broadcast push: each rollout worker receives the new version into a second copy of its "
        "weights while it generates and swaps it in before its next request, so a push never waits for the request "
        "a worker is running (costs one more copy of the weights in the worker's memory); false: the worker "
        "receives between requests and the push waits for it"
    )

    @property
    def resolved_backend(self) -> str:
        if self.backend == "auto":
            return "nccl" if torch.cuda.is_available() else "object_store"
        return self.backend


@dataclass(frozen=True)
class WeightHandle:
    """What a receiver needs to fetch one version: the version, and for the object store the
    reference of the object (None for a broadcast, whose data arrives through the group)."""

    version: int
    backend: str
    ref: Any = None


class WeightPush(Protocol):
    concurrent: bool  # True: receivers must call receive while send runs (a collective)

    def send(self, named_tensors: NamedTensors, version: int) -> WeightHandle:
        """Learner rank 0. Consumes ``named_tensors`` to the end, also when it fails."""

    def receive(self, handle: WeightHandle, target: Union[nn.Module, LoadFn]) -> int:
        """Rollout worker. Loads every tensor into ``target``; returns the version received."""

    def close(self) -> None:
        """Release the transport (before a new one replaces it)."""


def setup_weight_push(
    cfg: WeightPushConfig,
    *,
    rank: int = 0,
    world_size: int = 1,
    master_addr: Optional[str] = None,
    master_port: Optional[int] = None,
    peer_names: Optional[Sequence[str]] = None,
) -> WeightPush:
    """Build this process's end of the push. Object store: no arguments needed. Broadcast:
    ``rank`` 0 is learner rank 0, ranks 1..world_size-1 the rollout workers; (master_addr,
    master_port) is a free address on learner rank 0's node, where rank 0 hosts the group's
    TCPStore; ``peer_names`` (rank 0 only) names receivers 1.. in errors."""
    backend = cfg.resolved_backend
    if backend == "object_store":
        return ObjectStorePush(cfg)
    from common.transport.broadcast import BroadcastPush

    if master_addr is None or master_port is None:
        raise ValueError(f"the {backend} weight push needs master_addr and master_port (learner rank 0's node)")
    return BroadcastPush(cfg, backend, rank, world_size, master_addr, master_port, peer_names)


class ObjectStorePush:
    """Rank 0 puts {version, tensors} in the Ray object store; receivers ray.get it."""

    concurrent = False

    def __init__(self, cfg: WeightPushConfig) -> None:
        self.cfg = cfg
        self._latest: Optional[WeightHandle] = None  # keeps the newest object alive for late joiners

    def send(self, named_tensors: NamedTensors, version: int) -> WeightHandle:
        import ray

        wire = WIRE_DTYPES.get(self.cfg.dtype)
        tensors = {name: t.detach().to("cpu", dtype=wire or t.dtype, copy=True) for name, t in named_tensors}
        self._latest = WeightHandle(version, "object_store", ray.put({"version": version, "tensors": tensors}))
        return self._latest

    def receive(self, handle: WeightHandle, target: Union[nn.Module, LoadFn]) -> int:
        import ray
        from ray.exceptions import GetTimeoutError

        try:
            payload = ray.get(handle.ref, timeout=self.cfg.timeout_s)
        except GetTimeoutError:
            raise TimeoutError(
                f"weight push: waited {self.cfg.timeout_s:.0f} s for weights version {handle.version} "
                f"from learner rank 0 (object {handle.ref})"
            ) from None
        if payload["version"] != handle.version:
            raise RuntimeError(f"weight push: expected version {handle.version}, object holds {payload['version']}")
        loader = as_loader(target)
        loader(list(payload["tensors"].items()))
        _finish(loader)
        return handle.version

    def close(self) -> None:
        self._latest = None


class ParameterLoader:
    """Copies received tensors into a module's parameters by name (casting dtype and device),
    bucket by bucket, and checks at the end that every parameter arrived once (``partial``: that
    some did; a LoRA learner pushes only the matrices it adapts). A dictionary of named tensors (a
    staging copy) takes the place of a module the same way."""

    def __init__(self, module: Union[nn.Module, dict[str, torch.Tensor]], partial: bool = False) -> None:
        self.params = dict(module) if isinstance(module, dict) else dict(module.named_parameters())
        self.partial = partial
        self.loaded: set[str] = set()

    @torch.no_grad()
    def __call__(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named_tensors:
            param = self.params.get(name)
            if param is None:
                raise KeyError(f"weight push: received {name!r}, which the receiving model does not have")
            if param.shape != tensor.shape:
                raise ValueError(f"weight push: {name} has shape {tuple(tensor.shape)}, the model {tuple(param.shape)}")
            param.copy_(tensor)
            self.loaded.add(name)

    def finish(self) -> None:
        missing = sorted(set(self.params) - self.loaded)
        if missing and not (self.partial and self.loaded):
            raise RuntimeError(f"weight push: {len(missing)} parameters never arrived, e.g. {missing[:3]}")
        self.loaded.clear()


def as_loader(target: Union[nn.Module, LoadFn]) -> LoadFn:
    return ParameterLoader(target) if isinstance(target, nn.Module) else target


def _finish(loader: LoadFn) -> None:
    if isinstance(loader, ParameterLoader):
        loader.finish()


def transfer_weights(
    push: WeightPushConfig,
    senders: Sequence[Callable[[int], Any]],
    receivers: Sequence[Callable[[WeightHandle], Any]],
    version: int,
) -> tuple[WeightHandle, float]:
    """Drive one push from the coordinator; returns (handle, seconds).

    ``senders``: each learner rank's remote call ``version -> WeightHandle | None`` (rank 0 sends,
    the others drain their gathered parameters); ``receivers``: each rollout worker's remote call
    ``handle -> version``. A broadcast needs both sides at once; the object store needs the handle
    (the object's reference) before any receiver can start.
    """
    import ray

    t0 = time.perf_counter()
    backend = push.resolved_backend
    # inner waits are bounded by timeout_s each; this backstop only catches a wedged actor
    backstop = 10 * push.timeout_s
    if backend == "object_store":
        handles = ray.get([send(version) for send in senders], timeout=backstop)
        handle = next(h for h in handles if h is not None)
        versions = ray.get([receive(handle) for receive in receivers], timeout=backstop)
    else:
        handle = WeightHandle(version, backend)
        refs = [send(version) for send in senders] + [receive(handle) for receive in receivers]
        versions = ray.get(refs, timeout=backstop)[len(senders):]
    if any(v != version for v in versions):
        raise RuntimeError(f"weight push: receivers report versions {versions}, expected {version}")
    return handle, time.perf_counter() - t0

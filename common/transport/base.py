"""Weight push from the learner to the rollout workers: the interface every transport fills.

- ``object_store`` (common/transport/object_store.py, CPU): learner rank 0 puts the full
  parameters in the Ray object store once; every rollout worker fetches that one object.
- ``nccl`` / ``gloo`` (common/transport/broadcast.py, collective broadcast): a process group of
  its own between learner rank 0 (rank 0) and the rollout workers (ranks 1..N), apart from the
  learner's default group; the weights go out as flat byte buckets, loaded bucket by bucket.
  NCCL on GPU; gloo runs the same code on CPU (that is how the tests exercise it). Sharded
  (common/transport/shards.py): the group's first ranks are the learner
  ranks that hold partitions (every ZeRO-3 rank; ZeRO-1/2: rank 0), each broadcasting its own
  (``send_shards``), and the workers put the parameters together.
- ``ipc`` (common/transport/ipc.py; ``weights.ipc: view``, common/transport/views.py): each worker
  maps the buffer, or the parameters, of the learner rank on its own device.
- ``peer`` (common/transport/peer.py): every worker reads the sending ranks' buffers on other GPUs
  of its host with its copy engines, scheduled as the broadcast is.

Every transfer carries the policy version and every wait has a timeout whose error names who or
what it waited for.

The interface every transport fills (``WeightPush``): ``setup_weight_push`` (common/transport/__init__.py)
builds this process's end from the plan's transport (common/transport/plan.py); a learner rank
with an end calls ``send_weights`` with its weights (``PushSource``: the engine), and the end reads
them as it sends them: gathered (``send``: full tensors, rank 0; the other learner ranks drain
``named_parameters_for_push()`` alongside, since the ZeRO-3 gathers are collective), sharded
(``send_shards``: each sending rank's own partitions) or in place (``send_views``); each rollout
worker's engine calls ``receive`` with a loader that copies each bucket into its model and checks,
once the transfer is over, that every parameter arrived (``ParameterLoader``); ``close`` releases it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Protocol, Union

import torch
from torch import nn

from stabledrl.common.config.weights import WeightPushConfig  # noqa: F401  (its config; re-exported)

NamedTensors = Iterable[tuple[str, torch.Tensor]]
LoadFn = Callable[[list[tuple[str, torch.Tensor]]], None]
Parts = Iterable[tuple[str, tuple[int, ...], torch.Tensor]]  # (name, full shape, flat partition or tensor)

WIRE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class WeightHandle:
    """What a receiver needs to fetch one version: the version, and for the object store the
    reference of the object (None for a broadcast, whose data arrives through the group)."""

    version: int
    backend: str
    ref: Any = None


class PushSource(Protocol):
    """A learner rank's weights as a transport reads them (learner/engine.py's LearnerEngine)."""

    @property
    def partition_holders(self) -> int:
        """The learner ranks every parameter is partitioned among (ZeRO-3: all; else 1, rank 0's whole)."""

    def named_parameters_for_push(self, all_ranks: bool = False) -> NamedTensors:
        """The full parameters, gathered bucket by bucket (collective under ZeRO-3)."""

    def partitions_for_push(self, sources: int) -> Parts:
        """This rank's (name, full shape, flat partition) of every parameter, where it lies."""


class WeightPush(Protocol):
    cfg: WeightPushConfig

    def send_weights(self, source: PushSource, version: int) -> WeightHandle:
        """A learner rank with an end: send ``source``'s weights as ``version``, reading them as the
        transport sends them (gathered, its own partitions, or in place)."""

    def receive(self, handle: WeightHandle, load: LoadFn) -> int:
        """Rollout worker. Hands every tensor to ``load`` (bucket by bucket); returns the version
        received. Checking that every parameter arrived is the caller's (``ParameterLoader.finish``)."""

    def close(self) -> None:
        """Release the transport (before a new one replaces it)."""

    def begin_update(self) -> None:
        """A learner rank with an end, before it changes its parameters. Only a transport whose workers
        read the rank's parameters in place (``weights.ipc: view``) acts: it marks them as changing."""

    def check_turn(self, version: int, when: str) -> None:
        """A rollout worker, ``before`` and ``after`` each request: the weights it reads are still
        ``version``'s. Only the in-place views can fail it (the rank changed them under the worker)."""


class SendsWeights:
    """What every transport shares: ``send_weights`` for one that sends gathered tensors (``send``)
    or, with ``sources`` S >= 1 sending ranks, this rank's own partitions (``send_shards``); the turn
    hooks, which only the in-place views fill (common/transport/views.py)."""

    sources: int = 0

    def send_weights(self, source: PushSource, version: int) -> WeightHandle:
        if self.sources:
            return self.send_shards(source.partitions_for_push(self.sources), version)  # type: ignore[attr-defined]
        return self.send(source.named_parameters_for_push(all_ranks=True), version)  # type: ignore[attr-defined]

    def begin_update(self) -> None:  # the weights leave the rank as copies: nothing reads them in place
        pass

    def check_turn(self, version: int, when: str) -> None:  # the worker holds its own copy
        pass


class ParameterLoader:
    """Copies received tensors into a module's parameters by name (casting dtype and device),
    bucket by bucket, and checks at the end that every parameter arrived once (``partial``: that
    some did; a LoRA learner pushes only the matrices it adapts). A dictionary of named tensors (a
    staging copy) takes the place of a module the same way. ``device``: where the parameters are
    bound (``bind``), given for a module that waits on the host for views on its device (a rollout
    worker's: rollout/engine.py); default: where each parameter lies."""

    def __init__(self, module: Union[nn.Module, dict[str, torch.Tensor]], partial: bool = False,
                 device: Optional[torch.device] = None) -> None:
        self.params = dict(module) if isinstance(module, dict) else dict(module.named_parameters())
        self.partial = partial
        self.device = device
        self.loaded: set[str] = set()

    @torch.no_grad()
    def __call__(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named_tensors:
            param = self.params.get(name)
            if param is None:
                raise KeyError(f"weight push: received {name!r}, which the receiving model does not have")
            if param.shape != tensor.shape:
                raise ValueError(f"weight push: {name} has shape {tuple(tensor.shape)}, the model {tuple(param.shape)}")
            self.destination(name, param).copy_(tensor)
            self.loaded.add(name)

    def target(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """Where the received ``name`` of ``shape`` is to be written, counted as arrived: the
        sharded push puts each parameter together straight into it (common/transport/shards.py)."""
        return self.destination(name, self.check(name, shape)).detach()

    def check(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """The receiving model's parameter ``name``, whose shape must be ``shape``, counted as arrived."""
        param = self.params.get(name)
        if param is None:
            raise KeyError(f"weight push: received {name!r}, which the receiving model does not have")
        if tuple(param.shape) != tuple(shape):
            raise ValueError(f"weight push: {name} has shape {tuple(shape)}, the model {tuple(param.shape)}")
        self.loaded.add(name)
        return param

    @torch.no_grad()
    def bind(self, name: str, tensor: torch.Tensor) -> None:
        """Make parameter ``name`` a view of ``tensor`` (the learner's memory: common/transport/views.py)
        instead of copying it; its own storage is freed once nothing else holds it."""
        param = self.check(name, tuple(tensor.shape))
        if not isinstance(param, nn.Parameter):
            raise TypeError(f"weight push (ipc view): {name} is received into a copy, not a model; "
                            "set weights.ipc: copy")
        device = param.device if self.device is None else self.device
        if param.dtype != tensor.dtype or device != tensor.device:
            raise ValueError(f"weight push (ipc view): {name} is {tensor.dtype} on {tensor.device} on the learner, "
                             f"{param.dtype} on {device} in this worker's model; set model.dtype to the "
                             "learner's parameter dtype (learner.deepspeed.dtype) or weights.ipc: copy")
        if param.data_ptr() != tensor.data_ptr():  # the same address: bound by an earlier push already
            param.data = tensor

    def destination(self, name: str, param: torch.Tensor) -> torch.Tensor:
        """Where the received ``name`` is written: the parameter itself."""
        return param

    def finish(self) -> None:
        missing = sorted(set(self.params) - self.loaded)
        if missing and not (self.partial and self.loaded):
            raise RuntimeError(f"weight push: {len(missing)} parameters never arrived, e.g. {missing[:3]}")
        self.loaded.clear()

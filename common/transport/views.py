"""The same-device push without a copy (``weights.ipc: view``): the rollout worker's parameters are
views of its learner rank's parameters, where the rank holds them.

Why. Colocated, learner rank i and rollout worker i share one GPU. The copying ipc push
(common/transport/ipc.py) keeps three copies of the weights there: the rank's, the rank's push
buffer and the worker's model. At LLaDA-8B's width with 24 layers (6.27B parameters, 11.7 GiB in
bf16) the two extra copies are 23 GiB, which is what took a colocated job over an H200's memory
where the release trains. Here neither exists: the worker reads the learner's memory.

What a rank holds. DeepSpeed ZeRO-1/2 keeps the bf16 parameters of each optimizer group in one flat
buffer (``bit16_groups_flat``) and points every module parameter at a slice of it; after each
optimizer step it writes the new values into those same buffers. ZeRO-3 keeps each rank's partition
(``ds_tensor``) as a slice of one flat buffer per group; on one rank the partition is the whole
parameter. So a rank's parameters live in a few storages that outlive every step.

    learner rank: header block [version (int64), padded to ALIGN]   + every storage behind its parameters
    handle:       blocks = [header, storage 0, storage 1, ...] (each exported once, kept while in use)
                  views  = [(name, shape, dtype, block, byte offset), ...]

Each distinct storage is exported once (CUDA IPC on GPUs; on CPUs the storage is moved into a named
shared-memory segment in place, ``UntypedStorage._share_filename_cpu_``, so every tensor that views
it, DeepSpeed's included, keeps working) and exported again only if the parameters move to another
storage (the handle's keys are their addresses and sizes). The worker maps each exported block once
and points each of its parameters at its slice (``ParameterLoader.bind``): its own copy, which a
worker on a GPU loads on the host (rollout/worker.py), is freed at the first push, and every later
push is a version check. The driver makes that first push at set-up
(coordinator/runtime/weight_sync.py), before the first generation.

ZeRO-3 over several ranks: a rank holds 1/S of each parameter, and the worker needs them whole.
Each rank all-gathers every parameter into one buffer of its own (one collective a parameter, its S
partitions end to end: the parameter is the first n elements), which the worker's parameters view:
one full copy beside the rank's partitions instead of the copying push's two (the buffer and the
worker's model).

Turns. The worker reads what the rank writes, so they must take turns (``algorithm.max_staleness``
0, which the config requires for ipc). The rank sets the header to ``TRAINING`` before it changes
its parameters (``begin_update``) and to the new version when it pushes; the worker checks the
header against the version it holds before and after every request (``check_held``), so a turn
broken by a fault fails the request, naming both, instead of generating from half-updated weights.
"""
from __future__ import annotations

import socket
import uuid
from typing import Any, Optional

import torch

from stabledrl.common.transport.base import LoadFn, Parts, PushSource, WeightHandle
from stabledrl.common.transport.ipc import ALIGN, IpcPush, _aligned, device_uuid, header
from stabledrl.common.transport.shards import partition_numel

TRAINING = -1  # the header's value while the learner rank changes its parameters


class ViewPush(IpcPush):
    """One learner rank's end (``send_views``) or one worker's (``receive``: its parameters bound to
    views of the rank's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._views: list[tuple[str, tuple[int, ...], torch.dtype, int, int]] = []
        self._gathered = False  # the blocks hold the parameters all-gathered (ZeRO-3, several ranks)
        self._header: Optional[torch.Tensor] = None  # receiver: the mapped header of the views bound

    # ---- learner rank ---------------------------------------------------------------------
    def send_weights(self, source: PushSource, version: int) -> WeightHandle:
        """Every parameter where it lies (each rank's partition under ZeRO-3), shared in place."""
        return self.send_views(source.partitions_for_push(source.partition_holders), version)

    def send_views(self, parts: Parts, version: int, group: Any = None) -> WeightHandle:
        """Every parameter (name, full shape, the tensor where it lies: the parameter, or its ZeRO-3
        partition flat; ``LearnerEngine.partitions_for_push``). One rank (``sources`` 0 or 1): the
        views of its own storages; several (ZeRO-3, collective over ``group``): the parameters
        all-gathered into this rank's buffer first."""
        parts = [(name, tuple(int(d) for d in shape), t.detach()) for name, shape, t in parts]
        if not parts:
            raise ValueError("weight push (ipc view): the learner has no parameters to share")
        if self.sources > 1:
            return self._gather(parts, version, group)
        device = parts[0][2].device
        if not self.blocks or self._gathered or self.blocks[0].device != device:
            self.close()
            self._new_block(ALIGN, device)  # the header alone
            self._used[0] = ALIGN
        kept, self._storages = self._storages, {}
        order: dict[Any, int] = {}  # a storage's key -> its place among the blocks after the header
        exported, views = [], []
        for name, shape, t in parts:
            n = torch.Size(shape).numel()
            if not t.is_contiguous() or t.numel() < n:
                raise ValueError(f"weight push (ipc view): {name} is not one contiguous run of {n} elements on the "
                                 "learner; set weights.ipc: copy")
            storage = t.untyped_storage()
            if storage.device.type == "cpu":
                storage._share_filename_cpu_()  # noqa: SLF001  (in place: every tensor viewing it follows)
            key = (storage.data_ptr(), storage.nbytes())
            if key not in order:
                if key not in kept:
                    kept[key] = (storage, _export_storage(storage))
                self._storages[key] = kept[key]
                order[key] = 1 + len(exported)
                exported.append(kept[key][1])
            views.append((name, shape, t.dtype, order[key], t.storage_offset() * t.element_size()))
        self._views = views
        handle = self._publish(version, {"views": views})
        handle.ref["blocks"] = handle.ref["blocks"][:1] + exported
        return handle

    def _gather(self, parts: list[tuple[str, tuple[int, ...], torch.Tensor]], version: int,
                group: Any) -> WeightHandle:
        """ZeRO-3 over S ranks: each parameter's S partitions all-gathered into this rank's buffer,
        end to end (laid out at the first push, reused while the parameters stay the same)."""
        import torch.distributed as dist

        if dist.get_rank(group) != self.rank or dist.get_world_size(group) != self.sources:
            raise ValueError(f"weight push (ipc view): learner rank {self.rank} of {self.sources} gathers over a group "
                             f"where it is rank {dist.get_rank(group)} of {dist.get_world_size(group)}")
        params = [(name, shape, t.dtype) for name, shape, t in parts]
        device = parts[0][2].device
        if params != self._params or not self._gathered or self.blocks[0].device != device:
            self.close()
            views, end = [], ALIGN
            for name, shape, dtype in params:
                views.append((name, shape, dtype, 0, end))
                end += _aligned(self.sources * partition_numel(torch.Size(shape).numel(), self.sources)
                                * dtype.itemsize)
            self._new_block(end, device)
            self._used[0] = end
            self._params, self._views, self._gathered = params, views, True
        block = self.blocks[0]
        for (name, shape, t), (_, _, dtype, _, offset) in zip(parts, self._views, strict=True):
            size = partition_numel(torch.Size(shape).numel(), self.sources)
            if t.numel() != size:
                raise RuntimeError(f"weight push (ipc view): {name} has no ZeRO-3 partition of {size} elements")
            out = block[offset: offset + self.sources * size * dtype.itemsize].view(dtype)
            dist.all_gather_into_tensor(out, t.reshape(-1), group=group)
        return self._publish(version, {"views": self._views})

    def begin_update(self) -> None:
        """The rank is about to change its parameters: a worker that reads them now fails."""
        if self.blocks:
            header(self.blocks[0]).fill_(TRAINING)
            if self.blocks[0].is_cuda:
                torch.cuda.synchronize(self.blocks[0].device)

    def close(self) -> None:
        super().close()
        self._views, self._gathered, self._header = [], False, None

    # ---- rollout worker -------------------------------------------------------------------
    def receive(self, handle: WeightHandle, load: LoadFn) -> int:
        """Point every parameter of the worker's model at its view (``load.bind``): nothing is copied."""
        if handle.ref is None or "views" not in handle.ref:
            raise RuntimeError(f"weight push (ipc view): the handle of version {handle.version} carries no views; "
                               "the worker's learner rank sent nothing (is it on this worker's device?)")
        bind = getattr(load, "bind", None)
        if bind is None:
            raise RuntimeError("weight push (ipc view): this worker's loader cannot bind views (LoRA adapters merged "
                               "on the worker, or a staged copy); set weights.ipc: copy")
        blocks = self.map_blocks(handle.ref["blocks"])
        self.check_version(blocks[0], handle.version, "before")
        for name, shape, dtype, block, offset in handle.ref["views"]:
            nbytes = torch.Size(shape).numel() * dtype.itemsize
            if offset + nbytes > blocks[block].numel():
                raise ValueError(f"weight push (ipc view) of version {handle.version}: {name} ends at byte "
                                 f"{offset + nbytes} of a block of {blocks[block].numel()}")
            bind(name, blocks[block][offset:offset + nbytes].view(dtype).view(shape))
        self._header = header(blocks[0])
        return handle.version

    def check_held(self, held: int, version: int, when: str) -> None:  # noqa: D401 - the base's contract
        if held == version:
            return
        doing = "is changing its parameters" if held == TRAINING else f"holds version {held}"
        raise RuntimeError(f"weight push (ipc view): the learner rank {doing} {when} this worker read version "
                           f"{version} in place: rank and worker must take turns (algorithm.max_staleness 0)")

    def check_turn(self, version: int, when: str) -> None:
        """Before or after a request: the parameters the worker views are still ``version``'s."""
        if self._header is not None:
            self.check_held(int(self._header.item()), version, when)


def _export_storage(storage: torch.UntypedStorage) -> dict:
    """A storage's handle for another process: CUDA IPC, or the named shared-memory segment it was
    moved into (CPU)."""
    if storage.device.type == "cuda":
        from torch.multiprocessing.reductions import reduce_tensor

        device = storage.device
        rebuild, args = reduce_tensor(torch.empty(0, dtype=torch.uint8, device=device).set_(storage))
        return {"kind": "cuda", "rebuild": rebuild, "args": args, "key": uuid.uuid4().hex,
                "device": device_uuid(device), "host": socket.gethostname()}
    manager, filename, size = storage._share_filename_cpu_()  # noqa: SLF001  (already shared: its name)
    return {"kind": "segment", "manager": manager, "filename": filename, "size": int(size),
            "key": filename.decode() if isinstance(filename, bytes) else str(filename)}


def segment_name(tensor: torch.Tensor) -> Optional[str]:
    """The named shared-memory segment a CPU tensor lies in, None if it is in private memory (tests:
    a worker's parameters lie in their learner rank's segments)."""
    storage = tensor.untyped_storage()
    if not storage.is_shared():
        return None
    _, filename, _ = storage._share_filename_cpu_()  # noqa: SLF001  (a shared one keeps its name)
    return filename.decode() if isinstance(filename, bytes) else str(filename)

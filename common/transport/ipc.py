"""Weight push to the rollout worker that shares the learner rank's device (``cluster.colocate``):
the worker reads the rank's weights where they lie, through an inter-process memory handle.

Why. Colocated, learner rank i and rollout worker i take turns on one GPU, and NCCL cannot hold
both as ranks of one group. Through the object store every push went GPU -> host -> object store
-> host -> GPU: at LLaDA's width with 8 layers (5.2 GiB) 16.7 s on learner rank 0 and ~10 s on each
worker, a third of a step that generation and training fill in 42 s (BENCHMARKS.md). Here every
learner rank copies the push into one flat buffer of its own on its device (once allocated, kept),
and the handle of that buffer travels instead of the bytes: CUDA IPC (``cudaIpcGetMemHandle``
through torch's tensor reduction) on GPUs, a named POSIX shared-memory block on CPUs (how the tests
run it). The worker maps the buffer and copies each parameter device to device into its model.

    buffer  [header: version (int64), padded to ALIGN | param 0 | param 1 | ...]  each at ALIGN bytes

Every learner rank sends (``all_ranks``: under ZeRO-3 every rank holds the gathered parameter
inside the gather), and worker i receives learner rank i's handle (its shared bundle). The push
is a turn: the rank writes the buffer, then the version into the header, and synchronises; the
worker checks the header before and after its copy, so a buffer overwritten by a later push while
it read (possible only when rank and worker do not take turns, which the config refuses) fails
the receive, naming both versions, instead of loading a mix. A worker on another device than its
rank (CUDA: the GPUs' UUIDs differ) is refused with the fix.

ZeRO-3 over several ranks (``weights.source: shards``, ``send_shards``): gathering every
parameter through DeepSpeed before copying it cost 2.6 s a push at LLaDA's width with 8 layers on
2 ranks (the push's ``push_send`` part, BENCHMARKS.md). Instead each rank copies its own ZeRO-3
partitions (common/transport/shards.py: rank r holds elements [r·p, (r+1)·p) of every parameter,
p = ceil(n / S)) into one send segment, and one all-gather over the learner's ranks fills the
buffer of every rank at once; the worker puts each parameter together from the S rows, straight
into its model (``shards.assemble``):

    buffer  [header | round 0: S rows of its segment | round 1 | ...]  a round per wire dtype
"""
from __future__ import annotations

import uuid
from typing import Any, Iterator, Optional

import torch

from common.transport.shards import Round, assemble, decode_plan, encode_plan, iter_segments, plan_rounds
from common.transport.weights import WIRE_DTYPES, LoadFn, NamedTensors, WeightHandle, WeightPushConfig

ALIGN = 256  # bytes: every parameter's offset (and the header's slot) in the flat buffer


class IpcPush:
    """One learner rank's buffer (``send``) or one worker's mapping of its rank's (``receive``)."""

    def __init__(self, cfg: WeightPushConfig, rank: int = 0, sources: int = 0) -> None:
        self.cfg = cfg
        self.rank, self.sources = rank, sources  # a learner rank's place among the ranks that send_shards
        self.buffer: Optional[torch.Tensor] = None  # the sender's flat uint8 buffer
        self.layout: list[tuple[str, tuple[int, ...], torch.dtype, int]] = []  # (name, shape, dtype, offset)
        self._exported: Optional[dict] = None  # the buffer's handle, made once
        self._shm: Any = None  # CPU: the SharedMemory block (sender: created; receiver: opened)
        self._mapped: Optional[tuple[Any, torch.Tensor]] = None  # receiver: (handle key, mapped buffer)
        # send_shards: the parameters the buffer was laid out for, its rounds (each at a byte offset),
        # the plan as the worker reads it, and this rank's send segment of each round
        self._params: list[tuple[str, tuple[int, ...], torch.dtype]] = []
        self._rounds: list[tuple[Round, int]] = []
        self._plan = b""
        self._segments: list[torch.Tensor] = []

    # ---- learner rank ---------------------------------------------------------------------
    def send(self, named_tensors: NamedTensors, version: int) -> WeightHandle:
        wire = WIRE_DTYPES.get(self.cfg.dtype)
        # the first push (or a new layout) holds the tensors on the host until the buffer exists:
        # a device copy would need the model's size twice on the learner's device for that moment
        pending: list[tuple[str, torch.Tensor]] = []
        position, device = 0, None
        for name, tensor in named_tensors:
            tensor = tensor.detach()
            if wire is not None and tensor.dtype != wire:
                tensor = tensor.to(wire)
            device = tensor.device
            if pending or not self._fits(position, name, tensor):
                pending.append((name, tensor.to("cpu", copy=True)))
            else:
                self._view(position).copy_(tensor)
            position += 1
        if pending or position != len(self.layout):
            kept = position - len(pending)  # written into the old buffer before the layout changed
            done = [(n, self._view(i).to("cpu", copy=True)) for i, (n, *_) in enumerate(self.layout[:kept])]
            self._allocate(done + pending, device or torch.device("cpu"))
        self.buffer[:8].view(torch.int64).fill_(version)
        if self.buffer.is_cuda:
            torch.cuda.synchronize(self.buffer.device)
        return WeightHandle(version, "ipc", {"buffer": self._export(), "layout": self.layout})

    def _fits(self, position: int, name: str, tensor: torch.Tensor) -> bool:
        if self.buffer is None or position >= len(self.layout):
            return False
        n, shape, dtype, _ = self.layout[position]
        return n == name and shape == tuple(tensor.shape) and dtype == tensor.dtype and \
            self.buffer.device == tensor.device

    def _allocate(self, tensors: list[tuple[str, torch.Tensor]], device: torch.device) -> None:
        """A buffer on ``device`` for this layout, filled with ``tensors`` (the old one dropped)."""
        self.close()
        layout, offset = [], ALIGN
        for name, t in tensors:
            layout.append((name, tuple(t.shape), t.dtype, offset))
            offset += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
        self._new_buffer(offset, device)
        self.layout = layout
        for i, (_, t) in enumerate(tensors):
            self._view(i).copy_(t)

    def _new_buffer(self, nbytes: int, device: torch.device) -> None:
        if device.type == "cuda":
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        else:
            from multiprocessing import shared_memory

            self._shm = shared_memory.SharedMemory(create=True, size=nbytes)
            self.buffer = torch.frombuffer(self._shm.buf, dtype=torch.uint8)

    def send_shards(self, partitions: Iterator[tuple[str, tuple[int, ...], torch.Tensor]], version: int,
                    group: Any = None) -> WeightHandle:
        """ZeRO-3, every learner rank (collective over ``group``, default: the learner's): this
        rank's flat partition of every parameter (``LearnerEngine.partitions_for_push``: name, full
        shape, partition); this end's ``sources`` = the learner's ranks. The buffer is laid out at
        the first push (and again for another set of parameters); later pushes reuse it."""
        import torch.distributed as dist

        rank, sources = self.rank, self.sources
        if dist.get_rank(group) != rank or dist.get_world_size(group) != sources:
            raise ValueError(f"weight push (ipc): learner rank {rank} of {sources} sends partitions over a group where "
                             f"it is rank {dist.get_rank(group)} of {dist.get_world_size(group)}")
        wire = WIRE_DTYPES.get(self.cfg.dtype)
        parts = [(name, tuple(int(d) for d in shape), t.detach()) for name, shape, t in partitions]
        params = [(name, shape, wire or t.dtype) for name, shape, t in parts]
        device = parts[0][2].device
        if params != self._params or self.buffer is None or self.buffer.device != device:
            self._lay_out(params, sources, device)
        rounds = [rnd for rnd, _ in self._rounds]
        for (rnd, offset), segment, (_, mine) in zip(self._rounds, self._segments,
                                                     iter_segments(rounds, iter(parts), sources), strict=True):
            for piece, part in zip(rnd.pieces, mine, strict=True):
                segment[piece.offset: piece.offset + part.numel()].copy_(part)
            dist.all_gather_into_tensor(self._rows(rnd, offset, sources).view(-1), segment, group=group)
        self.buffer[:8].view(torch.int64).fill_(version)
        if self.buffer.is_cuda:
            torch.cuda.synchronize(self.buffer.device)
        return WeightHandle(version, "ipc", {"buffer": self._export(), "plan": self._plan})

    def _lay_out(self, params: list[tuple[str, tuple[int, ...], torch.dtype]], sources: int,
                 device: torch.device) -> None:
        """One round per run of parameters of one wire dtype, each S rows of its segment."""
        self.close()
        rounds = plan_rounds(params, sources, bucket_bytes=1 << 62)
        placed, end = _placed(rounds, sources)
        self._new_buffer(end, device)
        self._params, self._rounds, self._plan = params, placed, encode_plan(rounds, sources)
        self._segments = [torch.zeros(rnd.segment, dtype=rnd.dtype, device=device) for rnd in rounds]

    def _rows(self, rnd: Round, offset: int, sources: int, buffer: Optional[torch.Tensor] = None) -> torch.Tensor:
        """[sources, segment] of round ``rnd`` in the buffer: row r is learner rank r's segment."""
        buffer = self.buffer if buffer is None else buffer
        nbytes = sources * rnd.segment * rnd.dtype.itemsize
        return buffer[offset:offset + nbytes].view(rnd.dtype).view(sources, rnd.segment)

    def _view(self, i: int, buffer: Optional[torch.Tensor] = None,
              layout: Optional[list] = None) -> torch.Tensor:
        buffer = self.buffer if buffer is None else buffer
        _, shape, dtype, offset = (self.layout if layout is None else layout)[i]
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        return buffer[offset:offset + nbytes].view(dtype).view(shape)

    def _export(self) -> dict:
        if self._exported is None:
            if self.buffer.is_cuda:
                from torch.multiprocessing.reductions import reduce_tensor

                rebuild, args = reduce_tensor(self.buffer)
                self._exported = {"kind": "cuda", "rebuild": rebuild, "args": args, "key": uuid.uuid4().hex,
                                  "device": device_uuid(self.buffer.device)}
            else:
                self._exported = {"kind": "shm", "name": self._shm.name, "size": self.buffer.numel(),
                                  "key": self._shm.name}
        return self._exported

    # ---- rollout worker -------------------------------------------------------------------
    def receive(self, handle: WeightHandle, load: LoadFn) -> int:
        if handle.ref is None:
            raise RuntimeError(f"weight push (ipc): the handle of version {handle.version} carries no buffer; the "
                               "worker's learner rank sent nothing (is it on this worker's device?)")
        buffer = self._map(handle.ref["buffer"])
        self._check(buffer, handle.version, "before")
        if "plan" in handle.ref:  # send_shards: put every parameter together from the ranks' rows
            sources, rounds = decode_plan(handle.ref["plan"], f"weight push (ipc) of version {handle.version}")
            placed, end = _placed(rounds, sources)
            if end > buffer.numel():
                raise ValueError(f"weight push (ipc) of version {handle.version}: the plan needs {end} bytes, the "
                                 f"learner rank's buffer has {buffer.numel()}")
            for rnd, offset in placed:
                assemble(self._rows(rnd, offset, sources, buffer), rnd, sources, load)
        else:
            layout = handle.ref["layout"]
            load([(name, self._view(i, buffer, layout)) for i, (name, *_) in enumerate(layout)])
        if buffer.is_cuda:
            torch.cuda.synchronize(buffer.device)
        self._check(buffer, handle.version, "while")
        return handle.version

    def _map(self, exported: dict) -> torch.Tensor:
        key = exported["key"]  # one per sender buffer: a mapping is kept until the buffer changes
        if self._mapped is not None and self._mapped[0] == key:
            return self._mapped[1]
        self._unmap()
        if exported["kind"] == "cuda":
            mine = device_uuid(torch.device("cuda", torch.cuda.current_device()))
            if mine != exported["device"]:
                raise RuntimeError(
                    f"weight push (ipc): this worker's GPU ({mine}) is not its learner rank's ({exported['device']}); "
                    "the ipc push needs every worker on its learner rank's GPU (cluster.colocate, no workers added "
                    "by scaling): set weights.backend to object_store"
                )
            buffer = exported["rebuild"](*exported["args"])
        else:
            from multiprocessing import shared_memory

            self._shm = shared_memory.SharedMemory(name=exported["name"])
            _untrack(self._shm)
            buffer = torch.frombuffer(self._shm.buf, dtype=torch.uint8)[: exported["size"]]
        self._mapped = (key, buffer)
        return buffer

    @staticmethod
    def _check(buffer: torch.Tensor, version: int, when: str) -> None:
        held = int(buffer[:8].view(torch.int64).item())
        if held != version:
            raise RuntimeError(
                f"weight push (ipc): the learner rank's buffer holds version {held} {when} this worker read version "
                f"{version}: rank and worker must take turns (algorithm.max_staleness 0); nothing was loaded"
                if when == "before" else
                f"weight push (ipc): the learner rank's buffer was overwritten with version {held} while this worker "
                f"read version {version}: rank and worker must take turns (algorithm.max_staleness 0)"
            )

    def _unmap(self) -> None:
        self._mapped = None
        if self._shm is not None and self.buffer is None:  # a receiver's mapping
            _close(self._shm)
            self._shm = None

    def close(self) -> None:
        """Drop the buffer (sender: the shared block is unlinked) or the mapping (receiver)."""
        if self.buffer is not None:
            self.buffer, self._exported, self.layout = None, None, []
            self._params, self._rounds, self._plan, self._segments = [], [], b"", []
            if self._shm is not None:
                _close(self._shm)
                self._shm.unlink()
                self._shm = None
        self._unmap()


def _placed(rounds: list[Round], sources: int) -> tuple[list[tuple[Round, int]], int]:
    """Each round's byte offset in the buffer (after the header, each aligned) and the buffer's size."""
    placed, offset = [], ALIGN
    for rnd in rounds:
        placed.append((rnd, offset))
        offset += -(-sources * rnd.segment * rnd.dtype.itemsize // ALIGN) * ALIGN
    return placed, offset


def device_uuid(device: torch.device) -> str:
    """The physical GPU's identity (device indices differ between processes)."""
    return str(torch.cuda.get_device_properties(device).uuid)


def _close(shm: Any) -> None:
    """Close a shared block; a tensor still viewing it keeps the mapping until it is collected."""
    import gc

    gc.collect()
    try:
        shm.close()
    except BufferError:
        pass


def _untrack(shm: Any) -> None:
    """A receiver's opened block is the sender's to unlink: keep Python's resource tracker out of it."""
    try:
        from multiprocessing import resource_tracker

        resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001
    except Exception:  # noqa: BLE001  (no tracker in this process: nothing to undo)
        pass

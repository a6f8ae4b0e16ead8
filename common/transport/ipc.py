"""Weight push to the rollout worker that shares the learner rank's device (``cluster.colocate``):
the worker reads the rank's weights where they lie, through an inter-process memory handle.

Why. Colocated, learner rank i and rollout worker i take turns on one GPU, and NCCL cannot hold
both as ranks of one group. Through the object store every push went GPU -> host -> object store
-> host -> GPU: at LLaDA's width with 8 layers (5.2 GiB) 16.7 s on learner rank 0 and ~10 s on each
worker, a third of a step that generation and training fill in 42 s (BENCHMARKS.md). Here every
learner rank copies the push into a buffer of its own on its device (once allocated, kept), and
the handles of that buffer travel instead of the bytes: CUDA IPC (``cudaIpcGetMemHandle`` through
torch's tensor reduction) on GPUs, named POSIX shared-memory blocks on CPUs (how the tests run it).
The worker maps the buffer and copies each parameter device to device into its model.

    block 0  [header: version (int64), padded to ALIGN | param 0 | param 3 | ...]
    block 1  [param 1 | param 2 | ...]            every parameter at an ALIGN-byte offset of a block

The buffer is a list of blocks (``BLOCK_BYTES`` each, or one parameter's size if larger), each
parameter placed in the first block with room, so the first push writes every tensor straight into
the device buffer as it arrives: the push is a stream (ZeRO-3 gathers bucket by bucket, LoRA
merges), whose total size is known only at its end. A single flat buffer had to hold the first
push on the host until that end: 6.8 s of a 28 s step at LLaDA-8B with LoRA merged (BENCHMARKS.md).

Every learner rank sends (``all_ranks``: under ZeRO-3 every rank holds the gathered parameter
inside the gather), and worker i receives learner rank i's handle (its shared bundle). The push
is a turn: the rank writes the buffer, then the version into the header, and synchronises; the
worker checks the header before and after its copy, so a buffer overwritten by a later push while
it read (possible only when rank and worker do not take turns, which the config refuses) fails
the receive, naming both versions, instead of loading a mix. A worker on another device than its
rank (CUDA: the GPUs' UUIDs differ) is refused with the fix.

ZeRO-3 over several ranks (``send_shards``): gathering every
parameter through DeepSpeed before copying it cost 2.6 s a push at LLaDA's width with 8 layers on
2 ranks (the push's ``push_send`` part, BENCHMARKS.md). Instead each rank copies its own ZeRO-3
partitions (common/transport/shards.py: rank r holds elements [r·p, (r+1)·p) of every parameter,
p = ceil(n / S)) into one send segment, and one all-gather over the learner's ranks fills the
buffer of every rank at once; the worker puts each parameter together from the S rows, straight
into its model (``shards.assemble``):

    block 0  [header | round 0: S rows of its segment | round 1 | ...]  a round per wire dtype

(one block: the plan gives its size before any partition is copied).
"""
from __future__ import annotations

import socket
import uuid
from typing import Any, Iterator, Optional

import torch

from stabledrl.common.transport.shards import Round, assemble, decode_plan, encode_plan, iter_segments, plan_rounds
from stabledrl.common.transport.base import (
    WIRE_DTYPES, LoadFn, NamedTensors, SendsWeights, WeightHandle, WeightPushConfig,
)

ALIGN = 256  # bytes: every parameter's offset (and the header's slot) in its block
BLOCK_BYTES = 1 << 30  # a block of the buffer (a parameter larger than this gets a block of its own size)


class IpcPush(SendsWeights):
    """One learner rank's buffer (``send``) or one worker's mapping of its rank's (``receive``)."""

    def __init__(self, cfg: WeightPushConfig, rank: int = 0, sources: int = 0,
                 block_bytes: int = BLOCK_BYTES, pull: bool = False) -> None:
        self.cfg = cfg
        self.rank, self.sources = rank, sources  # a learner rank's place among the ranks that send_shards
        # pull (common/transport/peer.py): read by workers on other GPUs of this host, each pulling from
        # every rank: send_shards lays out this rank's own segments only (no all-gather), and a receiver
        # maps blocks of another device than its own
        self.pull = pull
        self.block_bytes = block_bytes
        self.blocks: list[torch.Tensor] = []  # the sender's buffer: flat uint8 blocks, the header in block 0
        self._used: list[int] = []  # bytes taken from the start of each block (first fit)
        # (name, shape, dtype, block, offset) of every tensor of the last push, in its order
        self.layout: list[tuple[str, tuple[int, ...], torch.dtype, int, int]] = []
        self._exported: list[dict] = []  # each block's handle, made once
        self._shms: list[Any] = []  # CPU: each block's SharedMemory (sender: created)
        self._mapped: dict[str, tuple[torch.Tensor, Any]] = {}  # receiver: handle key -> (mapped block, its shm)
        # send_shards: the parameters the buffer was laid out for, its rounds (each at a byte offset
        # of block 0), the plan as the worker reads it, and this rank's send segment of each round
        self._params: list[tuple[str, tuple[int, ...], torch.dtype]] = []
        self._rounds: list[tuple[Round, int]] = []
        self._plan = b""
        self._segments: list[torch.Tensor] = []
        self._in_place = False  # pull on GPUs: the partitions exported where they lie (``_offer_in_place``)
        self._storages: dict[tuple[int, int], tuple[Any, dict]] = {}  # (address, bytes) -> (storage, its export)

    # ---- learner rank ---------------------------------------------------------------------
    def send(self, named_tensors: NamedTensors, version: int) -> WeightHandle:
        """Copy every tensor into the buffer as it arrives (a parameter of another name, shape,
        dtype or device than last time is placed anew: blocks are added, never the whole buffer
        rebuilt), then the version into the header."""
        wire = WIRE_DTYPES.get(self.cfg.dtype)
        self._params = []  # the buffer no longer holds a send_shards layout
        position = 0
        for name, tensor in named_tensors:
            tensor = tensor.detach()
            if wire is not None and tensor.dtype != wire:
                tensor = tensor.to(wire)
            if not self._fits(position, name, tensor):
                self._place(position, name, tensor)
            self._view(position).copy_(tensor)
            position += 1
        if position != len(self.layout):
            self._truncate(position)
        if not self.blocks:  # nothing to send: a header alone
            self._new_block(ALIGN, torch.device("cpu"))
        return self._publish(version, {"layout": list(self.layout)})

    def _publish(self, version: int, what: dict) -> WeightHandle:
        header(self.blocks[0]).fill_(version)
        if self.blocks[0].is_cuda:
            torch.cuda.synchronize(self.blocks[0].device)
        return WeightHandle(version, "ipc", {"blocks": self._export(), **what})

    def _fits(self, position: int, name: str, tensor: torch.Tensor) -> bool:
        if position >= len(self.layout):
            return False
        n, shape, dtype, block, _ = self.layout[position]
        return n == name and shape == tuple(tensor.shape) and dtype == tensor.dtype and \
            self.blocks[block].device == tensor.device

    def _place(self, position: int, name: str, tensor: torch.Tensor) -> None:
        """Lay out parameter ``position`` (the entries after it dropped) in the first block with
        room, or in a new block."""
        if self.blocks and self.blocks[0].device != tensor.device:
            if position:
                raise ValueError(f"weight push (ipc): {name} is on {tensor.device}, the push's earlier tensors on "
                                 f"{self.blocks[0].device}; one push is sent from one device")
            self.close()  # another device: nothing of the old buffer is of use
        self._truncate(position)
        nbytes = _aligned(tensor.numel() * tensor.element_size())
        block = next((b for b, used in enumerate(self._used) if used + nbytes <= self.blocks[b].numel()), None)
        if block is None:
            block = len(self.blocks)
            slot = 0 if self.blocks else ALIGN  # block 0 starts with the header's slot
            self._new_block(max(self.block_bytes, slot + nbytes), tensor.device)
        self.layout.append((name, tuple(tensor.shape), tensor.dtype, block, self._used[block]))
        self._used[block] += nbytes

    def _truncate(self, kept: int) -> None:
        """Keep the first ``kept`` entries of the layout; blocks left empty at the end are freed."""
        self.layout = self.layout[:kept]
        self._used = [ALIGN if b == 0 else 0 for b in range(len(self.blocks))]
        for _, shape, dtype, block, offset in self.layout:
            self._used[block] = max(self._used[block], offset + _aligned(torch.Size(shape).numel() * dtype.itemsize))
        while len(self.blocks) > 1 and self._used[-1] == 0:
            self._used.pop()
            self.blocks.pop()
            del self._exported[len(self.blocks):]
            if self._shms:
                _drop(self._shms.pop())

    def _new_block(self, nbytes: int, device: torch.device) -> None:
        if device.type == "cuda":
            block = torch.empty(nbytes, dtype=torch.uint8, device=device)
        else:
            from multiprocessing import shared_memory

            shm = shared_memory.SharedMemory(create=True, size=nbytes)
            self._shms.append(shm)
            block = torch.frombuffer(shm.buf, dtype=torch.uint8)
        self.blocks.append(block)
        self._used.append(0 if len(self.blocks) > 1 else ALIGN)

    def send_shards(self, partitions: Iterator[tuple[str, tuple[int, ...], torch.Tensor]], version: int,
                    group: Any = None) -> WeightHandle:
        """ZeRO-3, every learner rank (collective over ``group``, default: the learner's): this
        rank's flat partition of every parameter (``LearnerEngine.partitions_for_push``: name, full
        shape, partition); this end's ``sources`` = the learner's ranks. The buffer is laid out at
        the first push (and again for another set of parameters); later pushes reuse it."""
        import torch.distributed as dist

        rank, sources = self.rank, self.sources
        if not self.pull and (dist.get_rank(group) != rank or dist.get_world_size(group) != sources):
            raise ValueError(f"weight push (ipc): learner rank {rank} of {sources} sends partitions over a group where "
                             f"it is rank {dist.get_rank(group)} of {dist.get_world_size(group)}")
        wire = WIRE_DTYPES.get(self.cfg.dtype)
        parts = [(name, tuple(int(d) for d in shape), t.detach()) for name, shape, t in partitions]
        params = [(name, shape, wire or t.dtype) for name, shape, t in parts]
        device = parts[0][2].device
        if self.pull and device.type == "cuda" and all(t.is_cuda and t.is_contiguous() and t.dtype == dtype
                                                       for (_, _, t), (_, _, dtype) in zip(parts, params)):
            return self._offer_in_place(parts, params, version)
        if params != self._params or not self.blocks or self.blocks[0].device != device or self._in_place:
            self._lay_out(params, sources, device)
        rounds = [rnd for rnd, _ in self._rounds]
        for (rnd, offset), segment, (_, mine) in zip(self._rounds, self._segments,
                                                     iter_segments(rounds, iter(parts), sources), strict=True):
            for piece, part in zip(rnd.pieces, mine, strict=True):
                segment[piece.offset: piece.offset + part.numel()].copy_(part)
            if not self.pull:
                dist.all_gather_into_tensor(self._rows(rnd, offset, sources).view(-1), segment, group=group)
        return self._publish(version, {"plan": self._plan})

    def _offer_in_place(self, parts: list[tuple[str, tuple[int, ...], torch.Tensor]],
                        params: list[tuple[str, tuple[int, ...], torch.dtype]], version: int) -> WeightHandle:
        """Pull, on GPUs: the partitions are read where they lie (no copy, no buffer beside them).
        Each distinct storage behind them is exported once and kept (held, so its memory cannot be
        freed and given to another tensor while a worker maps it) for as long as a push still
        reads from it; the handle says where each partition starts in its storage, and the buffer
        is the version's header alone. The learner does not touch its parameters until every
        receiver has read them (common/transport/peer.py)."""
        from torch.multiprocessing.reductions import reduce_tensor

        device = parts[0][2].device
        if params != self._params or not self._in_place or self.blocks[0].device != device:
            self.close()
            self._new_block(ALIGN, device)
            self._used[0] = ALIGN
            self._params, self._in_place = params, True
            self._plan = encode_plan(plan_rounds(params, self.sources, bucket_bytes=1 << 62), self.sources)
        kept, self._storages = self._storages, {}
        order: dict[tuple[int, int], int] = {}  # a storage (address, bytes) -> its place in ``exported``
        exported, where = [], []
        for _, _, t in parts:
            storage = t.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            if key not in order:
                if key not in kept:
                    rebuild, args = reduce_tensor(torch.empty(0, dtype=torch.uint8, device=device).set_(storage))
                    kept[key] = (storage, {"kind": "cuda", "rebuild": rebuild, "args": args, "key": uuid.uuid4().hex,
                                           "device": device_uuid(device), "host": socket.gethostname()})
                self._storages[key] = kept[key]
                order[key] = len(exported)
                exported.append(kept[key][1])
            where.append((order[key], t.data_ptr() - key[0]))
        return self._publish(version, {"plan": self._plan, "storages": exported, "where": where})

    def _lay_out(self, params: list[tuple[str, tuple[int, ...], torch.dtype]], sources: int,
                 device: torch.device) -> None:
        """One block: one round per run of parameters of one wire dtype, each S rows of its segment
        (pull: this rank's row alone, the segment written in place)."""
        self.close()
        rounds = plan_rounds(params, sources, bucket_bytes=1 << 62)
        placed, end = placed_rounds(rounds, 1 if self.pull else sources)
        self._new_block(end, device)
        self._used[0] = end
        self._params, self._rounds, self._plan = params, placed, encode_plan(rounds, sources)
        self._in_place = False
        self._segments = [self._rows(rnd, offset, 1)[0] if self.pull else
                          torch.zeros(rnd.segment, dtype=rnd.dtype, device=device) for rnd, offset in placed]

    def _rows(self, rnd: Round, offset: int, sources: int, buffer: Optional[torch.Tensor] = None) -> torch.Tensor:
        """[sources, segment] of round ``rnd`` in block 0: row r is learner rank r's segment."""
        buffer = self.blocks[0] if buffer is None else buffer
        nbytes = sources * rnd.segment * rnd.dtype.itemsize
        return buffer[offset:offset + nbytes].view(rnd.dtype).view(sources, rnd.segment)

    def _view(self, i: int, blocks: Optional[list[torch.Tensor]] = None,
              layout: Optional[list] = None) -> torch.Tensor:
        blocks = self.blocks if blocks is None else blocks
        _, shape, dtype, block, offset = (self.layout if layout is None else layout)[i]
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        return blocks[block][offset:offset + nbytes].view(dtype).view(shape)

    def _export(self) -> list[dict]:
        for b in range(len(self._exported), len(self.blocks)):
            block = self.blocks[b]
            if block.is_cuda:
                from torch.multiprocessing.reductions import reduce_tensor

                rebuild, args = reduce_tensor(block)
                self._exported.append({"kind": "cuda", "rebuild": rebuild, "args": args, "key": uuid.uuid4().hex,
                                       "device": device_uuid(block.device), "host": socket.gethostname()})
            else:
                self._exported.append({"kind": "shm", "name": self._shms[b].name, "size": block.numel(),
                                       "key": self._shms[b].name})
        return list(self._exported)

    # ---- rollout worker -------------------------------------------------------------------
    def receive(self, handle: WeightHandle, load: LoadFn) -> int:
        if handle.ref is None:
            raise RuntimeError(f"weight push (ipc): the handle of version {handle.version} carries no buffer; the "
                               "worker's learner rank sent nothing (is it on this worker's device?)")
        blocks = self.map_blocks(handle.ref["blocks"])
        self.check_version(blocks[0], handle.version, "before")
        if "plan" in handle.ref:  # send_shards: put every parameter together from the ranks' rows
            sources, rounds = decode_plan(handle.ref["plan"], f"weight push (ipc) of version {handle.version}")
            placed, end = placed_rounds(rounds, sources)
            if end > blocks[0].numel():
                raise ValueError(f"weight push (ipc) of version {handle.version}: the plan needs {end} bytes, the "
                                 f"learner rank's buffer has {blocks[0].numel()}")
            for rnd, offset in placed:
                assemble(self._rows(rnd, offset, sources, blocks[0]), rnd, sources, load)
        else:
            layout = handle.ref["layout"]
            load([(name, self._view(i, blocks, layout)) for i, (name, *_) in enumerate(layout)])
        if blocks[0].is_cuda:  # the copies were issued on this thread's stream (a staging stream beside requests)
            torch.cuda.current_stream(blocks[0].device).synchronize()
        self.check_version(blocks[0], handle.version, "while")
        return handle.version

    def map_blocks(self, exported: list[dict]) -> list[torch.Tensor]:
        """Each block of the sender's buffer, mapped once: a mapping is kept while the handle's
        block (its key) stays in the buffer, and dropped when it leaves."""
        keys = [e["key"] for e in exported]
        for key in [k for k in self._mapped if k not in keys]:
            self._unmap(key)
        for e in exported:
            if e["key"] in self._mapped:
                continue
            if e["kind"] == "cuda" and self.pull:  # another GPU of this host: its memory is read over the link
                if e["host"] != socket.gethostname():
                    raise RuntimeError(
                        f"weight push (peer): this rollout worker runs on {socket.gethostname()}, its learner rank on "
                        f"{e['host']}; the peer push reads the learner's memory and needs every worker on the "
                        "learner's host: set weights.backend to nccl"
                    )
                try:
                    self._mapped[e["key"]] = (e["rebuild"](*e["args"]), None)
                except RuntimeError as err:  # CUDA IPC refused (containers apart, no peer access between the GPUs)
                    raise RuntimeError(
                        f"weight push (peer): this rollout worker could not map its learner rank's GPU memory on "
                        f"{e['host']} (CUDA IPC: {str(err).splitlines()[0] if str(err) else type(err).__name__}); "
                        "set weights.backend to nccl"
                    ) from err
            elif e["kind"] == "cuda":
                mine = device_uuid(torch.device("cuda", torch.cuda.current_device()))
                if mine != e["device"]:
                    raise RuntimeError(
                        f"weight push (ipc): this worker's GPU ({mine}) is not its learner rank's ({e['device']}); the "
                        "ipc push needs every worker on its learner rank's GPU (cluster.colocate, no workers added by "
                        "scaling): set weights.backend to object_store"
                    )
                self._mapped[e["key"]] = (e["rebuild"](*e["args"]), None)
            elif e["kind"] == "segment":  # a learner's CPU storage shared in place (common/transport/views.py)
                storage = torch.UntypedStorage._new_shared_filename_cpu(  # noqa: SLF001
                    e["manager"], e["filename"], e["size"])
                self._mapped[e["key"]] = (torch.empty(0, dtype=torch.uint8).set_(storage), None)
            else:
                from multiprocessing import shared_memory

                shm = shared_memory.SharedMemory(name=e["name"])
                _untrack(shm)
                self._mapped[e["key"]] = (torch.frombuffer(shm.buf, dtype=torch.uint8)[: e["size"]], shm)
        return [self._mapped[k][0] for k in keys]

    def check_version(self, buffer: torch.Tensor, version: int, when: str) -> None:
        """The version in ``buffer``'s header is ``version`` (``when``: before or while reading)."""
        self.check_held(int(header(buffer).item()), version, when)

    def check_held(self, held: int, version: int, when: str) -> None:
        """``held``, read from the sender's header, is ``version`` (``when``: before or while reading)."""
        if held == version:
            return
        fix = ("the sender rewrote its buffer before every receiver had pulled it (a fault of the push's protocol)"
               if self.pull else "rank and worker must take turns (algorithm.max_staleness 0)")
        raise RuntimeError(
            f"weight push (ipc): the learner rank's buffer holds version {held} {when} this worker read version "
            f"{version}: {fix}; nothing was loaded" if when == "before" else
            f"weight push (ipc): the learner rank's buffer was overwritten with version {held} while this worker "
            f"read version {version}: {fix}"
        )

    def _unmap(self, key: str) -> None:
        _, shm = self._mapped.pop(key)
        if shm is not None:  # a receiver's opened block is the sender's to unlink
            _close(shm)

    def close(self) -> None:
        """Drop the buffer (sender: its shared blocks are unlinked) or the mappings (receiver)."""
        self.blocks, self._used, self._exported, self.layout = [], [], [], []
        self._params, self._rounds, self._plan, self._segments = [], [], b"", []
        self._in_place, self._storages = False, {}
        while self._shms:
            _drop(self._shms.pop())
        for key in list(self._mapped):
            self._unmap(key)


def header(block: torch.Tensor) -> torch.Tensor:
    """The version slot at the start of a sender's first block (one int64), as a view."""
    return block[:8].view(torch.int64)


def placed_rounds(rounds: list[Round], sources: int) -> tuple[list[tuple[Round, int]], int]:
    """Each round's byte offset in block 0 (after the header, each aligned) and the block's size."""
    placed, offset = [], ALIGN
    for rnd in rounds:
        placed.append((rnd, offset))
        offset += -(-sources * rnd.segment * rnd.dtype.itemsize // ALIGN) * ALIGN
    return placed, offset


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def device_uuid(device: torch.device) -> str:
    """The physical GPU's identity (device indices differ between processes)."""
    return str(torch.cuda.get_device_properties(device).uuid)


def _close(shm: Any) -> None:
    """Close a shared block; a tensor still viewing it keeps the mapping until it is collected. A
    full collection (slow in a process holding many objects) runs only where a view is left."""
    import gc

    try:
        shm.close()
        return
    except BufferError:
        gc.collect()  # views only unreachable cycles still hold
    try:
        shm.close()
    except BufferError:
        pass


def _drop(shm: Any) -> None:
    """A sender's shared block: closed and unlinked."""
    _close(shm)
    shm.unlink()


def _untrack(shm: Any) -> None:
    """A receiver's opened block is the sender's to unlink: keep Python's resource tracker out of it."""
    try:
        from multiprocessing import resource_tracker

        resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001
    except Exception:  # noqa: BLE001  (no tracker in this process: nothing to undo)
        pass

"""Weight push by collective broadcast: learner rank 0 -> rollout workers (NCCL on GPU, gloo on CPU).

The group is *not* the learner's default group: rank 0 hosts a TCPStore on a port of its own (bound
to its node's IP only; bucket metadata crosses it as checked JSON: common/transport/store.py) and
every member builds a ProcessGroupNCCL / ProcessGroupGloo object directly over that store, so the
push group and the learner group never see each other's collectives (the vLLM
StatelessProcessGroup idea, with torch's own backends).

One transfer of version v, in store keys under ``v{v}/``:

    receivers   set ready/<rank>                       (announce: "I am in the collective")
    rank 0      wait for every ready/<rank>            (timeout: names the receivers missing)
    rank 0      per bucket i: set meta/<i> = [(name, dtype, shape, offset)], nbytes; broadcast bytes
    receivers   per bucket i: wait meta/<i>            (timeout: names learner rank 0 and v)
                receive the bytes, view each tensor in place, hand the bucket to the loader
    rank 0      set meta/<n> = end

Buckets are flat uint8 buffers: any dtype travels bit for bit and a bucket is one collective.
A transfer that fails leaves the group unusable (a broken NCCL communicator cannot be trusted):
rebuild it with ``setup_weight_push`` on a new port, with the workers that remain.

Double buffering: each end keeps two bucket buffers and alternates between them, so the copies
overlap the link. The sender packs bucket i+1 (and publishes its metadata) while bucket i is on
the wire; a receiver posts its receive of bucket i+1 before copying bucket i into the model.
Ordering is by streams, not by the host: a buffer is written again only after the broadcast that
last used it (the current stream waits on that collective), and a broadcast starts only after the
packing it sends (NCCL's stream waits on the current stream when the collective is posted). Only
the last collective of a transfer is waited for on the host, with the transfer's timeout; the ones
before it are bounded by the group's own timeout (NCCL's watchdog aborts a stuck collective).
Memory: two buckets on each end (2 x ``bucket_mb``).

That is the gathered push (``send``: a merged LoRA push, a ZeRO-1/2 learner's rank 0). The sharded one (``send_shards``,
``sources`` S >= 1: ranks 0..S-1 are learner ranks, the receivers follow) publishes one plan per
version instead of per-bucket metadata and sends each learner rank's partitions from where they lie;
its wire format and the receivers' reassembly are in common/transport/shards.py.

Sharded groups. Each source broadcasts over a group of its own: the source and the receivers
(``source_group``: S groups over the one store, under prefixes of their own). A learner rank
belongs to its group only, so it never takes part in another source's broadcast, and a receiver
posts round k's S broadcasts on S groups, whose streams run them at the same time: the round's
bytes come into each receiver from S senders at once instead of one after the other. Every
receiver posts the groups in the same order (source 0 first), and a source is a member of one
group only, so the groups' collectives (and their communicators' set-up, on the first
broadcast) can never wait on each other in a cycle.
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Callable, Iterable, Iterator, Optional, Sequence

import torch
import torch.distributed as dist

from stabledrl.common.transport.shards import (
    Round, assemble, decode_plan, encode_plan, iter_segments, plan_rounds, segment_view,
)
from stabledrl.common.transport.store import decode_meta, encode_meta, open_store
from stabledrl.common.transport.base import (
    WIRE_DTYPES, LoadFn, NamedTensors, SendsWeights, WeightHandle, WeightPushConfig,
)

ALIGN = 16  # byte alignment of each tensor inside a bucket (any dtype can be viewed in place)
SENDER = "learner rank 0"


class BroadcastPush(SendsWeights):
    def __init__(self, cfg: WeightPushConfig, backend: str, rank: int, world_size: int, master_addr: str,
                 master_port: int, peer_names: Optional[Sequence[str]] = None, sources: int = 0) -> None:
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"broadcast weight push needs backend nccl or gloo, got {backend!r}")
        # sources 0: rank 0 sends gathered tensors (``send``); sources S >= 1: ranks 0..S-1 are learner
        # ranks that each send their partitions (``send_shards``, common/transport/shards.py)
        self.sources, self.first = sources, max(sources, 1)  # the first receiver's rank
        if world_size <= self.first:
            raise ValueError(f"broadcast weight push needs at least one receiver (world_size > {self.first})")
        self.cfg, self.backend, self.rank, self.world_size = cfg, backend, rank, world_size
        self.peer_names = list(peer_names or [f"rollout worker {r}" for r in range(self.first, world_size)])
        self.address = f"{master_addr}:{master_port}"
        self.timeout = timedelta(seconds=cfg.timeout_s)
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        try:
            self.store = open_store(master_addr, master_port, is_master=rank == 0, timeout=self.timeout)
        except Exception as e:  # torch raises DistNetworkError / RuntimeError by release
            raise TimeoutError(f"weight push: rank {rank} could not reach the store of {SENDER} at "
                               f"{self.address} within {cfg.timeout_s:.0f} s ({e})") from e
        self.group: Optional[dist.ProcessGroup] = None  # the gathered push's group (every member)
        self.groups: dict[int, dist.ProcessGroup] = {}  # sharded: source -> its group (``source_group``)
        self._previous: Optional[int] = None
        self._shards = _ShardBuffers()  # the sharded push's persistent buffers (kept across pushes)
        self.stats: dict[str, int] = {}  # the last send_shards: rounds, segments sent as they lie / packed
        self.waited_s = 0.0  # the last transfer: seconds waiting for the other end before a byte moved

    # ---- sender ---------------------------------------------------------------------------
    def send(self, named_tensors: NamedTensors, version: int) -> WeightHandle:
        self._check_gathered_sender()
        named_tensors = iter(named_tensors)
        try:
            self._wait_for_receivers(version)
            self._connect()
            buckets, last = 0, None
            packer = _Packer(int(self.cfg.bucket_mb * 2**20), self.device, WIRE_DTYPES.get(self.cfg.dtype))
            for entries, payload in packer.buckets(named_tensors):
                self.store.set(f"v{version}/meta/{buckets}", encode_meta(entries, payload.numel()))
                what = f"bucket {buckets} of version {version}"
                last = self._post(payload, what)
                if not packer.sent(last):  # sent from the tensor itself: keep it until it is out
                    self._wait(last, what, block=False)
                buckets += 1
            self.store.set(f"v{version}/meta/{buckets}", encode_meta(None))
            if last is not None:
                self._wait(last, f"bucket {buckets - 1} of version {version}")
        finally:
            for _ in named_tensors:  # the learner's other ranks are gathering alongside: finish with them
                pass
        self._forget(self._previous)
        self._previous = version
        return WeightHandle(version, self.backend)

    def send_shards(self, partitions: Iterable[tuple[str, tuple[int, ...], torch.Tensor]], version: int
                    ) -> WeightHandle:
        """Learner rank r < sources: broadcast this rank's partitions of every parameter (flat
        tensors of ``partition_numel(n, sources)`` elements, in the order of the learner's
        parameters, the same order on every rank) as version ``version``; every source calls it."""
        if not self.sources or self.rank >= self.sources:
            raise RuntimeError(f"rank {self.rank} is not a source of this push group ({self.sources} sources)")
        partitions = list(partitions)
        wire = WIRE_DTYPES.get(self.cfg.dtype)
        params = [(name, tuple(shape), wire or t.dtype) for name, shape, t in partitions]
        rounds = plan_rounds(params, self.sources, int(self.cfg.bucket_mb * 2**20))
        segments = list(iter_segments(rounds, iter(partitions), self.sources))  # checked before a byte moves
        self._wait_for_receivers(version)  # every source: a receiver missing fails each of them, named, in time
        if self.rank == 0:
            self.store.set(f"v{version}/plan", encode_plan(rounds, self.sources))
        self._connect()
        bufs, works = self._shards, []
        last = None
        self.stats = {"rounds": len(rounds), "segments_as_they_lie": 0, "segments_packed": 0}
        for k, (rnd, parts) in enumerate(segments):  # this rank's segments, over its own group
            what = f"round {k} (learner rank {self.rank}) of version {version}"
            payload = bufs.payload(parts, rnd, self.device)
            self.stats["segments_packed" if bufs.lent is not None else "segments_as_they_lie"] += 1
            last = self._post(payload, what, source=self.rank)
            bufs.sent(last)
            works.append((last, what))
        for work, what in works[:-1] if self.backend == "gloo" else []:
            self._wait(work, what)  # gloo: every work on the host (its threads may run them out of order)
        if last is not None:
            self._wait(last, works[-1][1])
        bufs.done()
        if self.rank == 0:
            self._forget(self._previous)
        self._previous = version
        return WeightHandle(version, self.backend)

    def _check_gathered_sender(self) -> None:
        if self.sources:
            raise RuntimeError("this push group is sharded: its learner ranks call send_shards")
        if self.rank != 0:
            raise RuntimeError("only rank 0 (learner rank 0) sends weights")

    def _wait_for_receivers(self, version: int) -> None:
        """Every receiver has joined version ``version`` (``waited_s``: how long that took)."""
        t0 = time.perf_counter()
        self._wait_for_each_receiver(version, "ready", lambda missing: (
            f"weight push: waited {self.cfg.timeout_s:.0f} s for weights version {version}; "
            f"receivers that never joined: {missing or '(none: they joined late)'}"))
        self.waited_s = time.perf_counter() - t0

    def _wait_for_each_receiver(self, version: int, key: str, failure: Callable[[str], str]) -> None:
        """Every receiver has set ``v{version}/{key}/<its rank>``, within the timeout; else a
        TimeoutError with ``failure`` of the names of those that have not (comma separated)."""
        keys = [f"v{version}/{key}/{r}" for r in range(self.first, self.world_size)]
        try:
            self.store.wait(keys, self.timeout)
        except Exception:
            missing = [self.peer_names[r - self.first] for r, key in enumerate(keys, start=self.first)
                       if not self.store.check([key])]
            raise TimeoutError(failure(", ".join(missing))) from None

    def _forget(self, version: Optional[int]) -> None:
        """Drop a finished version's keys (all receivers have read them: they joined the next one)."""
        if version is None:
            return
        for key in [f"v{version}/ready/{r}" for r in range(self.first, self.world_size)]:
            self.store.delete_key(key)
        self.store.delete_key(f"v{version}/plan")
        i = 0
        while self.store.check([f"v{version}/meta/{i}"]):
            self.store.delete_key(f"v{version}/meta/{i}")
            i += 1

    # ---- receiver -------------------------------------------------------------------------
    def receive(self, handle: WeightHandle, loader: LoadFn) -> int:
        if self.rank < self.first:
            raise RuntimeError("learner ranks send; they do not receive")
        version = handle.version
        self.store.set(f"v{version}/ready/{self.rank}", b"1")
        joined = time.perf_counter()  # ``waited_s``: from here to the sender's plan or first bucket
        if self.sources:
            return self._receive_shards(version, loader, joined)
        self._connect()
        buffers: list[Optional[torch.Tensor]] = [None, None]
        pending = None  # (work, payload, entries, what) posted and not yet copied into the model
        i = 0
        while True:
            meta = self._wait_get(f"v{version}/meta/{i}", f"bucket {i} of weights version {version}")
            if i == 0:
                self.waited_s = time.perf_counter() - joined
            if meta is None:
                break
            entries, nbytes = meta
            slot = buffers[i % 2]
            if slot is None or slot.numel() < nbytes:
                slot = buffers[i % 2] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            payload = slot[:nbytes]
            what = f"bucket {i} of version {version}"
            work = self._post(payload, what)  # bucket i arrives while bucket i-1 is copied below
            if pending is not None:
                self._load(pending, loader, block=False)
            pending = (work, payload, entries, what)
            i += 1
        if pending is not None:
            self._load(pending, loader, block=True)
        return version

    def _receive_shards(self, version: int, loader: LoadFn, joined: float) -> int:
        what = f"the plan of weights version {version}"
        try:
            self.store.wait([f"v{version}/plan"], self.timeout)
        except Exception:
            raise TimeoutError(f"weight push: rank {self.rank} waited {self.cfg.timeout_s:.0f} s for {what} "
                               f"from {SENDER} at {self.address}") from None
        self.waited_s = time.perf_counter() - joined
        sources, rounds = decode_plan(self.store.get(f"v{version}/plan"),
                                      f"weight push: {what} from {SENDER} at {self.address}")
        if sources != self.sources:
            raise ValueError(f"weight push: {what} has {sources} sources; this group was built with {self.sources}")
        self._connect()
        pending = None  # (works, rows, round) posted and not yet put together
        for k, rnd in enumerate(rounds):
            rows = self._shards.rows(k % 2, rnd, sources, self.device)
            works = [(self._post(rows[src], f"round {k} (learner rank {src}) of version {version}", source=src),
                      f"round {k} (learner rank {src}) of version {version}") for src in range(sources)]
            if pending is not None:  # round k arrives while round k-1 is put together
                self._assemble(pending, loader, block=False)
            pending = (works, rows, rnd)
        if pending is not None:
            self._assemble(pending, loader, block=True)
        return version

    def _assemble(self, pending: tuple, loader: LoadFn, *, block: bool) -> None:
        works, rows, rnd = pending
        for work, what in works:  # the S groups run side by side: each is waited for
            self._wait(work, what, block=block or self.backend == "gloo")
        assemble(rows, rnd, self.sources, loader)

    def _load(self, pending: tuple, loader: LoadFn, *, block: bool) -> None:
        """Copy a received bucket into the model once its broadcast is done (the current stream waits
        for it; ``block``: the host waits too, bounded by the timeout)."""
        work, payload, entries, what = pending
        self._wait(work, what, block=block)
        loader(list(_unpack(payload, entries)))

    def _wait_get(self, key: str, what: str):
        try:
            self.store.wait([key], self.timeout)
        except Exception:
            raise TimeoutError(f"weight push: rank {self.rank} waited {self.cfg.timeout_s:.0f} s for {what} "
                               f"from {SENDER} at {self.address}") from None
        return decode_meta(self.store.get(key), f"weight push: {what} from {SENDER} at {self.address}")

    def close(self) -> None:
        """Leave the group: abort its communicator (local, never waits on peers) and drop the
        store. Call it on every member before building a new group (workers added or lost)."""
        for group in [self.group, *self.groups.values()]:
            if group is not None:
                group.abort()
        self.group, self.groups = None, {}
        self.store = None

    # ---- the group ------------------------------------------------------------------------
    def _connect(self) -> None:
        """Build the process group(s) on the first transfer, once every member is known present
        (gloo connects all pairs at construction; NCCL on the first collective): the gathered push's
        one group, or the sharded push's source groups this rank belongs to (a source: its own; a
        receiver: all S, source 0 first)."""
        if self.group is not None or self.groups:
            return
        try:
            if not self.sources:
                self.group = self._group("weight_push_group", self.rank, self.world_size)
                return
            mine = range(self.sources) if self.rank >= self.sources else [self.rank]
            for src in mine:
                rank, size = source_group(self.rank, src, self.sources, self.world_size)
                self.groups[src] = self._group(f"weight_push_group/source{src}", rank, size)
        except Exception as e:
            peers = "the receivers" if self.rank < self.first else SENDER
            raise TimeoutError(f"weight push: rank {self.rank} could not form the {self.backend} group with "
                               f"{peers} at {self.address} within {self.cfg.timeout_s:.0f} s ({e})") from e

    def _group(self, prefix: str, rank: int, size: int) -> dist.ProcessGroup:
        store = dist.PrefixStore(prefix, self.store)
        if self.backend == "gloo":
            return dist.ProcessGroupGloo(store, rank, size, self.timeout)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = self.timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)

    def _post(self, payload: torch.Tensor, what: str, source: Optional[int] = None):
        """Start the broadcast of ``payload`` from learner rank 0 over the gathered push's group,
        or from ``source`` over that source's group; returns its work."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0  # rank 0 of either group is its sender
        opts.timeout = self.timeout
        group = self.group if source is None else self.groups[source]
        try:
            return group.broadcast([payload], opts)
        except Exception as e:
            raise self._failed(what, e) from e

    def _wait(self, work, what: str, block: bool = True) -> None:
        """The current stream waits for ``work``; ``block``: the host too, at most the timeout
        (gloo always blocks the host)."""
        try:
            if block:
                work.wait(self.timeout)
            else:
                work.wait()
        except Exception as e:
            raise self._failed(what, e) from e

    def _failed(self, what: str, e: Exception) -> TimeoutError:
        peer = "the receivers" if self.rank < self.first else SENDER
        return TimeoutError(f"weight push: rank {self.rank} broadcast of {what} with {peer} failed or timed "
                            f"out after {self.cfg.timeout_s:.0f} s ({e}); rebuild the push group")


class _Packer:
    """Packs tensors into two alternating flat byte buffers: ``buckets`` yields (entries, filled
    bytes) per bucket; the caller posts its broadcast and hands the work to ``sent``. A buffer is
    written again only after its previous broadcast (stream order, see the module docstring)."""

    def __init__(self, bucket_bytes: int, device: torch.device, wire: Optional[torch.dtype]) -> None:
        self.bucket_bytes, self.device, self.wire = bucket_bytes, device, wire
        self.buffers = [torch.empty(bucket_bytes, dtype=torch.uint8, device=device) for _ in range(2)]
        self.works: list = [None, None]  # the broadcast that last read each buffer
        self.current = 0  # the buffer being filled
        self.lent = None  # the buffer whose bytes were yielded and not yet sent

    def sent(self, work) -> bool:
        """Record the broadcast of the last bucket; False if it was sent from a tensor, not a buffer."""
        if self.lent is None:
            return False
        self.works[self.lent] = work
        self.lent = None
        return True

    def buckets(self, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[list[tuple], torch.Tensor]]:
        entries: list[tuple] = []
        used = 0
        for name, tensor in named_tensors:
            tensor = tensor.detach().to(device=self.device, dtype=self.wire or tensor.dtype)
            raw = tensor.contiguous().reshape(-1).view(torch.uint8)  # [numel · itemsize]
            if entries and used + raw.numel() > self.bucket_bytes:
                yield self._lend(entries, used)
                entries, used = [], 0
            if raw.numel() > self.bucket_bytes:  # a tensor larger than a bucket travels alone, from itself
                yield [(name, tensor.dtype, tuple(tensor.shape), 0)], raw
                continue
            if not entries:
                self._reusable(self.current)
            self.buffers[self.current][used : used + raw.numel()].copy_(raw)
            entries.append((name, tensor.dtype, tuple(tensor.shape), used))
            used = _aligned(used + raw.numel())
        if entries:
            yield self._lend(entries, used)

    def _lend(self, entries: list[tuple], used: int) -> tuple[list[tuple], torch.Tensor]:
        self.lent = self.current
        self.current = 1 - self.current
        return entries, self.buffers[self.lent][:used]

    def _reusable(self, k: int) -> None:
        """The current stream waits for the broadcast that last read buffer ``k``."""
        if self.works[k] is not None:
            self.works[k].wait()
            self.works[k] = None


class _ShardBuffers:
    """The sharded push's persistent buffers, grown as needed and kept from push to push (no
    allocation per push): a source's two pack buffers (used only for segments that are not back
    to back in memory), a receiver's two round buffers. A pack buffer is refilled only after the
    broadcast that last read it."""

    def __init__(self) -> None:
        self.packs: list[Optional[torch.Tensor]] = [None, None]
        self.works: list = [None, None]
        self.next = 0
        self.lent: Optional[int] = None
        self.rounds: list[Optional[torch.Tensor]] = [None, None]

    @staticmethod
    def _fit(buf: Optional[torch.Tensor], nbytes: int, device: torch.device) -> torch.Tensor:
        if buf is None or buf.numel() < nbytes or buf.device != device:
            buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return buf

    def payload(self, parts: list[torch.Tensor], rnd: Round, device: torch.device) -> torch.Tensor:
        """A source's segment of round ``rnd``: its partitions where they already lie back to back
        (``segment_view``), else packed into a buffer (``lent`` says which)."""
        view = segment_view(parts, rnd.dtype, device)
        return self.pack(parts, rnd, device) if view is None else view

    def pack(self, parts: list[torch.Tensor], rnd: Round, device: torch.device) -> torch.Tensor:
        k = self.next
        if self.works[k] is not None:
            self.works[k].wait()  # the stream waits for the broadcast that last read this buffer
            self.works[k] = None
        itemsize = torch.empty((), dtype=rnd.dtype).element_size()
        self.packs[k] = self._fit(self.packs[k], rnd.segment * itemsize, device)
        seg = self.packs[k][: rnd.segment * itemsize].view(rnd.dtype)
        for piece, part in zip(rnd.pieces, parts):
            seg[piece.offset: piece.offset + part.numel()].copy_(part, non_blocking=True)
        self.lent, self.next = k, 1 - k
        return seg

    def sent(self, work) -> None:
        if self.lent is not None:
            self.works[self.lent] = work
            self.lent = None

    def done(self) -> None:
        self.works = [None, None]  # the transfer's last work was waited for

    def rows(self, k: int, rnd: Round, sources: int, device: torch.device) -> torch.Tensor:
        itemsize = torch.empty((), dtype=rnd.dtype).element_size()
        nbytes = sources * rnd.segment * itemsize
        self.rounds[k] = self._fit(self.rounds[k], nbytes, device)
        return self.rounds[k][:nbytes].view(rnd.dtype).view(sources, rnd.segment)


def source_group(rank: int, source: int, sources: int, world_size: int) -> tuple[int, int]:
    """(this rank's rank, the size) in the group of ``source``: the source is rank 0, receiver
    ranks ``sources``..world_size-1 follow as 1..N."""
    if rank < sources:
        if rank != source:
            raise ValueError(f"learner rank {rank} is no member of source {source}'s group")
        return 0, world_size - sources + 1
    return rank - sources + 1, world_size - sources + 1


def _unpack(payload: torch.Tensor, entries: list[tuple]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, dtype, shape, offset in entries:
        nbytes = _numel(shape) * torch.empty((), dtype=dtype).element_size()
        yield name, payload[offset : offset + nbytes].view(dtype).view(shape)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _numel(shape: tuple) -> int:
    out = 1
    for s in shape:
        out *= s
    return out

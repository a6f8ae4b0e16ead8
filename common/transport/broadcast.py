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
"""
from __future__ import annotations

import contextlib
import threading
from datetime import timedelta
from typing import Iterator, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch import nn

from common.transport.store import decode_meta, encode_meta, open_store
from common.transport.weights import (
    WIRE_DTYPES, LoadFn, NamedTensors, ParameterLoader, WeightHandle, WeightPushConfig, _finish, as_loader,
)

ALIGN = 16  # byte alignment of each tensor inside a bucket (any dtype can be viewed in place)
SENDER = "learner rank 0"


class BroadcastPush:
    concurrent = True

    def __init__(self, cfg: WeightPushConfig, backend: str, rank: int, world_size: int, master_addr: str,
                 master_port: int, peer_names: Optional[Sequence[str]] = None) -> None:
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"broadcast weight push needs backend nccl or gloo, got {backend!r}")
        if world_size < 2:
            raise ValueError("broadcast weight push needs at least one receiver (world_size >= 2)")
        self.cfg, self.backend, self.rank, self.world_size = cfg, backend, rank, world_size
        self.peer_names = list(peer_names or [f"rollout worker {r}" for r in range(1, world_size)])
        self.address = f"{master_addr}:{master_port}"
        self.timeout = timedelta(seconds=cfg.timeout_s)
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        try:
            self.store = open_store(master_addr, master_port, is_master=rank == 0, timeout=self.timeout)
        except Exception as e:  # torch raises DistNetworkError / RuntimeError by release
            raise TimeoutError(f"weight push: rank {rank} could not reach the store of {SENDER} at "
                               f"{self.address} within {cfg.timeout_s:.0f} s ({e})") from e
        self.group: Optional[dist.ProcessGroup] = None
        self._previous: Optional[int] = None

    # ---- sender ---------------------------------------------------------------------------
    def send(self, named_tensors: NamedTensors, version: int) -> WeightHandle:
        if self.rank != 0:
            raise RuntimeError("only rank 0 (learner rank 0) sends weights")
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

    def _wait_for_receivers(self, version: int) -> None:
        keys = [f"v{version}/ready/{r}" for r in range(1, self.world_size)]
        try:
            self.store.wait(keys, self.timeout)
        except Exception:
            missing = [self.peer_names[r - 1] for r, key in enumerate(keys, start=1) if not self.store.check([key])]
            raise TimeoutError(f"weight push: waited {self.cfg.timeout_s:.0f} s for weights version {version}; "
                               f"receivers that never joined: {', '.join(missing) or '(none: they joined late)'}"
                               ) from None

    def _forget(self, version: Optional[int]) -> None:
        """Drop a finished version's keys (all receivers have read them: they joined the next one)."""
        if version is None:
            return
        for key in [f"v{version}/ready/{r}" for r in range(1, self.world_size)]:
            self.store.delete_key(key)
        i = 0
        while self.store.check([f"v{version}/meta/{i}"]):
            self.store.delete_key(f"v{version}/meta/{i}")
            i += 1

    # ---- receiver -------------------------------------------------------------------------
    def receive(self, handle: WeightHandle, target: Union[nn.Module, LoadFn]) -> int:
        if self.rank == 0:
            raise RuntimeError("rank 0 (learner rank 0) sends; it does not receive")
        version = handle.version
        self.store.set(f"v{version}/ready/{self.rank}", b"1")
        loader = as_loader(target)
        self._connect()
        buffers: list[Optional[torch.Tensor]] = [None, None]
        pending = None  # (work, payload, entries, what) posted and not yet copied into the model
        i = 0
        while True:
            meta = self._wait_get(f"v{version}/meta/{i}", f"bucket {i} of weights version {version}")
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
        _finish(loader)
        return version

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
        if self.group is not None:
            self.group.abort()
        self.group = None
        self.store = None

    # ---- the group ------------------------------------------------------------------------
    def _connect(self) -> None:
        """Build the process group on the first transfer, once every member is known present
        (gloo connects all pairs at construction; NCCL on the first collective)."""
        if self.group is not None:
            return
        store = dist.PrefixStore("weight_push_group", self.store)
        try:
            if self.backend == "gloo":
                self.group = dist.ProcessGroupGloo(store, self.rank, self.world_size, self.timeout)
            else:
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = self.timeout
                self.group = dist.ProcessGroupNCCL(store, self.rank, self.world_size, options)
        except Exception as e:
            peers = "the receivers" if self.rank == 0 else SENDER
            raise TimeoutError(f"weight push: rank {self.rank} could not form the {self.backend} group with "
                               f"{peers} at {self.address} within {self.cfg.timeout_s:.0f} s ({e})") from e

    def _post(self, payload: torch.Tensor, what: str):
        """Start the broadcast of ``payload`` (root: rank 0); returns its work."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.timeout = self.timeout
        try:
            return self.group.broadcast([payload], opts)
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
        peer = "the receivers" if self.rank == 0 else SENDER
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


class StagedWeights:
    """A second copy of a module's parameters that a receiver fills while the module is in use
    (a rollout worker generating), swapped in between requests.

    ``receive`` runs on a thread of its own (the worker's weights concurrency group): the push's
    buckets are copied into the staging tensors on a CUDA stream of their own, so the broadcast
    never waits for the request the worker is running. ``apply`` runs on the worker's request
    thread, in order with its requests: it copies the staged tensors into the parameters (a
    device copy: milliseconds), so a request is sampled wholly with one version.

    ``keep_order``: a version staged and not yet applied is never overwritten (the next receive
    waits for ``apply``), so a request queued before a push is sampled with exactly the version
    before it (in-order runs). Without it a newer push replaces the staged copy: a queued request
    then runs with the newer weights, which only lowers its staleness. Memory: one more copy of
    the parameters on the device (of the pushed ones, for a partial push).
    """

    def __init__(self, module: nn.Module) -> None:
        self.params = dict(module.named_parameters())
        self.tensors: dict[str, torch.Tensor] = {}  # the staging copy, allocated as parameters first arrive
        self.version: Optional[int] = None  # staged and not yet applied
        self.last: Optional[int] = None  # the newest version ever staged
        self.names: set[str] = set()  # the parameters the staged version carries
        self.applied = threading.Condition()
        self.stream = None

    def receive(self, push: "BroadcastPush", handle: WeightHandle, *, keep_order: bool, timeout_s: float,
                partial: bool = False) -> int:
        """Stage ``handle.version`` (blocks while an earlier version waits to be applied, with
        ``keep_order``); returns the version staged. ``partial``: the push may carry only some
        parameters (a LoRA learner's adapted matrices); only those are applied."""
        with self.applied:
            if keep_order and not self.applied.wait_for(lambda: self.version is None, timeout=timeout_s):
                raise TimeoutError(f"weight push: version {self.version} was staged {timeout_s:.0f} s ago and is "
                                   f"still not applied; version {handle.version} cannot be staged over it")
            self.version = None  # a replaced copy is never applied half-written
            device = next(iter(self.params.values())).device
            if device.type == "cuda" and self.stream is None:
                self.stream = torch.cuda.Stream(device)
            loader = _StagingLoader(self, partial=partial)
            with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
                push.receive(handle, loader)
                if self.stream is not None:
                    self.stream.synchronize()
            self.names = loader.arrived
            self.version = self.last = handle.version
            return handle.version

    def apply(self) -> Optional[int]:
        """Copy the staged version into the parameters; returns it (None if nothing is staged)."""
        with self.applied:
            if self.version is None:
                return None
            with torch.no_grad():
                for name in self.names:
                    self.params[name].copy_(self.tensors[name])
            if self.stream is not None:  # the copies are done before the staging copy is written again
                torch.cuda.current_stream().synchronize()
            version, self.version = self.version, None
            self.applied.notify_all()
            return version


class _StagingLoader(ParameterLoader):
    """A loader into a StagedWeights copy: each parameter's staging tensor is allocated when it
    first arrives (a partial push stages only what it carries), and the names are remembered."""

    def __init__(self, staged: StagedWeights, partial: bool) -> None:
        super().__init__(staged.params, partial=partial)  # checks names and shapes against the model
        self.staged = staged

    @torch.no_grad()
    def __call__(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named_tensors:
            param = self.params.get(name)
            if param is None:
                raise KeyError(f"weight push: received {name!r}, which the receiving model does not have")
            if param.shape != tensor.shape:
                raise ValueError(f"weight push: {name} has shape {tuple(tensor.shape)}, the model {tuple(param.shape)}")
            if name not in self.staged.tensors:
                self.staged.tensors[name] = torch.empty_like(param, memory_format=torch.contiguous_format)
            self.staged.tensors[name].copy_(tensor)
            self.loaded.add(name)

    def finish(self) -> None:
        self.arrived = set(self.loaded)
        super().finish()

"""Weight push by collective broadcast: learner rank 0 -> rollout workers (NCCL on GPU, gloo on CPU).

The group is *not* the learner's default group: rank 0 hosts a TCPStore on a port of its own and
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
"""
from __future__ import annotations

import pickle
from datetime import timedelta
from typing import Iterator, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch import nn

from common.transport.weights import WIRE_DTYPES, LoadFn, NamedTensors, WeightHandle, WeightPushConfig, _finish, as_loader

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
            self.store = dist.TCPStore(master_addr, master_port, is_master=rank == 0, timeout=self.timeout,
                                       wait_for_workers=False)
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
            buckets = 0
            for entries, payload in _pack(named_tensors, int(self.cfg.bucket_mb * 2**20), self.device,
                                          WIRE_DTYPES.get(self.cfg.dtype)):
                self.store.set(f"v{version}/meta/{buckets}", pickle.dumps((entries, payload.numel())))
                self._broadcast(payload, f"bucket {buckets} of version {version}")
                buckets += 1
            self.store.set(f"v{version}/meta/{buckets}", pickle.dumps(None))
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
        i = 0
        while True:
            meta = self._wait_get(f"v{version}/meta/{i}", f"bucket {i} of weights version {version}")
            if meta is None:
                break
            entries, nbytes = meta
            payload = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            self._broadcast(payload, f"bucket {i} of version {version}")
            loader(list(_unpack(payload, entries)))
            i += 1
        _finish(loader)
        return version

    def _wait_get(self, key: str, what: str):
        try:
            self.store.wait([key], self.timeout)
        except Exception:
            raise TimeoutError(f"weight push: rank {self.rank} waited {self.cfg.timeout_s:.0f} s for {what} "
                               f"from {SENDER} at {self.address}") from None
        return pickle.loads(self.store.get(key))

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

    def _broadcast(self, payload: torch.Tensor, what: str) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.timeout = self.timeout
        peer = "the receivers" if self.rank == 0 else SENDER
        try:
            self.group.broadcast([payload], opts).wait(self.timeout)
        except Exception as e:
            raise TimeoutError(f"weight push: rank {self.rank} broadcast of {what} with {peer} failed or timed "
                               f"out after {self.cfg.timeout_s:.0f} s ({e}); rebuild the push group") from e


def _pack(named_tensors: Iterator[tuple[str, torch.Tensor]], bucket_bytes: int, device: torch.device,
          wire: Optional[torch.dtype]) -> Iterator[tuple[list[tuple], torch.Tensor]]:
    """Copy tensors into one reused flat byte buffer; yield (entries, filled bytes) per bucket.
    The yielded buffer is overwritten after the consumer asks for the next bucket."""
    buffer = torch.empty(bucket_bytes, dtype=torch.uint8, device=device)
    entries: list[tuple] = []
    used = 0
    for name, tensor in named_tensors:
        tensor = tensor.detach().to(device=device, dtype=wire or tensor.dtype)
        raw = tensor.contiguous().reshape(-1).view(torch.uint8)  # [numel · itemsize]
        if entries and used + raw.numel() > bucket_bytes:
            yield entries, buffer[:used]
            entries, used = [], 0
        if raw.numel() > bucket_bytes:  # a tensor larger than a bucket travels alone
            yield [(name, tensor.dtype, tuple(tensor.shape), 0)], raw
            continue
        buffer[used : used + raw.numel()].copy_(raw)
        entries.append((name, tensor.dtype, tuple(tensor.shape), used))
        used = _aligned(used + raw.numel())
    if entries:
        yield entries, buffer[:used]


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

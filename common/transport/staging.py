"""A second copy of a module's parameters that a receiver fills while the module is in use (a
rollout worker generating), swapped in between requests: the worker's end of a push that never
waits for the request the worker is running (``weights.staging``; rollout/engine.py)."""
from __future__ import annotations

import contextlib
import threading
from typing import Optional

import torch
from torch import nn

from stabledrl.common.gil import prompt_gil
from stabledrl.common.transport.shards import Round, assemble
from stabledrl.common.transport.base import ParameterLoader, WeightHandle, WeightPush


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

    A peer push (common/transport/peer.py) may defer instead: it copies each learner rank's
    partitions whole into this copy's ``mirrors`` (a few copies on the receiving thread, which has
    to take Python's GIL back after each) and leaves putting every parameter together from them to
    ``apply``, on the request thread, in place of the copy from the staging tensors (the same bytes
    either way).
    """

    def __init__(self, module: nn.Module, defer: bool = True, prompt: bool = True) -> None:
        self.params = dict(module.named_parameters())
        # False: a peer push writes the staging tensors row by row; the receive keeps Python's switch
        # interval and lets the collector start (common/gil.py): the slower receive that bench_push's
        # ``_rows`` modes measure against
        self.defer, self.prompt = defer, prompt
        self.tensors: dict[str, torch.Tensor] = {}  # the staging copy, allocated as parameters first arrive
        self.version: Optional[int] = None  # staged and not yet applied
        self.last: Optional[int] = None  # the newest version ever staged
        self.names: set[str] = set()  # the parameters the staged version carries
        self.applied = threading.Condition()
        self.stream = None
        # a deferring push's copy: each source's spans, and the rows of every parameter in them
        self.mirrors: dict[object, torch.Tensor] = {}
        self.pending: list[tuple[list[tuple[object, int, int]], Round, int]] = []

    def receive(self, push: WeightPush, handle: WeightHandle, *, keep_order: bool, timeout_s: float,
                partial: bool = False) -> int:
        """Stage ``handle.version`` (blocks while an earlier version waits to be applied, with
        ``keep_order``); returns the version staged. ``partial``: the push may carry only some
        parameters (a LoRA learner's adapted matrices, or its adapters); only those are applied."""
        with self.applied:
            if keep_order and not self.applied.wait_for(lambda: self.version is None, timeout=timeout_s):
                raise TimeoutError(f"weight push: version {self.version} was staged {timeout_s:.0f} s ago and is "
                                   f"still not applied; version {handle.version} cannot be staged over it")
            self.version = None  # a replaced copy is never applied half-written
            device = next(iter(self.params.values())).device
            if device.type == "cuda" and self.stream is None:
                self.stream = torch.cuda.Stream(device)
            loader = (_DeferringLoader if self.defer else _StagingLoader)(self, partial=partial)
            with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext(), \
                    (prompt_gil() if self.prompt else contextlib.nullcontext()):
                push.receive(handle, loader)
                loader.finish()
                if self.stream is not None:
                    self.stream.synchronize()
            self.pending = getattr(loader, "pending", [])
            if self.pending:  # only the mirrors hold this version (those this push wrote)
                self.tensors = {}
                self.mirrors = {key: self.mirrors[key] for key in loader.used}
            else:
                self.mirrors = {}
            self.names = loader.arrived
            self.version = self.last = handle.version
            return handle.version

    def apply(self) -> Optional[int]:
        """Copy the staged version into the parameters; returns it (None if nothing is staged)."""
        with self.applied:
            if self.version is None:
                return None
            with torch.no_grad():
                if self.pending:
                    into = ParameterLoader(self.params)
                    for rows, rnd, sources in self.pending:
                        assemble([self.mirrors[key][offset:offset + nbytes].view(rnd.dtype)
                                  for key, offset, nbytes in rows], rnd, sources, into)
                else:
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

    def destination(self, name: str, param: torch.Tensor) -> torch.Tensor:
        if name not in self.staged.tensors:
            self.staged.tensors[name] = torch.empty_like(param, memory_format=torch.contiguous_format)
        return self.staged.tensors[name]

    def finish(self) -> None:
        self.arrived = set(self.loaded)
        super().finish()


class _DeferringLoader(_StagingLoader):
    """A staging loader that a peer push may defer to (``StagedWeights``: the mirrors)."""

    def __init__(self, staged: StagedWeights, partial: bool) -> None:
        super().__init__(staged, partial)
        self.used: set = set()  # the mirrors this push wrote
        self.pending: list[tuple[list[tuple[object, int, int]], Round, int]] = []  # what ``apply`` puts together

    def mirror(self, key: object, nbytes: int, device: torch.device) -> torch.Tensor:
        """Bytes of this copy for a deferring push's span ``key`` (kept across pushes of one layout)."""
        self.used.add(key)
        held = self.staged.mirrors.get(key)
        if held is None or held.numel() != nbytes or held.device != device:
            self.staged.mirrors[key] = held = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return held

    def defer(self, rows: list[tuple[object, int, int]], rnd: Round, sources: int) -> None:
        """Round ``rnd``'s parameters are to be put together from ``rows``, each (a mirror's key,
        byte offset, bytes) in this copy's mirrors, when the copy is applied; their names and shapes
        are checked now. No tensor is made here: each call into torch on the receiving thread would
        wait to take Python's GIL back (common/transport/peer.py, ``_mirror``)."""
        for piece in rnd.pieces:
            self.check(piece.name, piece.shape)
        self.pending.append((rows, rnd, sources))

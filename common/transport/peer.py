"""Weight push by pull (``weights.backend: peer``): every rollout worker reads the learner ranks'
weights from the ranks' own GPU memory with its copy engines, for workers on other GPUs of the
learner's host.

Why. The broadcast's NCCL kernels run on the worker's SMs, which the worker's own forwards fill
while it generates: at LLaDA-8B over 3 ZeRO-3 ranks the in-job push took 5.2x the raw broadcast of
the same bytes (BENCHMARKS.md). A device-to-device copy of memory mapped from another GPU (CUDA
IPC, over NVLink) is done by the copy engines and needs no SM: on 2 H200s the same pull took 1.005x
its idle time beside the worker's generation, and the idle pull was faster than the raw broadcast
(bench_peer_pull). CUDA IPC maps another GPU's memory even where the reader's
``CUDA_VISIBLE_DEVICES`` shows only its own GPU (as Ray sets it for every actor).

One transfer of version v, scheduled as a broadcast is (every receiver takes part; ``staging``
takes it beside the worker's requests), in keys of the learner rank 0's store under ``v{v}/``:

    learner rank r   offer what it sends: its ZeRO-3 partitions where they lie on its GPU (each
                     storage behind them exported once), else a copy in its buffer
                     (common/transport/ipc.py: blocks, exported once); set peer/<r> = the handles
                     (and the plan, and where each partition starts; its filling or export failed:
                     its error, which fails every receiver at once, naming the rank)
                     wait for every ready/<w> (timeout: names the receivers missing), then for
                     every pulled/<w> (timeout: names the receivers that did not finish; a
                     receiver whose read failed wrote its error there: raise with it)
    receiver w       set ready/<w>; wait for every peer/<r>; map each rank's blocks (kept while
                     they are); copy every parameter, or put it together from the S ranks' rows
                     (common/transport/shards.py), into its weights; into a staging copy, copy each
                     rank's span whole, a few copies, and leave putting the parameters together
                     to the copy's swap (``_mirror``); set pulled/<w> (or, the read failed, its error)

Gathered (``sources`` 0): learner rank 0 copies the gathered tensors into its buffer as they arrive.
Sharded (``sources`` S): each of the S ranks offers its own ZeRO-3 partitions, on GPUs where they
lie (on CPUs, and for another wire dtype, copied into its buffer), and each worker reads every
rank's (S contiguous copies per parameter: no all-gather among the learner ranks). Nothing a
receiver reads is written again before every receiver has pulled (the sender waits for them, and
the learner steps only after its push returns), and the version in each rank's header is checked
before and after each read. Memory: nothing more on a sharded push's GPUs; a gathered push keeps
one more copy of the weights on learner rank 0's GPU.
"""
from __future__ import annotations

import contextlib
import pickle
import time
from typing import Iterable, Optional, Sequence

import torch

from stabledrl.common.transport.broadcast import SENDER, BroadcastPush
from stabledrl.common.transport.ipc import IpcPush, header, placed_rounds
from stabledrl.common.transport.shards import Piece, Round, assemble, decode_plan, partition_numel
from stabledrl.common.transport.base import LoadFn, NamedTensors, WeightHandle, WeightPushConfig


FAILED = b"failed: "  # a rank's offer or a receiver's answer when it failed, then the error's first line


def _failures(names: Iterable[str], answers: Sequence[bytes]) -> list[str]:
    """``<name> failed: <error>`` for each end whose answer is a failure, in order."""
    return [f"{name} failed: {answer[len(FAILED):].decode(errors='replace')}"
            for name, answer in zip(names, answers) if answer.startswith(FAILED)]


def _error_line(error: BaseException) -> str:
    """``Type: message``'s first line (the part a sender's error quotes)."""
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class PeerPush(BroadcastPush):
    def __init__(self, cfg: WeightPushConfig, rank: int, world_size: int, master_addr: str, master_port: int,
                 peer_names: Optional[Sequence[str]] = None, sources: int = 0) -> None:
        super().__init__(cfg, "nccl" if torch.cuda.is_available() else "gloo", rank, world_size, master_addr,
                         master_port, peer_names, sources)
        self.backend = "peer"
        # a learner rank's buffer, or a receiver's mapping of each learner rank's (source -> end)
        self.buffer = IpcPush(cfg, rank=rank, sources=sources, pull=True) if rank < self.first else None
        self.maps: dict[int, IpcPush] = {}
        self.parts_s: dict[str, float] = {}  # the last sharded pull's parts (``_pull_shards``)
        self._versions: Optional[torch.Tensor] = None  # pinned: each rank's header, before and after a pull

    # ---- sender ---------------------------------------------------------------------------
    def send(self, named_tensors: NamedTensors, version: int) -> WeightHandle:
        self._check_gathered_sender()
        named_tensors = iter(named_tensors)
        try:
            with self._reported_at(f"v{version}/peer/{self.rank}"):
                handle = self.buffer.send(named_tensors, version)
        finally:
            for _ in named_tensors:  # the learner's other ranks are gathering alongside: finish with them
                pass
        return self._offer(handle, version)

    def send_shards(self, partitions: Iterable[tuple[str, tuple[int, ...], torch.Tensor]], version: int
                    ) -> WeightHandle:
        """Learner rank r < sources: this rank's partitions of every parameter (flat, in the
        learner's order, the same on every rank), pulled by every receiver; every source calls it."""
        if not self.sources or self.rank >= self.sources:
            raise RuntimeError(f"rank {self.rank} is not a source of this push group ({self.sources} sources)")
        with self._reported_at(f"v{version}/peer/{self.rank}"):
            handle = self.buffer.send_shards(iter(partitions), version)
        return self._offer(handle, version)

    @contextlib.contextmanager
    def _reported_at(self, key: str):
        """A failure inside is written under ``key``, where the other ends wait for this one (a
        rank's offer, a receiver's answer), so they fail at once, naming this end and its error, not
        at their timeout."""
        try:
            yield
        except BaseException as e:
            with contextlib.suppress(Exception):  # a store already gone: the error raised here is the one to see
                self.store.set(key, FAILED + _error_line(e).encode())
            raise

    def _offer(self, handle: WeightHandle, version: int) -> WeightHandle:
        """Publish this rank's buffer and wait until every receiver has read it."""
        self.store.set(f"v{version}/peer/{self.rank}", pickle.dumps(handle.ref))
        self._wait_for_receivers(version)
        self._wait_for_each_receiver(version, "pulled", lambda missing: (
            f"weight push (peer): waited {self.cfg.timeout_s:.0f} s for the receivers to read weights version "
            f"{version} from learner rank {self.rank}; still reading: {missing or '(none: they finished late)'}"))
        answers = self.store.multi_get([f"v{version}/pulled/{r}" for r in range(self.first, self.world_size)])
        failed = _failures(self.peer_names, answers)
        if failed:
            raise RuntimeError(f"weight push (peer) of version {version} from learner rank {self.rank}: "
                               + "; ".join(failed))
        if self.rank == 0:
            self._forget(self._previous)
        self._previous = version
        return WeightHandle(version, self.backend)

    def _forget(self, version: Optional[int]) -> None:
        if version is None:
            return
        super()._forget(version)
        for key in [f"v{version}/peer/{r}" for r in range(self.first)] + \
                [f"v{version}/pulled/{r}" for r in range(self.first, self.world_size)]:
            self.store.delete_key(key)

    # ---- receiver -------------------------------------------------------------------------
    def receive(self, handle: WeightHandle, loader: LoadFn) -> int:
        if self.rank < self.first:
            raise RuntimeError("learner ranks send; they do not receive")
        version = handle.version
        self.store.set(f"v{version}/ready/{self.rank}", b"1")
        joined = time.perf_counter()  # ``waited_s``: from here to every learner rank's buffer offered
        keys = [f"v{version}/peer/{r}" for r in range(self.first)]
        try:
            self.store.wait(keys, self.timeout)
        except Exception:
            missing = [f"learner rank {r}" for r, key in enumerate(keys) if not self.store.check([key])]
            raise TimeoutError(f"weight push (peer): rank {self.rank} waited {self.cfg.timeout_s:.0f} s for weights "
                               f"version {version} from {', '.join(missing)} ({SENDER}'s store at {self.address})"
                               ) from None
        self.waited_s = time.perf_counter() - joined
        self.parts_s = {}
        with self._reported_at(f"v{version}/pulled/{self.rank}"):
            offers = self.store.multi_get(keys)
            failed = _failures([f"learner rank {r}" for r in range(self.first)], offers)
            if failed:  # told to the other learner ranks too (they wait for this receiver's answer)
                raise RuntimeError(f"weight push (peer) of version {version}: " + "; ".join(failed))
            refs = [pickle.loads(offer) for offer in offers]
            if not self.maps:  # a mapping of each learner rank's buffer, kept across pushes
                self.maps = {r: IpcPush(self.cfg, pull=True) for r in range(self.first)}
            ends = [self.maps[r] for r in range(self.first)]
            if self.sources:
                self._pull_shards(version, ends, refs, loader)
            else:
                ends[0].receive(WeightHandle(version, "ipc", refs[0]), loader)
        self.store.set(f"v{version}/pulled/{self.rank}", b"1")
        return version

    def _pull_shards(self, version: int, ends: list[IpcPush], refs: list[dict], loader: LoadFn) -> None:
        """Put every parameter together from the S ranks' partitions, each read where it lies: in
        a rank's buffer (its rows, one a round) or, on GPUs, in the rank's own parameter storage.
        A loader that defers (``mirror`` and ``defer``: a staging copy, common/transport/staging.py)
        gets each rank's spans copied whole into memory of its own, a few copies in all, and puts
        the parameters together from there when it applies them (see ``_mirror``)."""
        what = f"weight push (peer) of version {version}"
        sources, rounds = decode_plan(refs[0]["plan"], what)
        if sources != self.sources:
            raise ValueError(f"{what}: the plan has {sources} sources; this group was built with {self.sources}")
        started, cpu_started = time.perf_counter(), time.thread_time()
        mapped = [end.map_blocks(ref["blocks"] + ref.get("storages", [])) for end, ref in zip(ends, refs)]
        headers = [m[0] for m in mapped]
        if "storages" in refs[0]:
            pieces = self._pieces_in_place(rounds, sources, refs)
        else:
            placed, size = placed_rounds(rounds, 1)
            for r, block in enumerate(headers):
                if size > block.numel():
                    raise ValueError(f"{what}: the plan needs {size} bytes, learner rank {r}'s buffer has "
                                     f"{block.numel()}")
            pieces = [(rnd, [(0, offset, rnd.segment * rnd.dtype.itemsize)] * sources) for rnd, offset in placed]
        spans = self._spans(pieces, loader)
        mapped_at = time.perf_counter()
        time.sleep(1e-4)  # gives Python's GIL up long enough for a waiting thread to take it: then waits out its hold
        yielded_at = time.perf_counter()
        before = self._read_versions(headers, 0)
        if spans is None:  # the rows go to the loader as they are read: the versions must be right first
            if headers[0].is_cuda:
                torch.cuda.current_stream(headers[0].device).synchronize()
            self._check_versions(ends, before, version, "before")
        checked_at = time.perf_counter()
        if spans is None:
            for rnd, where in pieces:
                rows = [mapped[r][i][offset:offset + nbytes].view(rnd.dtype)
                        for r, (i, offset, nbytes) in enumerate(where)]
                assemble(rows, rnd, sources, loader)
        else:
            self._mirror(pieces, spans, mapped, loader)
        after = self._read_versions(headers, 1)
        issued_at = time.perf_counter()
        if headers[0].is_cuda:  # the copies were issued on this thread's stream (a staging stream beside requests)
            torch.cuda.current_stream(headers[0].device).synchronize()
        if spans is not None:  # only the loader's own memory was written: nothing is used before it is applied
            self._check_versions(ends, before, version, "before")
        self._check_versions(ends, after, version, "while")
        # where a pull's time went (a worker's push_stage_<part> clocks): mapping what is new (and
        # dropping what left) and planning the copies; giving the GIL up once and taking it back (a
        # probe: another thread's hold shows here); reading each rank's header (row by row: waiting
        # for the read; deferred: issuing it, the read then ordered before the copies on the same
        # stream); issuing the copies; waiting for them; and the receiving thread's own CPU time
        # over the whole pull (a CUDA driver's spin-wait counts, a wait for the GIL or a lock does not)
        self.parts_s = {"map": mapped_at - started, "gil": yielded_at - mapped_at, "check": checked_at - yielded_at,
                        "issue": issued_at - checked_at, "copy": time.perf_counter() - issued_at,
                        "cpu": time.thread_time() - cpu_started}

    def _read_versions(self, headers: list[torch.Tensor], slot: int) -> "torch.Tensor | list[int]":
        """The version in each learner rank's header: on GPUs copied into pinned host memory on this
        thread's stream without waiting (valid once the stream is synchronised), on CPUs read now."""
        if not headers[0].is_cuda:
            return [int(header(block).item()) for block in headers]
        if self._versions is None or self._versions.shape[1] != len(headers):
            self._versions = torch.zeros(2, len(headers), dtype=torch.int64, pin_memory=True)
        into = self._versions[slot]
        for r, block in enumerate(headers):
            into[r:r + 1].copy_(header(block), non_blocking=True)
        return into

    @staticmethod
    def _check_versions(ends: list[IpcPush], held: "torch.Tensor | list[int]", version: int, when: str) -> None:
        """``held`` (``_read_versions``, its stream synchronised since) against ``version``."""
        for end, value in zip(ends, held.tolist() if isinstance(held, torch.Tensor) else held):
            end.check_held(int(value), version, when)

    @staticmethod
    def _pieces_in_place(rounds, sources: int, refs: list[dict]) -> list[tuple[Round, list[tuple[int, int, int]]]]:
        """Each parameter as a round of its own, with where each rank's partition of it lies: (its
        mapping's index: the rank's blocks, then its exported storages; byte offset; bytes)."""
        pieces, i = [], 0
        for rnd in rounds:
            for piece in rnd.pieces:
                nbytes = partition_numel(piece.numel, sources) * rnd.dtype.itemsize
                where = [(len(ref["blocks"]) + ref["where"][i][0], ref["where"][i][1], nbytes) for ref in refs]
                pieces.append((Round(rnd.dtype, nbytes // rnd.dtype.itemsize, (Piece(piece.name, piece.shape, 0),)),
                               where))
                i += 1
        return pieces

    @staticmethod
    def _spans(pieces: list[tuple[Round, list[tuple[int, int, int]]]], loader: LoadFn
               ) -> Optional[dict[tuple[int, int], list[int]]]:
        """Where the loader defers (``mirror`` and ``defer``: a staging copy,
        common/transport/staging.py): each rank's span of each mapping the pieces read, from its
        first row to its last, aligned down to 64 bytes, keyed (rank, mapping). None (the rows are
        read one by one instead): the loader does not defer, or the spans would hold a quarter
        more bytes than the rows themselves."""
        if getattr(loader, "mirror", None) is None or getattr(loader, "defer", None) is None:
            return None
        spans: dict[tuple[int, int], list[int]] = {}
        needed = 0
        for _, where in pieces:
            for r, (i, offset, nbytes) in enumerate(where):
                span = spans.setdefault((r, i), [offset, offset + nbytes])
                span[0], span[1] = min(span[0], offset), max(span[1], offset + nbytes)
                needed += nbytes
        for span in spans.values():  # aligned down: each row keeps its alignment in the copy
            span[0] -= span[0] % 64
        if sum(hi - lo for lo, hi in spans.values()) > 1.25 * needed + (1 << 20):
            return None
        return spans

    def _mirror(self, pieces: list[tuple[Round, list[tuple[int, int, int]]]], spans: dict[tuple[int, int], list[int]],
                mapped: list[list[torch.Tensor]], loader: LoadFn) -> None:
        """Copy each span (``_spans``) whole into the loader's memory (``loader.mirror(key, nbytes,
        device)``), a few large copies, and tell the loader where every parameter's rows lie there
        (``loader.defer``: (key, byte offset, bytes) per rank), to be put together when the loader
        applies them, on its own thread.

        Why: each call into torch on this thread (a copy, and even a view) gives Python's GIL up
        and must take it back, and the worker's request thread holds it between its own calls; a
        call per row (S per parameter) beside a worker busy in Python waits for a switch each (5 ms
        by default; the staging copy's receive shortens it, common/gil.py), which a few do not."""
        for (r, i), (lo, hi) in spans.items():
            loader.mirror((r, i), hi - lo, mapped[r][i].device).copy_(mapped[r][i][lo:hi])
        for rnd, where in pieces:
            loader.defer([((r, i), offset - spans[r, i][0], nbytes) for r, (i, offset, nbytes) in enumerate(where)],
                         rnd, self.sources)

    def close(self) -> None:
        for end in [self.buffer, *self.maps.values()]:
            if end is not None:
                end.close()
        self.maps = {}
        super().close()

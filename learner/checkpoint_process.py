"""The background checkpoint (``run.async_checkpoint``): the snapshot goes into shared host memory
reserved ahead of the save, and a child process, not the learner, turns it into files.

    save        DeepSpeed's own save (its collectives, file names, metadata) through ``ProcessWriter``,
                a checkpoint engine whose ``save`` only collects the state: it returns at once,
                no copy, no I/O (``LearnerEngine.save_checkpoint_async``)

    reserve     after the learner's first update (``ProcessWriter.reserve``, from a thread): a
                shared-memory region (memfd) the size of this rank's checkpoint state, its pages
                faulted in once and, with CUDA, page-locked (cudaHostRegister), so that a
                snapshot is a device-to-host DMA at the link's speed with no page faults and no
                allocation; kept for the run and reused by every save (it grows if a save needs more)
    snapshot    the writer thread copies every tensor of the state into the region (CUDA: on a
                stream of its own, after the update that produced it); storage sharing kept
    write       the child process (learner/checkpoint_child.py) maps the same region, rebuilds the
                state around it and writes each file durably, then the marker
                (learner/async_checkpoint.py: write_file, write_marker)
    next update waits for the snapshot only (``wait_snapshot`` before the optimizer step: the
                state is modified in place there and nowhere before)

Why a process: torch.save's pickling and its Python-level writes take the GIL in turns with the
training thread, which needs it for each of the tens of thousands of kernels it launches a step,
and the kernel's page-cache work for tens of GB is charged to the process that writes. In a
child, neither touches the learner.
What the learner's writer thread still runs under the GIL is one pickling pass over the state's
structure (tensors are replaced by their place in the region, no data is pickled).

Durability: files appear under their final names only once complete and fsynced, the marker
last; the coordinator writes the checkpoint's ``coordinator.json`` and ``latest`` only once every
rank's marker is there (coordinator/runtime/checkpoint.py); the child ends within half a second of
the learner (it watches its parent), so a killed run leaves the tag incomplete and a resume takes
the one before. Host memory: one copy of this rank's state, for the run.
"""
from __future__ import annotations

import io
import mmap
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle
from typing import Any, Callable, Optional

import torch

from stabledrl.learner.async_checkpoint import CheckpointWriteError, write_marker
from stabledrl.learner.checkpoint_child import RegionRef

ALIGN = 4096  # each storage starts on a page: the DMA and the child's views stay aligned
CHUNK = 64 << 20  # bytes per device-to-host copy when the region could not be page-locked


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def storages_nbytes(state: Any) -> int:
    """The bytes the region needs for ``state``: its distinct storages, each page-aligned."""
    seen: dict[tuple, int] = {}

    class Sizer(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Optional[str]:
            if isinstance(obj, torch.Tensor):
                s = obj.untyped_storage()
                seen[(s.device.type, s.device.index, s.data_ptr(), s.nbytes())] = s.nbytes()
                return "t"
            return None

    Sizer(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    return sum(_aligned(n) for n in seen.values())


class SharedArena:
    """A memfd of ``nbytes`` mapped here with its pages faulted in (MAP_POPULATE: the mmap call
    releases the GIL while the kernel does it) and, with ``pin``, page-locked for the GPU."""

    def __init__(self, nbytes: int, pin: bool) -> None:
        self.nbytes = max(ALIGN, _aligned(nbytes))
        self.fd = os.memfd_create("stabledrl-checkpoint", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.nbytes)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        self.map = mmap.mmap(self.fd, self.nbytes, flags=flags)
        self.tensor = torch.frombuffer(self.map, dtype=torch.uint8)
        self.pinned = False
        if pin:
            code = int(torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), self.nbytes, 1))  # portable
            self.pinned = code == 0  # else: the copies go through small page-locked buffers

    def close(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
            self.pinned = False
        del self.tensor
        try:
            self.map.close()
        except BufferError:  # a view is still alive somewhere: the mapping goes with it
            pass
        os.close(self.fd)


def _copy(source: torch.Tensor, dest: torch.Tensor, pinned: bool, stream: Any, bounce: list) -> None:
    """``dest`` (uint8, the region) := ``source`` (uint8, any device). A CUDA source into an
    unlocked region goes through two page-locked buffers in turn: the DMA of one chunk runs while
    the host copies the chunk before it."""
    if source.device.type != "cuda":
        dest.copy_(source)
        return
    if pinned:
        dest.copy_(source, non_blocking=True)
        return
    if not bounce:
        bounce.extend((torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True), torch.cuda.Event()) for _ in range(2))
    pending = None
    for i, start in enumerate(range(0, source.numel(), CHUNK)):
        n = min(CHUNK, source.numel() - start)
        buffer, done = bounce[i % 2]
        buffer[:n].copy_(source[start:start + n], non_blocking=True)
        done.record(stream)
        if pending is not None:
            _land(*pending)
        pending = (buffer, done, dest[start:start + n], n)
    if pending is not None:
        _land(*pending)


def _land(buffer: torch.Tensor, done: Any, dest: torch.Tensor, n: int) -> None:
    done.synchronize()
    dest.copy_(buffer[:n])


def plan(files: list[tuple[Any, str]]) -> tuple[list[tuple[bytes, str]], list[tuple[torch.Tensor, int]], int]:
    """Each file's state pickled with its tensors replaced by their place in the region, the
    (source storage as uint8, offset) copies to make, and the region's bytes in use. Tensors that
    share a storage share one place (views keep their offset and strides)."""
    places: dict[tuple, int] = {}
    copies: list[tuple[torch.Tensor, int]] = []
    end = 0

    class Planner(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            nonlocal end
            if isinstance(obj, (torch.UntypedStorage, torch.storage.TypedStorage)):
                raise TypeError("a checkpoint state holding a bare storage (not a tensor) is not supported")
            if not isinstance(obj, torch.Tensor):
                return None
            if obj.layout != torch.strided or type(obj) not in (torch.Tensor, torch.nn.Parameter):
                raise TypeError(f"a checkpoint tensor of layout {obj.layout} / type {type(obj).__name__}")
            s = obj.untyped_storage()
            key = (s.device.type, s.device.index, s.data_ptr(), s.nbytes())
            if key not in places:
                places[key] = end
                copies.append((torch.empty(0, dtype=torch.uint8, device=obj.device).set_(s), end))
                end += _aligned(s.nbytes())
            return RegionRef(places[key], s.nbytes(), obj.dtype, tuple(obj.size()), tuple(obj.stride()),
                        obj.storage_offset(), obj.requires_grad, isinstance(obj, torch.nn.Parameter))

    pickled = []
    for state, path in files:
        buf = io.BytesIO()
        Planner(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
        pickled.append((buf.getvalue(), path))
    return pickled, copies, end


class ProcessWriter:
    """A DeepSpeed checkpoint engine (create / save / load / commit) whose ``save`` only collects a
    save's files; ``start`` hands them to a thread that snapshots them into the reserved shared
    region and has the child process write them (module docstring). ``wait_snapshot`` and
    ``wait_written`` wait for the two phases; ``reserve`` sizes the region ahead of a save."""

    def __init__(self, zipfile_serialization: bool, on_written: Callable[[float], None] = lambda s: None,
                 pin: bool = True) -> None:
        self.name = "stabledrl.ProcessWriter"
        self.zipfile_serialization = zipfile_serialization
        self.on_written = on_written  # the save's seconds, once its files are durable (or it failed)
        self.files: list[tuple[Any, str]] = []  # collected since the last start
        self.snapshotted, self.written = threading.Event(), threading.Event()
        self.snapshotted.set()
        self.written.set()
        self.error: Optional[BaseException] = None  # the last save's, raised in the training thread by wait_*
        self.stream = None  # CUDA: the snapshot's copies run on a stream of their own
        self.pin = pin  # page-lock the region with CUDA (False: the copies go through the bounce buffers)
        self.arena: Optional[SharedArena] = None
        self.lock = threading.Lock()  # the region and the child: one user at a time (a reserve, a save)
        self.child: Optional[subprocess.Popen] = None
        self.conn: Optional[Connection] = None
        self.snapshot_s: Optional[float] = None  # the last snapshot's seconds
        self.reserved = threading.Event()
        self.reserved.set()

    # ---- DeepSpeed's checkpoint-engine interface ------------------------------------------------
    def create(self, info: Any) -> None:
        self.wait_written()

    def save(self, state_dict: Any, path: str) -> None:
        self.files.append((state_dict, path))

    def load(self, path: str, map_location: Any = None) -> Any:
        self.wait_written()
        return torch.load(path, map_location=map_location, weights_only=False)

    def commit(self, info: Any) -> bool:
        return True

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        return dp_rank == 0

    def is_decoupled(self) -> bool:
        return False

    def preserves_storage_sharing(self) -> bool:
        return True

    def cleanup(self) -> None:
        pass

    # ---- the two phases ---------------------------------------------------------------------------
    def start(self, marker: str, written: list[str] = ()) -> None:
        """Hand the collected files to a new thread (the last save's has finished), which has the
        child write ``marker`` last, listing them and the files ``written`` already."""
        files, self.files = self.files, []
        self.snapshotted.clear()
        self.written.clear()
        self.error = None
        after = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.stream = self.stream or torch.cuda.Stream()
            after = torch.cuda.current_stream().record_event()  # the update that produced the state
        threading.Thread(target=self._run, args=(files, after, marker, list(written)), name="checkpoint-writer",
                         daemon=True).start()

    def wait_snapshot(self) -> None:
        """Until the state is copied (the training thread calls this before it changes the state)."""
        self.snapshotted.wait()
        self._raise()

    def wait_written(self, timeout_s: Optional[float] = None) -> bool:
        """Until every file is durable (False if ``timeout_s`` passed first); raises a write's error."""
        if not self.written.wait(timeout_s):
            return False
        self._raise()
        return True

    def _raise(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            if isinstance(error, CheckpointWriteError):  # the disk's own words, one line, not a collective's
                raise CheckpointWriteError(error.errno, error.strerror, error.filename) from error
            raise RuntimeError(f"background checkpoint write failed: {type(error).__name__}: {error}") from error

    # ---- the region ----------------------------------------------------------------------------
    def reserve(self, nbytes: int) -> None:
        """Have the region hold ``nbytes`` (a thread of its own; returns at once)."""
        self.reserved.clear()
        device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        threading.Thread(target=self._reserve, args=(nbytes, device), name="checkpoint-reserve", daemon=True).start()

    def _reserve(self, nbytes: int, device: Optional[int] = None) -> None:
        try:
            if device is not None:  # the page-locking registers with this rank's device
                torch.cuda.set_device(device)
            with self.lock:
                self._ensure(nbytes)
        except Exception:  # noqa: BLE001 - the save tries again and reports its own error
            pass
        finally:
            self.reserved.set()

    def _ensure(self, nbytes: int) -> None:
        """(lock held) A region of at least ``nbytes``, mapped by the child."""
        fresh = self._start_child()
        if self.arena is not None and self.arena.nbytes >= nbytes:
            if fresh:  # the child before it ended: the new one maps the same region
                self._map()
            return
        if self.arena is not None and not fresh:
            self._ask(("unmap",))
            self.arena.close()
            self.arena = None
        pin = self.pin and torch.cuda.is_available() and torch.cuda.is_initialized()
        if self.arena is not None:
            self.arena.close()
        self.arena = SharedArena(nbytes, pin)
        self._map()

    def _map(self) -> None:
        self.conn.send(("map", self.arena.nbytes))
        send_handle(self.conn, self.arena.fd, self.child.pid)
        self._answer()

    def _start_child(self) -> bool:
        """A child process to write (True: started now)."""
        if self.child is not None and self.child.poll() is None:
            return False
        if self.conn is not None:
            self.conn.close()
        ours, theirs = socket.socketpair()
        # no GPU in the child: it only reads host memory (a CUDA context would take the learner's GPU memory)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "CUDA_VISIBLE_DEVICES": ""}
        command = [sys.executable, "-m", "stabledrl.learner.checkpoint_child", str(theirs.fileno()), str(os.getpid())]
        self.child = subprocess.Popen(command, pass_fds=[theirs.fileno()], env=env, close_fds=True)
        theirs.close()
        self.conn = Connection(ours.detach())
        return True

    def _ask(self, message: tuple) -> Any:
        self.conn.send(message)
        return self._answer()

    def _answer(self) -> Any:
        try:
            reply = self.conn.recv()
        except (EOFError, OSError) as e:
            code = self.child.poll() if self.child is not None else None
            raise RuntimeError(f"the checkpoint writer process ended (exit code {code})") from e
        if reply[0] == "error":
            raise _error(*reply[1:])
        return reply[1:]

    # ---- a save -------------------------------------------------------------------------------
    def _run(self, files: list[tuple[Any, str]], after: Any, marker: str, written: list[str]) -> None:
        t0 = time.perf_counter()
        paths = [path for _, path in files] + written
        try:
            try:
                self.reserved.wait()
                with self.lock:
                    if after is not None:
                        torch.cuda.set_device(self.stream.device)
                    pickled, copies, nbytes = plan(files)
                    del files
                    self._ensure(nbytes)
                    if after is not None:
                        self.stream.wait_event(after)
                    self._snapshot(copies)
                    del copies
                    self.snapshot_s = time.perf_counter() - t0
                    self.snapshotted.set()
                    self._ask(("write", pickled, marker, paths, self.zipfile_serialization))
            finally:
                self.snapshotted.set()
        except BaseException as e:  # noqa: BLE001 - raised in the training thread by wait_*
            self.error = e
            if not os.path.exists(marker):
                try:
                    write_marker(marker, [], error=e)
                except OSError:
                    pass
        finally:
            self.on_written(time.perf_counter() - t0)
            self.written.set()

    def _snapshot(self, copies: list[tuple[torch.Tensor, int]]) -> None:
        region, pinned, bounce = self.arena.tensor, self.arena.pinned, []
        if self.stream is None:
            for source, offset in copies:
                _copy(source, region[offset:offset + source.numel()], False, None, bounce)
            return
        with torch.cuda.stream(self.stream):
            for source, offset in copies:
                _copy(source, region[offset:offset + source.numel()], pinned, self.stream, bounce)
            self.stream.synchronize()

    def close(self) -> None:
        """Stop the child and release the region (after the last save is written)."""
        self.wait_written(timeout_s=None)
        with self.lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None
            if self.child is not None:
                self.child.wait(timeout=30)
                self.child = None
            if self.arena is not None:
                self.arena.close()
                self.arena = None


def _error(kind: str, code: Optional[int], strerror: Optional[str], filename: Optional[str], text: str
           ) -> BaseException:
    if kind == "CheckpointWriteError":
        return CheckpointWriteError(code, strerror, filename)
    return RuntimeError(f"checkpoint writer process: {text}")

"""Checkpoints off the training path: DeepSpeed writes through ``BackgroundWriter``, whose ``save``
only collects the state; a thread of its own copies it to host memory and then writes it. This is
``learner.checkpoint.writer: thread``; the default, ``process`` (learner/checkpoint_process.py),
copies into host memory reserved ahead and has a child process write the files.

    save_checkpoint_async   DeepSpeed's save (its collectives, file names, metadata) with this
                            writer: returns as soon as the state is collected, no copy, no I/O
    thread                  1. snapshot: every tensor copied to host memory (CUDA: on a stream of
                               its own, after the update that produced it), storage sharing kept
                            2. write each file as <name>.tmp, fsync, rename to <name>
                            3. the marker ``.written_rank<r>`` ({file: bytes}, or {"error": ...})
    next update             waits for step 1 only (``wait_snapshot`` before the optimizer step:
                            the state is modified in place there and nowhere before)

Training goes on during both steps: the forward and backward of the next step never touch the
saved tensors (parameters, fp32 master weights and Adam moments change only in the optimizer
step). A file appears under its final name only once it is complete and durable; the coordinator
writes the checkpoint's ``coordinator.json`` and ``latest`` only once the marker of every rank is
there (coordinator/runtime/checkpoint.py), so a run killed during the write resumes from the previous
complete checkpoint. Host memory: one copy of this rank's checkpoint while it is written.
"""
from __future__ import annotations

import errno
import json
import os
import threading
import time
from typing import Any, Callable, Optional

import torch

WriteFn = Callable[[Any, str, bool], None]


def write_file(state: Any, path: str, zipfile_serialization: bool, opener: Callable[..., Any] = open) -> None:
    """``state`` to ``path`` durably: a temporary name, fsync, then the rename (and the directory's fsync).
    A write the disk refuses (no space, a quota, permissions) raises that OSError, naming the file,
    whatever torch's zip writer made of it (``unexpected pos 6144 vs 6038``); ``opener`` opens the file."""
    _durably(path, lambda f: torch.save(state, f, _use_new_zipfile_serialization=zipfile_serialization), opener)


class CheckpointWriteError(OSError):
    """A checkpoint file the disk would not take; ``str`` is one line: the cause by name and the file."""

    def __str__(self) -> str:
        hint = {errno.ENOSPC: "free space there", errno.EDQUOT: "free space or raise the quota"}.get(
            self.errno, "make it writable by the job")
        return f"{self.strerror} ({self.filename}): {hint}"


class _Recorded:
    """The file torch writes to, keeping the first OSError its writes raised (torch's zip writer
    reports a failed write as a RuntimeError about stream positions, not as the disk's error)."""

    def __init__(self, f: Any) -> None:
        self.f, self.error = f, None

    def write(self, data: Any) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        try:
            self.f.flush()
        except OSError as e:
            self.error = self.error or e
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)


def disk_cause(directory: str, error: BaseException) -> BaseException:
    """``error`` of a write into ``directory`` that did not say why (torch's C++ writer): a
    CheckpointWriteError when the disk refuses a probe write there now (no space, a quota,
    permissions), else ``error`` itself."""
    if isinstance(error, OSError):
        return error if isinstance(error, CheckpointWriteError) else CheckpointWriteError(
            error.errno, error.strerror or str(error), error.filename or directory)
    probe = os.path.join(directory, f".probe-{os.getpid()}")
    try:
        _durably(probe, lambda f: f.write(b"\0" * (1 << 20)))
        os.unlink(probe)
    except CheckpointWriteError as e:
        return CheckpointWriteError(e.errno, e.strerror, directory)
    except OSError:
        pass
    return error


def marker_name(rank: int) -> str:
    """The file a rank writes once all its files of a checkpoint are durable."""
    return f".written_rank{rank}"


def write_marker(path: str, files: list[str], error: Optional[BaseException] = None) -> None:
    """{file name: bytes} of the files written, or {"error": ...} when the write failed."""
    content = ({"error": str(error) if isinstance(error, CheckpointWriteError) else f"{type(error).__name__}: {error}"}
               if error is not None
               else {"files": {os.path.basename(f): os.path.getsize(f) for f in files}})
    _durably(path, lambda f: f.write(json.dumps(content).encode()))


def _durably(path: str, write: Callable[[Any], None], opener: Callable[..., Any] = open) -> None:
    tmp = f"{path}.tmp"
    try:
        with opener(tmp, "wb") as raw:
            f = _Recorded(raw)
            try:
                write(f)
                f.flush()
                os.fsync(raw.fileno())
            except Exception as e:
                cause = f.error or (e if isinstance(e, OSError) else None)
                if cause is None:
                    raise
                raise CheckpointWriteError(cause.errno, cause.strerror or str(cause), path) from e
    except BaseException as e:
        if os.path.exists(tmp):  # no half-written file stays behind to be taken for part of the tag
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if isinstance(e, OSError) and not isinstance(e, CheckpointWriteError):  # the open itself (EACCES, EROFS)
            raise CheckpointWriteError(e.errno, e.strerror or str(e), path) from e
        raise
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HostBounce:
    """Copies a device storage into pageable host memory through a small page-locked buffer, in
    chunks: the device-to-host DMA runs at the link's speed into the locked buffer, then the host
    copies it on. A plain copy into pageable memory goes through the driver's own small staging
    and ran at ~1.5 GB/s on an H100 host for a 55 GB ZeRO state (the learner's next optimizer step
    waited ~26 s for it); the locked buffer is allocated once per writer (``chunk_bytes``), not per
    save. Without CUDA the buffer is ordinary memory and the chunks take the same path."""

    def __init__(self, chunk_bytes: int = 256 << 20) -> None:
        self.chunk_bytes = chunk_bytes
        self.buffer: Optional[torch.Tensor] = None

    def copy(self, source: torch.Tensor, host: torch.Tensor, stream: Optional["torch.cuda.Stream"] = None) -> None:
        """``host`` (uint8, host memory) := ``source`` (uint8, same length, any device)."""
        cuda = source.device.type == "cuda"
        if self.buffer is None or (cuda and not self.buffer.is_pinned()):
            self.buffer = torch.empty(self.chunk_bytes, dtype=torch.uint8, pin_memory=cuda)
        for start in range(0, source.numel(), self.chunk_bytes):
            n = min(self.chunk_bytes, source.numel() - start)
            self.buffer[:n].copy_(source[start:start + n], non_blocking=cuda)
            if cuda:  # the DMA has landed before the host reads the buffer
                (stream or torch.cuda.current_stream()).synchronize()
            host[start:start + n].copy_(self.buffer[:n])


def snapshot(state: Any, stream: Optional["torch.cuda.Stream"] = None, bounce: Optional[HostBounce] = None) -> Any:
    """A copy of ``state`` (nested dicts / lists / tuples) with every tensor in host memory; tensors
    that share a storage share one copy (views keep their offset and strides), other objects are
    kept as they are. CUDA copies run on ``stream``, through ``bounce`` (a fresh one if None)."""
    copies: dict[tuple, torch.UntypedStorage] = {}
    bounce = bounce or HostBounce()

    def copy(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = (storage.device.type, storage.device.index, storage.data_ptr(), storage.nbytes())
        if key not in copies:
            host = torch.empty(storage.nbytes(), dtype=torch.uint8)
            bounce.copy(torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage), host, stream)
            copies[key] = host.untyped_storage()
        out = torch.empty(0, dtype=t.dtype)
        return out.set_(copies[key], t.storage_offset(), t.size(), t.stride()).requires_grad_(t.requires_grad)

    def walk(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return copy(x.detach())
        if isinstance(x, dict):
            out = x.copy()  # keeps OrderedDict / defaultdict
            for k, v in x.items():
                out[k] = walk(v)
            return out
        if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
            return type(x)(walk(v) for v in x)
        return x

    if stream is None:
        return walk(state)
    with torch.cuda.stream(stream):
        out = walk(state)
        stream.synchronize()
    return out


class BackgroundWriter:
    """A DeepSpeed checkpoint engine (create / save / load / commit) that defers every file of a
    save to a background thread (module docstring). ``start`` launches the thread for the files
    collected since the last save; ``wait_snapshot`` and ``wait_written`` wait for its two phases."""

    def __init__(self, zipfile_serialization: bool, on_written: Callable[[float], None] = lambda s: None,
                 write: Optional[WriteFn] = None) -> None:
        self.name = "stabledrl.BackgroundWriter"
        self.zipfile_serialization = zipfile_serialization
        self.on_written = on_written
        self.write = write or write_file
        self.files: list[tuple[Any, str]] = []
        self.snapshotted, self.written = threading.Event(), threading.Event()
        self.snapshotted.set()
        self.written.set()
        self.error: Optional[BaseException] = None
        self.stream = None
        self.bounce = HostBounce()
        self.snapshot_s: Optional[float] = None  # the last save's copy to host memory, seconds

    # ---- DeepSpeed's checkpoint-engine interface --------------------------------------------
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

    # ---- the background thread --------------------------------------------------------------
    def start(self, marker: str, written: list[str] = ()) -> None:
        """Hand the collected files to a new thread (the last save's thread has finished), which
        writes ``marker`` last, listing them and the files ``written`` already."""
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

    def _run(self, files: list[tuple[Any, str]], after: Any, marker: str, written: list[str]) -> None:
        t0 = time.perf_counter()
        paths = [path for _, path in files] + written
        try:
            try:
                if after is not None:
                    self.stream.wait_event(after)
                copies = [(snapshot(state, self.stream, self.bounce), path) for state, path in files]
                self.snapshot_s = time.perf_counter() - t0
            finally:
                self.snapshotted.set()
            del files
            for state, path in copies:
                self.write(state, path, self.zipfile_serialization)
            write_marker(marker, paths)
        except BaseException as e:  # noqa: BLE001 - raised in the training thread by wait_*, and in the marker
            self.error = e
            try:
                write_marker(marker, [], error=e)
            except OSError:
                pass
        finally:
            self.snapshotted.set()
            self.on_written(time.perf_counter() - t0)
            self.written.set()

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

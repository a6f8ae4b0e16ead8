"""What every background checkpoint file shares: it appears under its final name only once it is
complete and durable (a temporary name, fsync, the rename, the directory's fsync), a write the disk
refuses names its cause and its file in one line, and each rank leaves a marker once all its files
of a save are durable (``{file: bytes}``, or ``{"error": ...}``). The writer itself is
learner/checkpoint_process.py (a child process writes from shared host memory).
"""
from __future__ import annotations

import errno
import json
import os
from typing import Any, Callable, Optional

import torch

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

"""The child process of a background checkpoint (learner/checkpoint_process.py starts it as
``python -m stabledrl.learner.checkpoint_child``): it maps the shared region the learner rank
copied its state into, rebuilds the state around it and writes each file durably, then the rank's
marker (learner/async_checkpoint.py). It ends within half a second of the learner, mid-write or
not, so a checkpoint whose learner died is never completed.
"""
from __future__ import annotations

import gc
import io
import mmap
import os
import pickle
import sys
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from typing import Any, Optional

import torch

from stabledrl.learner.async_checkpoint import CheckpointWriteError, write_file, write_marker


class RegionRef:
    """A tensor in the region, as the child rebuilds it."""

    __slots__ = ("offset", "nbytes", "dtype", "size", "stride", "storage_offset", "requires_grad", "parameter")

    def __init__(self, *values: Any) -> None:
        for name, value in zip(self.__slots__, values):
            setattr(self, name, value)

    def __reduce__(self):
        return RegionRef, tuple(getattr(self, name) for name in self.__slots__)


def rebuild(pickled: bytes, region: Any) -> Any:
    """The state of ``plan`` with its tensors as views of ``region`` (the child's mapping)."""
    bases: dict[tuple[int, int], torch.Tensor] = {}  # an empty storage takes no room: its offset is the next one's

    class Loader(pickle.Unpickler):
        def persistent_load(self, ref: RegionRef) -> torch.Tensor:
            key = (ref.offset, ref.nbytes)
            if key not in bases:
                bases[key] = (torch.frombuffer(region, dtype=torch.uint8, count=ref.nbytes, offset=ref.offset)
                              if ref.nbytes else torch.empty(0, dtype=torch.uint8))
            t = torch.empty(0, dtype=ref.dtype).set_(bases[key].untyped_storage(), ref.storage_offset, ref.size,
                                                     ref.stride)
            return torch.nn.Parameter(t, ref.requires_grad) if ref.parameter else t.requires_grad_(ref.requires_grad)

    return Loader(io.BytesIO(pickled)).load()


def _die_with_parent(parent: int, every_s: float = 0.5) -> None:
    """End this process within ``every_s`` of the learner's end, mid-write or not: a checkpoint
    whose learner died is never completed by its writer."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def child_main(fd: int, parent: int) -> None:
    _die_with_parent(parent)
    torch.set_num_threads(1)
    try:  # the classes a DeepSpeed state unpickles, imported now rather than during the first write
        import deepspeed  # noqa: F401
    except Exception:  # noqa: BLE001 - a state without them needs none
        pass
    conn = Connection(fd)
    region: Optional[mmap.mmap] = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the learner closed its end or died
        try:
            if message[0] == "map":
                handle = recv_handle(conn)
                region = mmap.mmap(handle, message[1], flags=mmap.MAP_SHARED)
                os.close(handle)
                conn.send(("ok",))
            elif message[0] == "unmap":
                gc.collect()  # the last write's views of the region
                if region is not None:
                    region.close()
                region = None
                conn.send(("ok",))
            elif message[0] == "write":
                _, pickled, marker, paths, zipfile_serialization = message
                try:
                    for data, path in pickled:
                        write_file(rebuild(data, region), path, zipfile_serialization)
                    write_marker(marker, paths)
                except BaseException as e:  # noqa: BLE001 - the marker says so, then the learner
                    try:
                        write_marker(marker, [], error=e)
                    except OSError:
                        pass
                    raise
                conn.send(("ok",))
        except BaseException as e:  # noqa: BLE001 - sent to the learner's writer thread
            ce = e if isinstance(e, CheckpointWriteError) else None
            conn.send(("error", type(e).__name__, getattr(ce, "errno", None), getattr(ce, "strerror", None),
                       getattr(ce, "filename", None), f"{type(e).__name__}: {e}"))


if __name__ == "__main__":
    child_main(int(sys.argv[1]), int(sys.argv[2]))

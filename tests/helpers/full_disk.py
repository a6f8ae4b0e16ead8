"""A file on a disk that fills up, for the tests of checkpoint writes the disk refuses: the fault is
injected where the bytes are written, as a full disk (a quota, a permission) refuses them part-way.
tests/unit/coordinator/test_disk_faults.py opens its files through it; tests/e2e/test_async_checkpoint.py
puts it in the checkpoint writer's child process (a ``sitecustomize`` imports it from this folder)."""
from __future__ import annotations

import errno
import os
from typing import IO, Any


class FillingFile:
    """The open file ``f`` with room for ``room`` bytes: a write past them raises OSError(code)."""

    def __init__(self, f: IO[Any], room: int, code: int = errno.ENOSPC) -> None:
        self.f, self.room, self.code, self.taken = f, room, code, 0

    def write(self, data):
        if self.taken + len(data) > self.room:
            raise OSError(self.code, os.strerror(self.code))
        self.taken += len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

"""Checkpoint files whose unpickling creates a marker file: what an attacker would put in a checkpoint.

``write(path, variant, marker)`` writes one of ``VARIANTS``; loading it with plain ``pickle`` or
``torch.load(weights_only=False)`` creates ``marker`` (``armed`` checks that it really does, so a
test that finds no marker proves the loader refused, not that the payload was inert).
"""
from __future__ import annotations

import builtins
import os
import pickle
import subprocess
from pathlib import Path

import torch

VARIANTS = ("zip_os_system", "zip_exec", "zip_subprocess", "legacy_torch", "raw_pickle")


class _Call:
    """Unpickles as ``fn(*args)``."""

    def __init__(self, fn, *args) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def payload(variant: str, marker: Path) -> object:
    if variant == "zip_exec":
        call = _Call(builtins.exec, f"open({str(marker)!r}, 'w').close()")
    elif variant == "zip_subprocess":
        call = _Call(subprocess.call, ["touch", str(marker)])
    else:
        call = _Call(os.system, f"touch {marker}")
    return {"module": {"w": torch.ones(2)}, "buffer_names": call}


def write(path: Path, variant: str, marker: Path) -> Path:
    data = payload(variant, marker)
    if variant == "legacy_torch":
        torch.save(data, path, _use_new_zipfile_serialization=False)
    elif variant == "raw_pickle":
        path.write_bytes(pickle.dumps(data))
    else:
        torch.save(data, path)
    return path


def armed(path: Path, marker: Path) -> bool:
    """Whether unpickling ``path`` without restrictions creates ``marker`` (then removed again)."""
    try:
        torch.load(path, weights_only=False)
    except Exception:
        pickle.loads(path.read_bytes())
    made = marker.exists()
    marker.unlink(missing_ok=True)
    return made

"""Reading checkpoint files without running code they carry: the one way this project opens them.

A ``.pt`` / ``.bin`` file is a pickle, and unpickling can call any function it names. Every path
that reads one (``train --resume`` on the coordinator and on each learner rank, ``stabledrl eval
--checkpoint``, the warm-start cache, ``model.path`` / ``--model`` directories) comes through here:

- ``verify_tag(path)``: a learner checkpoint tag as the job wrote it: its manifest
  (``coordinator.json``, written last) lists every file with its size; a file missing, of another
  size, or present but not listed is refused; every torch file is scanned and refused if its
  pickle names anything beyond tensors, containers and DeepSpeed's few classes.
- ``load_torch(file)``: ``torch.load(weights_only=True)``, after the same scan (so the refusal
  names the file and what it would have run).
- ``restricted_unpickling()``: around code we do not own that calls ``torch.load(weights_only=False)``
  (DeepSpeed's ``load_checkpoint``, its ZeRO consolidation): torch is forced to its restricted
  unpickler for the duration, with only DeepSpeed's classes allowed. A file swapped after the scan
  fails to load; it does not run.
- ``check_weight_files(directory)``: the pickle-based weight files of a model directory
  (``pytorch_model*.bin`` and every file an ``*.index.json`` names; safetensors need no check:
  they hold no code).
- ``read_latest(directory)``: the tag ``latest`` names, refused unless it is a plain name of a
  directory inside ``directory`` (``../../outside/step6`` is refused).

A tag holds regular files only: a symlink (to a file or as the tag itself), a subdirectory or a
dot-file other than a rank's ``.written_rank<r>`` marker is refused, naming it, rather than
ignored: nothing the job did not write is read, and nothing outside the checkpoint stands in for
a file of it.

Every refusal is a ``CheckpointError`` whose message names the file and the reason.
"""
from __future__ import annotations

import importlib
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

FORMAT = 2
STATE_FILE = "coordinator.json"
# what DeepSpeed 0.19's ZeRO optimizer state pickles besides tensors and containers
DEEPSPEED_GLOBALS = frozenset({
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
})
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle")


class CheckpointError(ValueError):
    """A checkpoint or model file that cannot be used; the message names the file or field and why."""


def check_pickle(file: Path, allowed: Iterable[str] = ()) -> None:
    """Refuse ``file`` unless its pickle names only tensors, containers and the ``allowed`` globals."""
    import torch

    try:
        found = set(torch.serialization.get_unsafe_globals_in_checkpoint(str(file)))
    except Exception as e:  # not a zip-format torch file (a raw or legacy pickle), or corrupt
        raise CheckpointError(f"{file} is not a readable torch checkpoint ({type(e).__name__}: {e}); "
                              "refused (only torch's zip format can be checked before loading)") from None
    foreign = sorted(found - set(allowed))
    if foreign:
        raise CheckpointError(f"{file} would unpickle {', '.join(foreign)}, which no checkpoint of this job holds: "
                              "refused (loading it could run code)")


def load_torch(file: Path, allowed: Iterable[str] = (), **kwargs: Any) -> Any:
    """``torch.load(file, weights_only=True)`` after ``check_pickle``; ``allowed`` names the few
    classes beyond tensors and containers that the file may hold."""
    import torch

    allowed = frozenset(allowed)
    check_pickle(file, allowed)
    with torch.serialization.safe_globals(_resolve(allowed)):
        return torch.load(file, weights_only=True, **kwargs)


@contextmanager
def restricted_unpickling(allowed: Iterable[str] = DEEPSPEED_GLOBALS) -> Iterator[None]:
    """Every ``torch.load`` inside runs torch's restricted unpickler, whatever its caller asked for
    (TORCH_FORCE_WEIGHTS_ONLY_LOAD), with only ``allowed`` classes beyond tensors and containers."""
    import torch

    previous = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        with torch.serialization.safe_globals(_resolve(frozenset(allowed))):
            yield
    finally:
        if previous is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = previous


MARKER = re.compile(r"^\.written_rank\d+$")  # learner/async_checkpoint.marker_name


def read_latest(directory: Path) -> str:
    """The tag named by ``directory/latest``: a plain name of a real directory inside ``directory``;
    CheckpointError naming the file otherwise (a ``latest`` pointing elsewhere would make the run
    resume from files outside its checkpoint directory)."""
    latest = Path(directory) / "latest"
    if latest.is_symlink():
        raise CheckpointError(f"{latest} is a symlink (to {os.readlink(latest)}), not the file a job writes: refused "
                              "(write the tag's name, e.g. step6, into a regular file 'latest')")
    if not latest.is_file():
        raise CheckpointError(f"{latest} is {'a directory' if latest.is_dir() else 'missing'}, not a regular file: "
                              "refused")
    tag = latest.read_text().strip()
    if not tag or Path(tag).name != tag or tag in (".", "..") or tag.startswith("."):
        raise CheckpointError(f"{latest} names {tag!r}, which is not a tag directory of {directory}: refused "
                              "(a checkpoint's 'latest' holds one name like step6; write that name into it)")
    return tag


def clear_incomplete(path: Path) -> None:
    """Remove tag ``path`` if a save of it began and never finished (no STATE_FILE: a failed or
    cut-off write), so that saving it again starts from an empty directory; a complete tag stays."""
    import shutil

    path = Path(path)
    if path.is_dir() and not path.is_symlink() and not (path / STATE_FILE).exists():
        shutil.rmtree(path)


def check_tag_dir(path: Path) -> None:
    """``path`` is a real directory (not a symlink) whose entries are regular files (module docstring)."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        raise CheckpointError(f"{path} is {'a symlink' if path.is_symlink() else 'not a directory'}: a checkpoint tag "
                              "is a directory the job wrote; refused (copy the files in, not a link)")
    for entry in sorted(path.iterdir()):
        if entry.is_symlink():
            raise CheckpointError(f"{entry} is a symlink (to {os.readlink(entry)}): a checkpoint holds only the files "
                                  "the job wrote; refused (replace it with the file itself)")
        if not entry.is_file():
            raise CheckpointError(f"{entry} is not a regular file: refused (a checkpoint tag holds files only)")
        if entry.name.startswith(".") and not MARKER.match(entry.name):
            raise CheckpointError(f"{entry} is not a file the job writes: refused (remove it if you added it)")


def verify_tag(path: Path) -> dict[str, Any]:
    """The manifest of checkpoint tag ``path`` once every file of the tag has been checked
    (module docstring); CheckpointError naming the file otherwise."""
    path = Path(path)
    check_tag_dir(path)
    state = read_state(path)
    check_files(path, state["files"])
    for name in sorted(state["files"]):
        if name.endswith(PICKLE_SUFFIXES):
            check_pickle(path / name, DEEPSPEED_GLOBALS)
    return state


def read_state(path: Path) -> dict[str, Any]:
    """The tag's ``coordinator.json`` (format, step, files, config, parameter shapes)."""
    file = path / STATE_FILE
    if not file.is_file():
        raise CheckpointError(f"{path} has no {STATE_FILE}: not a complete checkpoint of a stabledrl job "
                              "(its save did not finish, or another program wrote it)")
    try:
        state = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file} cannot be read ({e})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else None
        raise CheckpointError(f"{path} was written by checkpoint format {found}, this code reads {FORMAT}")
    missing = [k for k in ("step", "files", "config", "parameter_shapes") if k not in state]
    if missing:
        raise CheckpointError(f"{file} lacks {', '.join(missing)}")
    files = state["files"]
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in files.items()):
        raise CheckpointError(f"{file}: 'files' must map file names to sizes")
    if any(Path(name).name != name or name in ("", ".", "..") for name in files):
        raise CheckpointError(f"{file}: 'files' may name only files of the tag itself")
    return state


def check_files(path: Path, sizes: dict[str, int]) -> None:
    """Every listed file present with its size; no file the manifest does not list."""
    for name, size in sorted(sizes.items()):
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file} is missing (the checkpoint's manifest lists it)")
        if file.stat().st_size != size:
            raise CheckpointError(f"{file} has {file.stat().st_size} bytes, the manifest says {size}: truncated or "
                                  "partly copied")
    extra = sorted(p.name for p in path.iterdir()
                   if not p.name.startswith(".") and p.name != STATE_FILE and p.name not in sizes)
    if extra:
        raise CheckpointError(f"{path / extra[0]} is not in the checkpoint's manifest ({STATE_FILE}): refused "
                              f"(files added after the save: {', '.join(extra)})")


def check_weight_files(directory: Path) -> None:
    """Refuse a model directory whose pickle-based weight files (``pytorch_model*.bin``, and any
    file an ``*.index.json`` names, whatever its name: what the loaders read when there are no
    safetensors) would unpickle anything but tensors, or whose index names a file outside it."""
    directory = Path(directory)
    files = set(directory.glob("pytorch_model*.bin"))
    for index in sorted(directory.glob("*.index.json")):
        try:
            names = set((json.loads(index.read_text()).get("weight_map") or {}).values())
        except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:
            raise CheckpointError(f"{index} cannot be read as a weight index ({e})") from None
        for name in sorted(map(str, names)):
            file = directory / name
            if Path(name).name != name or file.is_symlink():
                raise CheckpointError(f"{index} names {name!r}, not a file of {directory}: refused")
            if not name.endswith(".safetensors"):
                files.add(file)
    for file in sorted(files):
        if file.is_file():
            check_pickle(file)


def _resolve(names: frozenset[str]) -> list[Any]:
    """The classes behind dotted names (only those importable here: DeepSpeed is optional)."""
    out = []
    for name in sorted(names):
        module, _, attr = name.rpartition(".")
        try:
            out.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):
            continue
    return out

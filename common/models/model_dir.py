"""Where ``model.path`` points, and reading a checkpoint's JSON files with errors that name them.

``model.path`` is a local directory, or a Hugging Face hub id (``GSAI-ML/LLaDA-8B-Instruct``)
resolved through ``huggingface_hub`` from the local hub cache (``HF_HUB_CACHE``, else
``$HF_HOME/hub``; the layout ``models--org--name/snapshots/<commit>/`` with ``refs/<branch>``).
Nothing is downloaded at run time, online or not (``HF_HUB_OFFLINE`` changes nothing here): a hub
id missing from the cache is refused, before any actor starts, with the command that fetches it.
A local directory of that name wins over the hub id.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Optional, Union

from stabledrl.common.models.families import CheckpointError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def looks_like_hub_id(text: str) -> bool:
    """``org/name`` with the characters hub ids allow (a relative path of two parts looks alike)."""
    return bool(_HUB_ID.match(text)) and ".." not in text


def hub_cache_dir() -> Path:
    """The hub cache the environment names now (HF_HUB_CACHE, else HF_HOME/hub, else the default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def fetch_command(repo_id: str, revision: Optional[str] = None) -> str:
    """The command that puts ``repo_id`` into the hub cache, with the CLI the installed
    huggingface_hub ships (``hf`` in recent releases, ``huggingface-cli`` before)."""
    from importlib import metadata

    try:
        scripts = {
            ep.name for ep in metadata.distribution("huggingface_hub").entry_points if ep.group == "console_scripts"
        }
    except metadata.PackageNotFoundError:
        scripts = set()
    tool = "hf" if "hf" in scripts else "huggingface-cli"
    return f"{tool} download {repo_id}" + (f" --revision {revision}" if revision else "")


def resolve_model_dir(path: Union[str, Path], revision: Optional[str] = None) -> Path:
    """The local directory of ``model.path``: the directory itself, or the cached snapshot of a hub id."""
    text = str(path)
    local = Path(text).expanduser()
    if local.is_dir():
        return local
    if not looks_like_hub_id(text):
        raise CheckpointError(f"model.path {text} is not a directory")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    try:
        snapshot = snapshot_download(text, revision=revision, cache_dir=str(cache), local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError) as e:
        at = f" at revision {revision!r}" if revision else ""
        raise CheckpointError(
            f"model.path {text!r} is not a local directory, and as a hub id it is not in the local Hugging Face cache "
            f"{cache}{at} (nothing is downloaded at run time). Fetch it first, with the same HF_HOME / HF_HUB_CACHE as "
            f"the job: {fetch_command(text, revision)}"
        ) from e
    return Path(snapshot)


def read_json_file(file: Path, what: str = "checkpoint") -> dict[str, Any]:
    """A JSON object from ``file``; a corrupt, truncated or non-object file is a CheckpointError naming it."""
    try:
        value = json.loads(Path(file).read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{file} is not UTF-8 text (byte {e.start}); the {what} file is corrupt") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(
            f"{file} is not valid JSON ({e.msg}: line {e.lineno}, column {e.colno}); the {what} file is corrupt or "
            "truncated: copy or download it again"
        ) from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{file} holds a JSON {type(value).__name__}, not an object; the {what} file is corrupt")
    return value

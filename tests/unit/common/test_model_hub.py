"""``model.path`` as a hub id, resolved from a hand-populated local Hugging Face cache (nothing is
downloaded; a missing model is refused before any actor starts, with the command that fetches it),
and checkpoint files that are corrupt or truncated named in the error."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

from stabledrl.common.config.base import ConfigError, apply_overrides, load_yaml, validate
from stabledrl.common.config.job import JobConfig
from stabledrl.common.models.job_check import check_sampler_layout
from stabledrl.common.config.model import ModelConfig
from stabledrl.common.models import CheckpointError, build_tiny_policy, export_hf, load_policy, save_original_checkpoint
from stabledrl.common.models.model_dir import fetch_command, resolve_model_dir
from stabledrl.common.tokenizer import build_char_tokenizer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def populate_hub_cache(cache: Path, repo_id: str, source: Path, commit: str = COMMIT, branch: str = "main") -> Path:
    """The hub cache layout: blobs/<sha256> holds each file, snapshots/<commit>/<name> links to it,
    refs/<branch> names the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for file in source.iterdir():
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / branch).write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf-home" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = save_original_checkpoint(build_tiny_policy("llada", seed=3), build_char_tokenizer(), tmp_path / "source")
    populate_hub_cache(cache, "acme/tiny-llada", source)
    return cache


def logits(policy) -> torch.Tensor:
    ids = torch.tensor([[5, 6, 7, 2, 2]])
    return policy(ids).logits


def test_a_hub_id_loads_from_the_local_cache(hub_cache, tmp_path):
    from_hub, _ = load_policy(ModelConfig(path="acme/tiny-llada"))
    from_dir, _ = load_policy(ModelConfig(path=tmp_path / "source"))
    assert torch.equal(logits(from_hub), logits(from_dir))
    assert resolve_model_dir("acme/tiny-llada") == hub_cache / "models--acme--tiny-llada" / "snapshots" / COMMIT
    assert resolve_model_dir("acme/tiny-llada", revision=COMMIT) == resolve_model_dir("acme/tiny-llada")


def test_a_missing_hub_model_is_refused_with_the_fetch_command(hub_cache):
    with pytest.raises(CheckpointError) as e:
        load_policy(ModelConfig(path="acme/absent-model"))
    command = fetch_command("acme/absent-model")
    assert command in {"hf download acme/absent-model", "huggingface-cli download acme/absent-model"}
    assert command in str(e.value) and str(hub_cache) in str(e.value)
    with pytest.raises(CheckpointError, match="at revision 'v2'.*download acme/tiny-llada --revision v2"):
        resolve_model_dir("acme/tiny-llada", revision="v2")
    with pytest.raises(CheckpointError, match="is not a directory"):
        resolve_model_dir("./no/such/dir/here")


def test_train_refuses_a_missing_hub_model_before_any_actor_starts(hub_cache, tmp_path, capsys):
    from stabledrl.cli.main import main

    code = main(["train", "--config", "deploy/configs/quickstart.yaml",
                 "model.preset=null", "model.preset_shape=null", "model.path=acme/absent-model"])
    assert code == 2 and fetch_command("acme/absent-model") in capsys.readouterr().err
    # a dry run needs no model: it names the missing one and how to fetch it
    code = main(["train", "--config", "deploy/configs/quickstart.yaml", "--dry-run",
                 "model.preset=null", "model.preset_shape=null", "model.path=acme/absent-model"])
    assert code == 0 and f"MISSING, fetch: {fetch_command('acme/absent-model')}" in capsys.readouterr().out
    code = main(["train", "--config", "deploy/configs/quickstart.yaml", "--dry-run",
                     "model.preset=null", "model.preset_shape=null", "model.path=acme/tiny-llada"])
    assert code == 0


def test_a_local_directory_wins_over_the_hub_id(hub_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = save_original_checkpoint(
        build_tiny_policy("llada", seed=4), build_char_tokenizer(), tmp_path / "acme" / "tiny-llada"
    )
    assert resolve_model_dir("acme/tiny-llada") == Path("acme/tiny-llada")
    mine, _ = load_policy(ModelConfig(path="acme/tiny-llada"))
    theirs, _ = load_policy(ModelConfig(path=local))
    assert torch.equal(logits(mine), logits(theirs))


def job_for(path) -> JobConfig:
    raw = apply_overrides(load_yaml("deploy/configs/quickstart.yaml"), [f"model={{path: {path}}}"])
    return validate(JobConfig, raw)


@pytest.mark.parametrize("layout", ["original", "exported"])
def test_corrupt_config_and_truncated_weights_are_named(tmp_path, layout):
    policy, tok = build_tiny_policy("llada"), build_char_tokenizer()
    directory = tmp_path / layout
    (save_original_checkpoint if layout == "original" else export_hf)(policy, tok, directory)
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=rf"{weights} cannot be read as safetensors .*truncated or corrupt"):
        load_policy(ModelConfig(path=directory))
    weights.write_bytes(data)
    config = directory / "config.json"
    config.write_text(config.read_text()[:40])
    with pytest.raises(
        CheckpointError, match=rf"{config} is not valid JSON \(.*: line [0-9]+, column [0-9]+\).*corrupt or truncated"
    ):
        load_policy(ModelConfig(path=directory))
    with pytest.raises(ConfigError, match=rf"model.path: {config} is not valid JSON"):
        check_sampler_layout(job_for(directory))

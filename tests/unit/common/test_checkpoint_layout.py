"""A checkpoint tag is read only as the job wrote it: a symlink standing in for a file or for the
whole tag, a ``latest`` that names a path out of the checkpoint directory, a dot-file added to a
tag, and a weight file an index names under another name are refused, naming the file."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stabledrl.common.trust.checkpoint_files import CheckpointError, check_weight_files, read_latest, verify_tag
from stabledrl.coordinator.runtime.checkpoint import verify
from malicious_pickles import write
from test_checkpoint_loading import SHARD, job_tag


@pytest.fixture()
def marker(tmp_path):
    path = tmp_path / "PWNED"
    yield path
    assert not path.exists(), "the malicious pickle ran"


def test_a_state_file_replaced_by_a_symlink_to_a_copy_outside_is_refused(tmp_path):
    tag = job_tag(tmp_path / "run")
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(tag / SHARD, outside / SHARD)
    (tag / SHARD).unlink()
    (tag / SHARD).symlink_to(outside / SHARD)  # same size, same bytes: only the link gives it away
    with pytest.raises(CheckpointError, match=rf"{tag / SHARD} is a symlink \(to {outside / SHARD}\)"):
        verify_tag(tag)


def test_a_tag_directory_replaced_by_a_symlink_is_refused(tmp_path):
    tag = job_tag(tmp_path / "run", step=6)
    copy = tmp_path / "outside" / "step6copy"
    shutil.copytree(tag, copy)
    shutil.rmtree(tag)
    tag.symlink_to(copy, target_is_directory=True)
    with pytest.raises(CheckpointError, match=rf"{tag} is a symlink"):
        verify(tag.parent, {"run": {"seed": 0}})


def test_latest_naming_a_path_out_of_the_directory_is_refused(tmp_path):
    tag = job_tag(tmp_path / "run", step=6)
    shutil.copytree(tag, tmp_path / "outside" / "step6copy")
    (tag.parent / "latest").write_text("../../../outside/step6copy")
    with pytest.raises(CheckpointError, match=r"latest names '../../../outside/step6copy', which is not a tag"):
        verify(tag.parent, {"run": {"seed": 0}})
    with pytest.raises(CheckpointError, match="not a tag directory"):
        read_latest(tag.parent)
    for target in (tmp_path / "elsewhere", tmp_path / "a_file"):  # dangling, then to a file naming the tag
        (tmp_path / "a_file").write_text("step6")
        (tag.parent / "latest").unlink()
        (tag.parent / "latest").symlink_to(target)
        with pytest.raises(CheckpointError, match=f"latest is a symlink \\(to {target}\\)"):
            read_latest(tag.parent)
        with pytest.raises(CheckpointError, match="latest is a symlink"):  # not "no 'latest' file"
            verify(tag.parent, {"run": {"seed": 0}})


@pytest.mark.parametrize("name", [".hidden.pt", ".coordinator.json.tmp", ".written_rank0x"])
def test_a_dot_file_added_to_a_tag_is_refused(tmp_path, name):
    tag = job_tag(tmp_path / "run")
    (tag / name).write_bytes(b"x")
    with pytest.raises(CheckpointError, match=rf"{tag / name} is not a file the job writes"):
        verify_tag(tag)


def test_the_markers_of_a_background_save_are_the_dot_files_a_tag_may_hold(tmp_path):
    tag = job_tag(tmp_path / "run")
    (tag / ".written_rank0").write_text(json.dumps({"files": {}}))
    (tag / ".written_rank12").write_text(json.dumps({"files": {}}))
    assert verify_tag(tag)["step"] == 1


def test_a_subdirectory_in_a_tag_is_refused(tmp_path):
    tag = job_tag(tmp_path / "run")
    (tag / "extra").mkdir()
    with pytest.raises(CheckpointError, match=rf"{tag / 'extra'} is not a regular file"):
        verify_tag(tag)


def test_a_weight_file_an_index_names_is_scanned_whatever_its_name(tmp_path, marker):
    directory = tmp_path / "model"
    directory.mkdir()
    file = write(directory / "weights.pt", "zip_os_system", marker)
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"w": "weights.pt"}}))
    with pytest.raises(CheckpointError, match=rf"{file} would unpickle posix.system"):
        check_weight_files(directory)
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"w": "../weights.pt"}}))
    with pytest.raises(CheckpointError, match=r"names '../weights.pt', not a file of"):
        check_weight_files(directory)


def test_the_model_loader_scans_an_indexed_weight_file_before_loading(tmp_path, marker):
    from stabledrl.common.config.model import ModelConfig
    from stabledrl.common.models import load_policy
    from test_checkpoint_loading import model_dir

    directory = model_dir(tmp_path / "model")
    for f in Path(directory).glob("*.safetensors"):
        f.unlink()
    file = write(directory / "weights.pt", "zip_os_system", marker)
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"w": "weights.pt"}}))
    with pytest.raises(CheckpointError, match=rf"{file} would unpickle posix.system"):
        load_policy(ModelConfig(path=directory))


def test_episodes_json_with_an_extra_field_is_refused_naming_it(tmp_path):
    from stabledrl.common.trust.checkpoint_files import STATE_FILE
    from stabledrl.coordinator.runtime.checkpoint import write_state
    from tests.unit.coordinator.test_checkpoint_verify import CONFIG, make_checkpoint

    tag = make_checkpoint(tmp_path)
    records = json.loads((tag / "episodes.json").read_text())
    records[0]["samples"][0]["payload"] = "__import__('os').system('id')"
    (tag / "episodes.json").write_text(json.dumps(records))
    write_state(tag, json.loads((tag / STATE_FILE).read_text()))  # the sizes match again
    with pytest.raises(CheckpointError, match=rf"{tag / 'episodes.json'} does not hold the episodes this job writes "
                                              r"\(TypeError: .*payload"):
        verify(tmp_path, CONFIG)


def test_warm_start_weights_swapped_with_their_hashes_rewritten_are_refused(tmp_path, monkeypatch, marker):
    import yaml

    from stabledrl.common.config.base import validate
    from stabledrl.common.config.job import JobConfig
    from stabledrl.common.trust.seal import seal_json
    from stabledrl.recipes.warmstart import MANIFEST, file_hashes, warm_start, warmstart_dir
    from test_checkpoint_loading import eval_config, model_dir

    monkeypatch.setenv("STABLEDRL_KEY_FILE", str(tmp_path / "key"))
    data = yaml.safe_load(eval_config(tmp_path).read_text())
    cfg = validate(JobConfig, {**data, "warmstart": {"steps": 1, "cache_dir": str(tmp_path / "cache")}})
    cached = model_dir(warmstart_dir(cfg))
    (cached / MANIFEST).write_text(json.dumps(seal_json({"files": file_hashes(cached)})))
    assert warm_start(cfg) == cached
    weights = next(cached.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-8] + b"\1" * 8)  # other weights
    write(cached / "pytorch_model.bin", "zip_os_system", marker)
    manifest = json.loads((cached / MANIFEST).read_text())
    manifest["files"] = file_hashes(cached)  # the attacker rewrites every hash; the seal they cannot
    (cached / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=rf"{cached / MANIFEST} does not match its seal"):
        warm_start(cfg)
    del manifest["seal"]
    (cached / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="does not match its seal"):
        warm_start(cfg)

"""Every path that reads a checkpoint refuses a file whose pickle would run code, naming the file,
and never runs it: ``train --resume`` (the coordinator's check and each learner rank's load),
``stabledrl eval --checkpoint``, ``eval --model`` / ``model.path`` directories, the original-format
reader, the warm-start cache, and DeepSpeed's own readers under the restricted unpickler.

Each payload creates a marker file when unpickled (``malicious_pickles.armed`` shows it does); the
tests assert the marker is never created."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from stabledrl.common.trust.checkpoint_files import (
    FORMAT, STATE_FILE, CheckpointError, restricted_unpickling, verify_tag,
)
from stabledrl.coordinator.runtime.checkpoint import verify, write_state
from malicious_pickles import VARIANTS, armed, write

ROOT = Path(__file__).resolve().parents[3]
SHARD = "zero_pp_rank_0_mp_rank_00_model_states.pt"


@pytest.fixture()
def marker(tmp_path):
    path = tmp_path / "PWNED"
    yield path
    assert not path.exists(), "the malicious pickle ran"


def job_tag(root: Path, step: int = 1) -> Path:
    """A checkpoint tag as the job writes it (DeepSpeed-like shards, an RNG file, the manifest)."""
    tag = root / "checkpoints" / f"step{step}"
    tag.mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(2, 3)}}, tag / SHARD)
    torch.save({"torch": torch.get_rng_state()}, tag / "rng_rank0.pt")
    write_state(
        tag, {"format": FORMAT, "step": step, "config": {"run": {"seed": 0}}, "parameter_shapes": {"w": [2, 3]}}
    )
    (tag.parent / "latest").write_text(tag.name)
    return tag


def tamper(tag: Path, variant: str, marker: Path, name: str = SHARD, fix_manifest: bool = True) -> Path:
    """Replace one file with a malicious one; ``fix_manifest``: the attacker also rewrote the sizes."""
    file = write(tag / name, variant, marker)
    assert armed(file, marker), "the payload must really run when unpickled"
    if fix_manifest:
        write_state(tag, json.loads((tag / STATE_FILE).read_text()))
    return file


@pytest.mark.parametrize("variant", VARIANTS)
def test_resume_refuses_a_malicious_shard_naming_it(tmp_path, marker, variant):
    tag = job_tag(tmp_path)
    file = tamper(tag, variant, marker)
    with pytest.raises(CheckpointError, match=rf"{file}.*(would unpickle|not a readable torch checkpoint)"):
        verify(tag.parent, {"run": {"seed": 0}})


def test_a_file_added_after_the_save_or_a_resized_one_is_refused(tmp_path, marker):
    tag = job_tag(tmp_path)
    extra = write(tag / "zero_pp_rank_9_mp_rank_00_optim_states.pt", "zip_os_system", marker)
    with pytest.raises(CheckpointError, match=rf"{extra} is not in the checkpoint's manifest"):
        verify_tag(tag)
    extra.unlink()
    tamper(tag, "zip_os_system", marker, fix_manifest=False)
    with pytest.raises(CheckpointError, match=rf"{tag / SHARD} has \d+ bytes, the manifest says \d+"):
        verify_tag(tag)


def test_deepspeeds_own_reader_cannot_run_a_pickle_under_the_restricted_unpickler(tmp_path, marker):
    """The second layer: a file swapped after the check fails to load instead of running."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    tag = job_tag(tmp_path)
    tamper(tag, "zip_os_system", marker)
    with restricted_unpickling(), pytest.raises(Exception, match="Weights only load failed"):
        get_fp32_state_dict_from_zero_checkpoint(str(tag.parent), tag=tag.name)


def eval_config(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"preset": "tiny-llada"},
                "task": {"name": "arithmetic", "held_out": 2, "source": {"kind": "generated", "n": 20}},
                "sampler": {"gen_length": 4, "block_length": 4, "steps": 4},
                "estimator": {"name": "block_random", "block_length": 4},
                "loss": {"name": "stabledrl"},
                "eval": {"num_prompts": 2},
            }
        )
    )
    return path


@pytest.mark.parametrize("variant", ["zip_os_system", "legacy_torch"])
def test_eval_checkpoint_refuses_a_malicious_shard_with_exit_2(tmp_path, marker, capsys, variant):
    from stabledrl.cli.main import main

    tag = job_tag(tmp_path)
    file = tamper(tag, variant, marker)
    assert main(["eval", "--config", str(eval_config(tmp_path)), "--checkpoint", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(file) in err and "refused" in err


def model_dir(directory: Path) -> Path:
    """The tiny LLaDA preset exported as a transformers directory (what ``--model`` takes)."""
    from stabledrl.common.config.model import ModelConfig
    from stabledrl.common.models import export_hf, load_policy

    policy, tokenizer = load_policy(ModelConfig(preset="tiny-llada"))
    return Path(export_hf(policy, tokenizer, directory))


def test_a_model_directory_with_a_malicious_bin_is_refused(tmp_path, marker, capsys):
    from stabledrl.common.config.model import ModelConfig
    from stabledrl.common.models import load_policy
    from stabledrl.common.models.loading import read_state_dict
    from stabledrl.cli.main import main

    directory = model_dir(tmp_path / "model")
    for f in directory.glob("*.safetensors"):
        f.unlink()
    file = write(directory / "pytorch_model.bin", "zip_os_system", marker)
    with pytest.raises(CheckpointError, match=rf"{file} would unpickle posix.system"):
        load_policy(ModelConfig(path=directory))
    with pytest.raises(CheckpointError, match=rf"{file} would unpickle posix.system"):
        read_state_dict(directory)  # the original-format reader
    assert main(["eval", "--config", str(eval_config(tmp_path)), "--model", str(directory)]) == 2
    assert str(file) in capsys.readouterr().err


def test_the_warm_start_cache_is_checked_against_its_hashes(tmp_path, marker):
    from stabledrl.common.config.base import validate
    from stabledrl.common.config.job import JobConfig
    from stabledrl.common.trust.seal import seal_json
    from stabledrl.recipes.warmstart import MANIFEST, file_hashes, warm_start, warmstart_dir

    data = yaml.safe_load(eval_config(tmp_path).read_text())
    cfg = validate(JobConfig, {**data, "warmstart": {"steps": 1, "cache_dir": str(tmp_path / "cache")}})
    cached = model_dir(warmstart_dir(cfg))  # as if an earlier job had built it
    (cached / MANIFEST).write_text(json.dumps(seal_json({"files": file_hashes(cached)})))
    assert warm_start(cfg) == cached  # intact: reused
    weights = next(cached.glob("*.safetensors"))
    original = weights.read_bytes()
    weights.write_bytes(original[:-8] + b"\0" * 8)  # same size, other bytes
    with pytest.raises(CheckpointError, match=rf"{weights} differs from the warm start's manifest"):
        warm_start(cfg)
    weights.write_bytes(original)
    file = write(cached / "pytorch_model.bin", "zip_os_system", marker)
    with pytest.raises(CheckpointError, match=rf"{file} is not in the warm start's manifest"):
        warm_start(cfg)


LEARNER_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from stabledrl.common.trust.checkpoint_files import FORMAT, CheckpointError
    from stabledrl.common.config.learner import LearnerConfig
    from stabledrl.common.models.presets import build_tiny_policy
    from stabledrl.coordinator.runtime.checkpoint import write_state
    from stabledrl.learner.engine import LearnerEngine
    from stabledrl.learner.group import reserve_port, init_learner_group
    from malicious_pickles import write

    directory, marker = Path(sys.argv[1]), Path(sys.argv[2])
    init_learner_group("127.0.0.1", reserve_port(), 0, 1, backend="gloo", timeout_s=60)
    engine = LearnerEngine(build_tiny_policy("llada", seed=0), LearnerConfig.model_validate({{}}))
    tag = engine.save_checkpoint(directory, {{"step": 1}}, "step1")
    write_state(directory / tag, {{"format": FORMAT, "step": 1, "config": {{}}, "parameter_shapes": {{}}}})
    out = {{"clean": engine.load_checkpoint(directory, tag)}}
    for name in sorted(p.name for p in (directory / tag).glob("*.pt")):
        original = (directory / tag / name).read_bytes()
        write(directory / tag / name, "zip_os_system", marker)
        write_state(directory / tag, json.loads((directory / tag / "coordinator.json").read_text()))
        try:
            engine.load_checkpoint(directory, tag)
            out[name] = "loaded"
        except CheckpointError as e:
            out[name] = str(e)
        (directory / tag / name).write_bytes(original)
        write_state(directory / tag, json.loads((directory / tag / "coordinator.json").read_text()))
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.e2e  # a DeepSpeed engine in a process of its own: not in make test-fast
def test_each_learner_rank_refuses_a_malicious_file_of_its_tag(tmp_path, marker):
    """LearnerEngine.load_checkpoint (what ``train --resume`` runs on every rank) on a real
    DeepSpeed checkpoint: each file in turn replaced by a payload, with the manifest rewritten."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    script = LEARNER_SCRIPT.format(tests=str(Path(__file__).resolve().parents[2] / "helpers"))
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ckpt"), str(marker)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[0].removeprefix("RESULT "))
    assert out.pop("clean") == {"step": 1}  # a sound checkpoint loads under the restricted unpickler
    assert set(out) == {SHARD, "zero_pp_rank_0_mp_rank_00_optim_states.pt", "rng_rank0.pt"}  # ZeRO-3
    for name, message in out.items():
        assert name in message and "would unpickle posix.system" in message, (name, message)

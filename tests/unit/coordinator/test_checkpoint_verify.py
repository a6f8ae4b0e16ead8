"""A checkpoint is checked before a resume trusts it: each way it can be broken or foreign is
refused with the reason; buffered episodes round-trip exactly without pickle; a resumed run's
metrics.jsonl loses the steps it will recompute."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from stabledrl.common.types import Group, Sample
from stabledrl.coordinator.runtime import checkpoint
from stabledrl.common.metrics import restore_metrics
from stabledrl.coordinator.runtime.checkpoint import CheckpointError, check_shapes, verify, write_state
from stabledrl.coordinator.runtime.episode_io import load_episodes, save_episodes
from stabledrl.common.types import Episode
from job_lines import job_lines

CONFIG = {
    "model": {"preset": "tiny-llada", "gradient_checkpointing": False},
    "loss": {"name": "stabledrl", "clip_max": 5.0},
    "algorithm": {"group_size": 4, "micro_batch_size": 8},
    "learner": {"num_ranks": 2, "dist_timeout_s": 60},
    "run": {"seed": 7, "steps": 4},
}


class Payload:  # not a tensor, a container or a DeepSpeed class: unpickling it runs this module's code
    pass


def episode(uid: int, version: int = 1) -> Episode:
    samples = [Sample(sample_id=f"p{uid}/{i}", prompt_id=f"p{uid}", index=i, prompt_ids=torch.arange(3 + uid),
                      completion_ids=torch.arange(8)[i : i + 4], completion_length=3 - i % 2, reward=0.1 * i + 1 / 3,
                      reward_parts={"format": 0.5}, policy_version=version, behaviour_logp=-1.2345678901234567 * i,
                      behaviour_token_logp=torch.randn(4) if i else None, estimator="block_random",
                      mask_seed=2**62 + i, decode_step=torch.tensor([3, 1, 0, 2]), answer="12")
               for i in range(2)]
    return Episode(uid=uid, prompt_id=f"p{uid}", group=Group(f"p{uid}", samples), worker=1, stats={"generate_s": 0.5})


def make_checkpoint(root: Path, step: int = 2, config: dict = CONFIG) -> Path:
    tag = root / f"step{step}"
    tag.mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(2, 3)}, "param_shapes": [{"w": torch.Size([2, 3])}]},
               tag / "mp_rank_00_model_states.pt")
    torch.save({"python": (3, tuple(range(5)), None), "torch": torch.get_rng_state()}, tag / "rng_rank0.pt")
    save_episodes(tag, [episode(5), episode(6, version=2)])
    write_state(tag, {"format": checkpoint.FORMAT, "step": step, "config": config, "parameter_shapes": {"w": [2, 3]}})
    (root / "latest").write_text(f"step{step}")
    return tag


def test_a_sound_checkpoint_verifies_and_its_episodes_round_trip_bit_for_bit(tmp_path):
    make_checkpoint(tmp_path)
    resume = verify(tmp_path, CONFIG)
    assert resume.tag == "step2" and resume.state["step"] == 2
    for got, want in zip(resume.episodes, [episode(5), episode(6, version=2)]):
        assert (got.uid, got.prompt_id, got.worker, got.stats) == (want.uid, want.prompt_id, want.worker, want.stats)
        for a, b in zip(got.group.samples, want.group.samples):
            for name in ("sample_id", "index", "completion_length", "reward", "reward_parts", "policy_version",
                         "behaviour_logp", "estimator", "mask_seed", "answer"):
                assert getattr(a, name) == getattr(b, name), name
            for name in ("prompt_ids", "completion_ids", "decode_step"):
                assert torch.equal(getattr(a, name), getattr(b, name)), name
            assert (a.behaviour_token_logp is None) == (b.behaviour_token_logp is None)
    # fields that may change on resume do not refuse it
    verify(tmp_path, {**CONFIG, "run": {"seed": 7, "steps": 40}, "algorithm": {"group_size": 4, "micro_batch_size": 2},
                      "learner": {"num_ranks": 2, "dist_timeout_s": 5}})


def test_a_truncated_file_is_refused_naming_it(tmp_path):
    tag = make_checkpoint(tmp_path)
    data = (tag / "mp_rank_00_model_states.pt").read_bytes()
    (tag / "mp_rank_00_model_states.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(
        CheckpointError, match=r"mp_rank_00_model_states.pt has \d+ bytes, the manifest says \d+: truncated"
    ):
        verify(tmp_path, CONFIG)


def test_a_corrupt_file_of_the_right_size_is_refused(tmp_path):
    tag = make_checkpoint(tmp_path)
    size = (tag / "rng_rank0.pt").stat().st_size
    (tag / "rng_rank0.pt").write_bytes(b"\0" * size)
    with pytest.raises(CheckpointError, match=r"rng_rank0.pt is not a readable torch checkpoint"):
        verify(tmp_path, CONFIG)


def test_a_file_that_would_unpickle_foreign_code_is_refused(tmp_path):
    tag = make_checkpoint(tmp_path)
    torch.save({"state": Payload()}, tag / "mp_rank_00_model_states.pt")
    write_state(tag, json.loads((tag / checkpoint.STATE_FILE).read_text()))  # sizes match again
    with pytest.raises(CheckpointError, match=r"would unpickle .*Payload.*refused \(loading it could run code\)"):
        verify(tmp_path, CONFIG)


def test_a_checkpoint_of_another_config_names_the_fields(tmp_path):
    make_checkpoint(tmp_path)
    other = {
        **CONFIG,
        "loss": {"name": "stabledrl", "clip_max": 3.0},
        "learner": {"num_ranks": 4, "dist_timeout_s": 60},
    }
    with pytest.raises(CheckpointError) as info:
        verify(tmp_path, other)
    message = str(info.value)
    assert "loss.clip_max: checkpoint 5.0, config 3.0" in message
    assert "dist_timeout_s" not in message
    # the learner's shape may change: the ranks re-shard the checkpoint (learner/reshard.py)
    assert "num_ranks" not in message
    reshaped = {**CONFIG, "learner": {"num_ranks": 4, "dist_timeout_s": 60, "deepspeed": {"zero_stage": 2}}}
    assert verify(tmp_path, reshaped).tag


def test_a_checkpoint_of_another_model_shape_is_refused():
    check_shapes({"w": [2, 3], "b": [3]}, {"w": [2, 3], "b": [3]}, Path("ck"))
    with pytest.raises(CheckpointError, match=r"another model \(2 parameters differ\), e.g. w: checkpoint \[2, 3\], "
                                              r"model \[4, 3\]; b: only in the checkpoint"):
        check_shapes({"w": [2, 3], "b": [3]}, {"w": [4, 3]}, Path("ck"))


def test_an_unfinished_save_falls_back_to_the_previous_complete_tag(tmp_path):
    make_checkpoint(tmp_path, step=2)
    (tmp_path / "step4").mkdir()  # DeepSpeed wrote 'latest', the job died before coordinator.json
    (tmp_path / "latest").write_text("step4")
    with job_lines() as lines:
        assert verify(tmp_path, CONFIG).tag == "step2"
    assert "step4 is incomplete" in lines[0]


def test_no_checkpoint_and_a_foreign_format_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        verify(tmp_path, CONFIG)
    tag = make_checkpoint(tmp_path)
    state = json.loads((tag / checkpoint.STATE_FILE).read_text())
    write_state(tag, {**state, "format": 1})
    with pytest.raises(CheckpointError, match="checkpoint format 1"):
        verify(tmp_path, CONFIG)
    (tag / checkpoint.STATE_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot be read"):
        verify(tmp_path, CONFIG)


def test_missing_episode_tensors_are_refused(tmp_path):
    save_episodes(tmp_path, [episode(1)])
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "episodes.safetensors"))
    del tensors["1/0/prompt_ids"]
    save_file(tensors, str(tmp_path / "episodes.safetensors"))
    with pytest.raises(ValueError, match="episode 1 sample 0 has no prompt_ids"):
        load_episodes(tmp_path)


def test_resume_drops_the_metrics_it_will_recompute(tmp_path):
    lines = [{"step": 0, "data/rows_read": 8}, {"step": 1, "train/loss": 0.5}, {"step": 2, "train/loss": 0.4},
             {"step": 3, "train/loss": 0.3}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 4, "trai')  # torn last line
    assert restore_metrics(tmp_path, 2) == 2
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1, 2]
    assert len((tmp_path / "metrics.before_resume.jsonl").read_text().splitlines()) == 5
    assert restore_metrics(tmp_path / "nowhere", 2) is None


def test_a_checkpoint_directory_without_write_permission_is_named_as_such(tmp_path):
    """What a job that may not write its checkpoints is told (torch.save would say 'Parent directory
    ... does not exist'). Root ignores permission bits, so as root the check runs as nobody."""
    import os
    import tempfile

    from stabledrl.coordinator.runtime.checkpoint import ensure_writable

    ensure_writable(tmp_path / "checkpoints" / "step1")  # creates it
    assert (tmp_path / "checkpoints" / "step1").is_dir() and not list((tmp_path / "checkpoints" / "step1").iterdir())
    locked = Path(tempfile.mkdtemp(prefix="stabledrl-test-"))
    locked.chmod(0o555 if os.geteuid() else 0o755)  # not writable by the user below
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            ensure_writable(locked / "checkpoints" / "step1")
            os.write(write, b"written")
        except CheckpointError as e:
            os.write(write, str(e).encode())
        finally:
            os._exit(0)
    os.close(write)
    message = os.read(read, 4096).decode()
    os.waitpid(pid, 0)
    locked.chmod(0o755)
    locked.rmdir()
    assert re.search(
        rf"cannot write the checkpoint {locked}/checkpoints/step1: Permission denied \({locked} is owned "
        rf"by uid \d+, mode d[rwx-]{{9}}; this job runs as uid \d+\): run.output_dir must be writable",
        message,
    ), message

"""Bad input to `stabledrl train`: every kind of mistake exits 2 before Ray (or any actor) starts,
with a message that names the field and, where there is a finite set, the allowed values."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import stabledrl.cli.main as cli
from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.job import check_resources, load_job_config

JOB = {
    "model": {"preset": "tiny-llada"},
    "task": {"name": "arithmetic", "held_out": 10},
    "sampler": {"gen_length": 4, "block_length": 4, "steps": 4},
    "estimator": {"name": "block_random", "block_length": 4},
    "loss": {"name": "stabledrl"},
    "algorithm": {"group_size": 4, "groups_per_step": 2},
    "learner": {"num_ranks": 2},
    "cluster": {"learner": {"num_cpus": 0.5}, "rollout": {"num_cpus": 0.5}},
}


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(JOB))
    return path


@pytest.fixture
def no_training(monkeypatch):
    def refuse(cfg):
        raise AssertionError("train_job must not be reached")

    monkeypatch.setattr(cli, "train_job", refuse)


# (kind of mistake, overrides, every fragment the message must hold)
MISTAKES = [
    ("unknown key", ["rollout.num_worker=3"], ["rollout.num_worker", "valid keys", "num_workers"]),
    ("unknown top-level section", ["learners.num_ranks=2"], ["learners", "valid keys", "learner"]),
    ("wrong type", ["algorithm.group_size=four"], ["algorithm.group_size", "valid integer", "'four'"]),
    ("out of range", ["algorithm.max_staleness=-1"], ["algorithm.max_staleness", "greater than or equal to 0"]),
    ("unknown loss", ["loss.name=ppo"], ["loss", "'ppo'", "'stabledrl'", "'grpo'", "'spg'"]),
    (
        "unknown estimator",
        ["estimator.name=monte_carlo"],
        ["estimator", "'monte_carlo'", "'block_random'", "'elbo_mc'"],
    ),
    ("unknown task", ["task.name=chess"], ["task", "'chess'", "'arithmetic'", "'gsm8k'"]),
    ("literal out of its set", ["algorithm.advantage_scale=max"],
     ["algorithm.advantage_scale", "'std', 'population_std' or 'none'"]),
    ("gen_length not divisible by block_length", ["sampler.gen_length=6"], ["block_length=4 must divide gen_length=6"]),
    (
        "spg_sandwich masks other blocks than the sampler's",
        ["estimator.name=spg_sandwich", "estimator.block_length=2"],
        ["estimator.block_length (2)", "sampler.block_length (4)"],
    ),
    (
        "groups per step vs learner ranks",
        ["algorithm.groups_per_step=1"],
        ["algorithm.groups_per_step (1)", "learner.num_ranks (2)"],
    ),
    (
        "worker bounds",
        ["rollout.num_workers=3", "rollout.max_workers=2"],
        ["min_workers (1) <= num_workers (3) <= max_workers (2)"],
    ),
    ("autoscale without a bound", ["rollout.autoscale=true"], ["rollout.autoscale", "rollout.max_workers"]),
    (
        "token-level loss from a sequence estimator",
        ["loss.name=grpo", "loss.level=token"],
        ["loss.level", "mean_field"],
    ),
    ("NCCL push with CPU workers", ["weights.backend=nccl"], ["weights.backend 'nccl'", "cluster.rollout.num_gpus"]),
    ("job name with a slash", ["run.name=my/job"], ["run.name", "pattern"]),
    ("bad dotted override syntax", ["algorithm.group_size"], ["'algorithm.group_size'", "key.path=value"]),
    ("override into a value", ["algorithm.group_size.x=1"], ["'group_size' is a value, not a section"]),
    ("infinite lr (1e400 reads as inf)", ["learner.optimizer.lr=1e400"], ["learner.optimizer.lr", "finite number"]),
    ("NaN float", ["loss.clip_max=.nan"], ["clip_max", "finite number"]),
    ("infinite float", ["sampler.temperature=.inf"], ["sampler", "temperature", "finite number"]),
    ("absurd step count", ["run.steps=1.0e+30"], ["run.steps"]),
    ("compile on an eager cache", ["sampler.cache=dual", "sampler.compile=true"], ["compile", "cuda_graph=True"]),
    (
        "compile on block diffusion's eager sampler",
        ["model.preset=tiny-sdar", "sampler.block_length=null", "sampler.compile=true"],
        ["sampler.compile=True", "block-diffusion", "cuda_graph=True"],
    ),
    ("absurd group size", ["algorithm.group_size=100000"], ["algorithm.group_size", "less than or equal to 4096"]),
    (
        "alias bomb in an override",
        [
            "run.name=[&a [1,1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], "
            "&c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], "
            "&e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]]"
        ],
        ["run.name", "alias bomb"],
    ),
]


@pytest.mark.parametrize("kind, overrides, fragments", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_a_mistake_exits_2_naming_the_field_before_ray_starts(
    capsys, no_training, job_file, kind, overrides, fragments
):
    import ray

    assert cli.main(["train", "--config", str(job_file), *overrides]) == 2
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err, (kind, fragment, err)
    assert not ray.is_initialized()


def test_a_missing_config_file_and_a_resume_without_a_run_dir(capsys, no_training, tmp_path):
    assert cli.main(["train", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml does not exist" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(tmp_path / "no_run")]) == 2
    err = capsys.readouterr().err
    assert "no_run/config.yaml" in err and "pass --config" in err


def test_more_actors_than_the_cluster_offers_names_the_sizing_fields(job_file):
    cfg = load_job_config(job_file, ["rollout.num_workers=4"])
    check_resources(cfg, {"CPU": 3.0})  # 2 x 0.5 + 4 x 0.5 = 3 CPUs: fits exactly
    with pytest.raises(ConfigError) as info:
        check_resources(load_job_config(job_file, ["rollout.num_workers=5"]), {"CPU": 3.0}, "a local Ray instance")
    message = str(info.value)
    for fragment in ("learner.num_ranks (2)", "rollout.num_workers (5)", "cluster.rollout.num_cpus (0.5)",
                     "= 3.5 CPUs", "a local Ray instance has 3"):
        assert fragment in message, message
    with pytest.raises(ConfigError, match=r"= 2 GPUs, but the Ray cluster has 1"):
        check_resources(load_job_config(job_file, ["cluster.learner.num_gpus=1"]), {"CPU": 8.0, "GPU": 1.0})


def test_resume_reads_the_run_dirs_config_and_points_at_its_checkpoints(tmp_path, job_file, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(job_file.read_text())
    seen = {}
    monkeypatch.setattr(cli, "train_job", lambda cfg: seen.setdefault("cfg", cfg) and 0)
    assert cli.main(["train", "--resume", str(run_dir), "run.steps=9"]) == 0
    cfg = seen["cfg"]
    assert cfg.run.output_dir == run_dir and cfg.run.resume_from == run_dir / "checkpoints" and cfg.run.steps == 9


def test_a_yaml_alias_bomb_fails_fast_naming_the_file(capsys, no_training, tmp_path):
    import time

    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]  # 9^10 values expanded
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    t0 = time.monotonic()
    assert cli.main(["train", "--dry-run", "--config", str(path)]) == 2
    assert time.monotonic() - t0 < 5
    err = capsys.readouterr().err
    assert str(path) in err and "alias bomb" in err
    path.write_text("x: " + "a" * (2 << 20))
    assert cli.main(["train", "--dry-run", "--config", str(path)]) == 2
    assert "at most" in capsys.readouterr().err

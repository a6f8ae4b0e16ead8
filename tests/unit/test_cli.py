"""`stabledrl train`: --dry-run prints the resolved config; a bad config exits 2 naming the field
before Ray (or any actor) starts."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import cli.main as cli

QUICKSTART = Path(__file__).resolve().parents[2] / "deploy" / "configs" / "quickstart.yaml"


@pytest.fixture
def no_training(monkeypatch):
    def refuse(cfg):
        raise AssertionError("train_job must not be reached")

    monkeypatch.setattr(cli, "train_job", refuse)


def test_dry_run_prints_the_resolved_config_with_overrides(capsys, no_training):
    assert cli.main(["train", "--config", str(QUICKSTART), "--dry-run", "algorithm.max_staleness=3", "run.steps=7"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["algorithm"]["max_staleness"] == 3 and resolved["run"]["steps"] == 7
    assert resolved["loss"] == {"name": "stabledrl", "clip_max": 5.0, "clip_min": None}  # defaults filled in
    assert resolved["weights"]["backend"] == "auto"


@pytest.mark.parametrize("override, field", [
    ("algorithm.group_size=1", "algorithm.group_size"),
    ("estimator.masks=sometimes", "estimator.elbo_mc.masks"),
    ("sampler.steps=5", "sampler.steps"),
])
def test_a_bad_config_exits_2_naming_the_field_before_ray_starts(capsys, no_training, override, field):
    import ray

    assert cli.main(["train", "--config", str(QUICKSTART), override]) == 2
    assert field in capsys.readouterr().err
    assert not ray.is_initialized()


def test_python_dash_m_cli_is_the_same_command():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "cli", "train", "--config", str(QUICKSTART), "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["model"]["preset"] == "tiny-llada"


def test_without_config_the_quickstart_is_the_default(capsys, no_training):
    assert cli.main(["train", "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == yaml.safe_load(
        yaml.safe_dump(cli.load_job_config(QUICKSTART).model_dump(mode="json")))

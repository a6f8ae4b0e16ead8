"""`stabledrl train`: --dry-run prints the resolved config; a bad config exits 2 naming the field
before Ray (or any actor) starts."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import stabledrl.cli.main as cli

QUICKSTART = Path(__file__).resolve().parents[3] / "deploy" / "configs" / "quickstart.yaml"


@pytest.fixture
def no_training(monkeypatch):
    def refuse(cfg):
        raise AssertionError("train_job must not be reached")

    monkeypatch.setattr(cli, "train_job", refuse)


def test_dry_run_prints_the_resolved_config_with_overrides(capsys, no_training):
    assert (
        cli.main(["train", "--config", str(QUICKSTART), "--dry-run", "algorithm.max_staleness=3", "run.steps=7"]) == 0
    )
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["algorithm"]["max_staleness"] == 3 and resolved["run"]["steps"] == 7
    assert resolved["loss"] == {"name": "stabledrl", "clip_max": 5.0, "clip_min": None}  # defaults filled in
    assert resolved["weights"]["backend"] == "auto"


@pytest.mark.parametrize("override, field", [
    ("algorithm.group_size=1", "algorithm.group_size"),
    ("estimator.masks=sometimes", "estimator.masks"),
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

    out = subprocess.run([sys.executable, "-m", "stabledrl", "train", "--config", str(QUICKSTART), "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["model"]["preset"] == "tiny-llada"


def test_without_config_the_quickstart_is_the_default(capsys, no_training):
    assert cli.main(["train", "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == yaml.safe_load(
        yaml.safe_dump(cli.load_job_config(QUICKSTART).model_dump(mode="json")))


def test_scale_sends_the_token_without_ray_auth_mode_set_by_hand(tmp_path, monkeypatch):
    from stabledrl.cli.scale import auth_env

    token = tmp_path / "token"
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token
    assert auth_env({}) == {}  # no token anywhere: Ray's own default
    assert auth_env({"RAY_AUTH_TOKEN": "abc"}) == {"RAY_AUTH_MODE": "token"}
    token.write_text("abc")
    assert auth_env({"RAY_AUTH_TOKEN_PATH": str(token)}) == {"RAY_AUTH_MODE": "token"}
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("abc")  # where `ray start` or a local cluster keeps it
    assert auth_env({}) == {"RAY_AUTH_MODE": "token"}
    assert auth_env({"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "abc"}) == {}  # a choice stays


def test_a_reward_that_cannot_run_is_refused_at_dry_run(tmp_path, monkeypatch, capsys, no_training):
    """A relative reward path is the working directory's and is checked at --dry-run; a
    reward whose import hangs stops there too, naming the file, before any actor starts."""
    import ray

    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--config", str(QUICKSTART), "--dry-run", "task.reward.custom=rp/ok.py:score"]) == 2
    assert f"task.reward.custom: {tmp_path}/rp/ok.py does not exist" in capsys.readouterr().err
    (tmp_path / "rp").mkdir()
    (tmp_path / "rp" / "ok.py").write_text("def score(completion, row):\n    return 1.0\n")
    assert cli.main(["train", "--config", str(QUICKSTART), "--dry-run", "task.reward.custom=rp/ok.py:score"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["task"]["reward"]["custom"] == f"{tmp_path}/rp/ok.py:score"
    (tmp_path / "rp" / "hang.py").write_text("import time\ntime.sleep(600)\n")
    assert cli.main(["train", "--config", str(QUICKSTART), "task.reward.custom=rp/hang.py:score",
                     "task.reward.import_timeout_s=1"]) == 2
    assert f"importing custom reward {tmp_path}/rp/hang.py took longer than" in capsys.readouterr().err
    assert not ray.is_initialized()

"""What `stabledrl train` and `eval` tell a user before anything starts: a study config is for
`stabledrl study`, run.wandb_project needs wandb installed (the field and the command), and pass@k
under greedy decoding is pass@1."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import stabledrl.cli.main as cli
import stabledrl.evaluation.offline as offline

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "deploy" / "configs" / "quickstart.yaml"


@pytest.fixture
def no_training(monkeypatch):
    monkeypatch.setattr(cli, "train_job", lambda cfg: pytest.fail("train_job must not be reached"))


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_study_config_given_to_train_says_in_one_line_to_use_study(capsys, no_training, dry_run):
    study = ROOT / "deploy" / "configs" / "study_cpu.yaml"
    assert cli.main(["train", "--config", str(study), *dry_run]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"stabledrl: {study} is a study config (job, methods, seeds: several jobs): run it with " \
                  f"`stabledrl study --config {study}`"


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_wandb_project_without_wandb_fails_naming_the_field_and_the_install(capsys, monkeypatch, no_training,
                                                                             dry_run):
    import ray

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert cli.main(["train", "--config", str(QUICKSTART), *dry_run, "run.wandb_project=demo"]) == 2
    err = capsys.readouterr().err
    assert "run.wandb_project: 'demo' logs to Weights & Biases, but wandb is not installed" in err
    assert "pip install 'stabledrl[wandb]'" in err and not ray.is_initialized()
    monkeypatch.setattr(importlib.util, "find_spec", real)
    assert cli.main(["train", "--config", str(QUICKSTART), "--dry-run"]) == 0  # without the field: no check


@pytest.mark.parametrize("overrides, noted", [([], True), (["eval.temperature=1.0"], False)])
def test_eval_k_under_greedy_decoding_says_pass_at_k_is_pass_at_1(capsys, monkeypatch, tmp_path, overrides, noted):
    monkeypatch.setattr(offline, "eval_command", lambda cfg, **kw: {})
    assert cli.main(["eval", "--config", str(QUICKSTART), "--model", str(tmp_path), "--k", "4", *overrides]) == 0
    err = capsys.readouterr().err
    assert ("the 4 samples of a prompt are one completion and pass@k equals pass@1" in err) is noted, err


def test_a_reward_of_neither_form_stops_train_in_one_line_naming_both_forms(capsys, no_training, tmp_path):
    (tmp_path / "rewards.py").write_text("def odd(x):\n    return 1.0\n")
    tiny = ROOT / "tests" / "e2e" / "tiny_job.yaml"
    assert cli.main(["train", "--config", str(tiny), "--dry-run", f"task.reward.custom={tmp_path}/rewards.py:odd",
                     "task.reward.isolation=process"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{tmp_path}/rewards.py:odd has the signature (x), which fits neither" in err
    assert "fn(completion: str, row: Row) -> float" in err and "fn(prompts, completions, **columns)" in err

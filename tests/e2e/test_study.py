"""The study and `stabledrl eval` on real Ray actors and DeepSpeed (CPU): a tiny study (a shared,
cached warm start; one method, one seed) and, from the same warm start, the same run as a plain
job that checkpoints and exports:

- the study's run is the job's run: identical metrics step by step (the study adds nothing to
  the Driver's loop), with eval/* logged at step 0, every eval.every steps and at the end;
- `stabledrl eval --model final_model` and `--checkpoint checkpoints` give exactly the pass@1 the
  job logged at its last step (same weights, sampler settings and per-sample seeds), and the
  consolidated checkpoint holds the exported weights;
- the report (table, results, figure) is written from the files.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

ray = pytest.importorskip("ray")

import stabledrl.cli.main as cli  # noqa: E402
from stabledrl.common.metrics import read_metrics  # noqa: E402
from stabledrl.common.models import load_policy  # noqa: E402
from stabledrl.coordinator.driver import Driver  # noqa: E402
from stabledrl.recipes.stages import JOB_STAGES  # noqa: E402
from stabledrl.evaluation.offline import checkpoint_weights  # noqa: E402
from stabledrl.recipes.study import StudyConfig, run_config, run_study, write_report  # noqa: E402

pytestmark = pytest.mark.e2e

TRAINED = ("rollout/reward_mean", "train/loss", "train/grad_norm_max", "train/ratio/std")


def tiny_study(tmp_path: Path) -> StudyConfig:
    job = {
        "model": {
            "preset": "tiny-llada",
            "preset_shape": {
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
            },
        },
        "task": {
            "name": "arithmetic",
            "digits": 1,
            "terms": 2,
            "operators": ["+"],
            "held_out": 24,
            "source": {"kind": "generated", "n": 100},
            "reward": {"format_weight": 0.1},
        },
        "warmstart": {"steps": 40, "batch_size": 32, "lr": 3e-3, "cache_dir": str(tmp_path / "cache")},
        "sampler": {"gen_length": 4, "block_length": 4, "steps": 4, "temperature": 1.0},
        "estimator": {"name": "elbo_mc", "num_draws": 1, "weighting": "mean", "masks": "independent"},
        "loss": {"name": "stabledrl"},
        "algorithm": {
            "group_size": 4,
            "groups_per_step": 2,
            "inner_iterations": 2,
            "max_staleness": 0,
        },  # η = 0: deterministic
        "rollout": {"num_workers": 1, "prompts_per_request": 2, "request_timeout_s": 120},
        "learner": {
            "num_ranks": 1,
            "dist_timeout_s": 120,
            "optimizer": {"lr": 1e-3},
            "deepspeed": {"zero_stage": 2, "dtype": "fp32"},
        },
        "cluster": {"learner": {"num_cpus": 0.5}, "rollout": {"num_cpus": 0.5}, "start_timeout_s": 240},
        "weights": {"timeout_s": 120},
        "eval": {"every": 2, "num_prompts": 24, "samples_per_prompt": 2},
        "run": {"steps": 3, "tensorboard": False},
    }
    return StudyConfig(job=job, methods={"stabledrl": {}}, seeds=[0], output_dir=tmp_path / "study")


def series(records: list[dict], key: str) -> dict[int, float]:
    return {int(r["step"]): r[key] for r in records if key in r}


@pytest.fixture(scope="module")
def ran(cluster, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("study")
    study = tiny_study(tmp_path)
    result = run_study(study)
    job = run_config(study, "stabledrl", 0, model_path=result.model_path).model_copy(deep=True)
    job.run.output_dir, job.run.name = tmp_path / "job", "study-e2e-job"
    job.run.save_final_checkpoint, job.run.export_final = True, True
    Driver(job, stages=JOB_STAGES).run()
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(job.model_dump(mode="json"), sort_keys=False))
    return study, result, job, config


def test_the_study_run_is_the_jobs_run_with_eval_at_start_every_and_end(ran):
    study, result, job, _ = ran
    assert [o.status for o in result.outcomes] == ["finished"]
    studied = read_metrics(study.output_dir / "stabledrl" / "seed0" / "metrics.jsonl")
    plain = read_metrics(job.run.output_dir / "metrics.jsonl")
    assert sorted(series(studied, "eval/pass@1")) == [0, 2, 3]
    for key in TRAINED:
        assert sorted(series(studied, key)) == [1, 2, 3], key
        assert series(studied, key) == series(plain, key), key  # same config, same seeds: same run
    assert series(studied, "eval/pass@1") == series(plain, "eval/pass@1")


def test_eval_of_the_export_and_of_the_checkpoint_repeats_the_jobs_final_pass_at_1(ran, tmp_path, capsys):
    _, _, job, config = ran
    logged = series(read_metrics(job.run.output_dir / "metrics.jsonl"), "eval/pass@1")[3]
    out = {}
    for source, path in (("--model", job.run.output_dir / "final_model"), ("--checkpoint", job.run.output_dir)):
        file = tmp_path / f"{source[2:]}.json"
        assert cli.main(["eval", "--config", str(config), source, str(path), "--k", "2", "--out", str(file)]) == 0
        out[source] = json.loads(file.read_text())
    assert out["--model"]["pass@1"] == out["--checkpoint"]["pass@1"] == logged
    assert out["--model"]["pass@2"] == out["--checkpoint"]["pass@2"]
    assert out["--model"]["num_prompts"] == 24 and out["--model"]["samples_per_prompt"] == 2
    assert "pass@2" in capsys.readouterr().out

    exported, _ = load_policy(job.model.model_copy(update={"path": job.run.output_dir / "final_model"}))
    consolidated = checkpoint_weights(job.run.output_dir / "checkpoints")
    for name, param in exported.named_parameters():
        assert torch.equal(param.detach(), consolidated[name]), name


def test_the_report_from_the_files(ran):
    study, result, _, _ = ran
    written = write_report(study, statuses=result.statuses, timing={"total": result.wall_s})
    table = written["table"].read_text()
    assert "| stabledrl | 1 |" in table and "| 0/1 |" in table
    run = json.loads((study.output_dir / "results.json").read_text())["runs"][0]
    assert run["steps"] == 3 and run["finished"] and math.isfinite(run["grad_norm_max"])
    assert written["figure"].read_bytes()[:4] == b"\x89PNG"

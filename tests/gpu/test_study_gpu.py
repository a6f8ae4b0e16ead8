"""The study on one GPU: two lanes (driver processes in their own Ray namespaces) whose actors
share the GPU by fractional Ray GPUs, bf16, object-store weight push, a warm start on the GPU.

    python -m pytest -q -m gpu tests/gpu/test_study_gpu.py

Checks: both runs finish; eval/* was logged at the start, every eval.every steps and at the end;
the report (table, results) is written.
"""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("ray")

from stabledrl.common.metrics import read_metrics  # noqa: E402
from stabledrl.recipes.study import StudyConfig, run_study, save_study_config, write_report  # noqa: E402

pytestmark = pytest.mark.gpu


def test_two_concurrent_runs_on_one_gpu(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    share = {"num_cpus": 1, "num_gpus": 0.2}
    job = {
        "model": {"preset": "tiny-llada", "dtype": "bfloat16",
                  "preset_shape": {"hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 2,
                                   "num_attention_heads": 4, "num_key_value_heads": 4}},
        "task": {"name": "arithmetic", "digits": 1, "terms": 3, "operators": ["+"], "held_out": 64,
                 "source": {"kind": "generated", "n": 1000}},
        "warmstart": {"steps": 100, "batch_size": 64, "lr": 1e-3, "cache_dir": str(tmp_path / "cache")},
        "sampler": {"gen_length": 4, "block_length": 4, "steps": 4, "temperature": 1.0},
        "estimator": {"name": "elbo_mc", "num_draws": 1, "weighting": "mean", "masks": "independent"},
        "loss": {"name": "stabledrl"},
        "algorithm": {"group_size": 8, "groups_per_step": 4, "inner_iterations": 2, "max_staleness": 1},
        "rollout": {"num_workers": 1, "prompts_per_request": 4, "request_timeout_s": 300},
        "learner": {"num_ranks": 1, "dist_timeout_s": 300, "optimizer": {"lr": 1e-4},
                    "deepspeed": {"zero_stage": 2, "dtype": "auto"}},
        "cluster": {"learner": share, "rollout": share, "start_timeout_s": 300},
        "weights": {"backend": "object_store", "timeout_s": 120},
        "eval": {"every": 2, "num_prompts": 64},
        "run": {"steps": 4, "tensorboard": False},
    }
    study = StudyConfig(job=job, methods={"grpo": {"loss": {"name": "grpo", "kl_beta": 0.0}}, "stabledrl": {}},
                        seeds=[0], concurrency=2, output_dir=tmp_path / "study")
    result = run_study(study, study_file=save_study_config(study))
    assert [o.status for o in result.outcomes] == ["finished", "finished"], result.outcomes
    for method in study.methods:
        records = read_metrics(study.output_dir / method / "seed0" / "metrics.jsonl")
        assert sorted(r["step"] for r in records if "eval/pass@1" in r) == [0, 2, 4]
        assert sum("train/loss" in r for r in records) == 4
    written = write_report(study, statuses=result.statuses, figure=False)
    runs = json.loads((study.output_dir / "results.json").read_text())["runs"]
    assert len(runs) == 2 and all(r["finished"] for r in runs) and written["table"].is_file()

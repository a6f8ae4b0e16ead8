"""Elasticity and faults with the NCCL weight push, and with ``auto`` on one host (every group pulled
over peer: rank 0's ZeRO-2 parameters read where they lie); the CPU tests run the same code over
gloo.

    python -m pytest -q -m gpu tests/gpu/test_elastic_gpu.py      # needs 4 GPUs: 1 rank + up to 3 workers

One learner rank (ZeRO-2, bf16) and 2 GPU rollout workers, η = 1 with in-order batches. After step
1 the job is scaled to 3 workers (`stabledrl.coordinator.runtime.control.scale`, what `stabledrl scale` does): the
new worker joins the NCCL group at the next push, which rebuilds it. Worker 0 then SIGKILLs itself
in the middle of a request: its prompts are re-queued, a replacement starts and joins the group at
the following push (the workers hold their requests after the kill until both new workers have
started: on a fast card the 12 steps would end first). Checks: every step trains on exactly its
in-order prompts, each once, sampled at version max(0, b - 1) (the fault re-samples lost prompts at
the version current when they are re-admitted, so that one is allowed to be newer); after the last
push every worker holds rank 0's weights bit for bit under the final version; the counters say what
happened.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from stabledrl.common.config.base import validate  # noqa: E402
from stabledrl.common.config.job import JobConfig  # noqa: E402
from stabledrl.cli.scale import scale  # noqa: E402
from stabledrl.coordinator.driver import Driver  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
import harness  # noqa: E402  (the test workers the e2e tests share)
from harness import InspectedLearner, InspectedRollout  # noqa: E402
from gpu_ray import local_gpu_ray  # noqa: E402

pytestmark = pytest.mark.gpu
NAME = "gpu-elastic"


def dying_rollout(marker: str, joined: str) -> type:
    class DyingRollout(InspectedRollout):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.calls = 0

        def generate(self, requests):
            self.calls += 1
            if self.index == 0 and self.calls == 6 and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            # after the kill, hold the requests until the added worker and the replacement have started: on a fast
            # card the job's 12 steps would otherwise end before they join a push
            deadline = time.monotonic() + 120
            while os.path.exists(marker) and not os.path.exists(joined) and time.monotonic() < deadline:
                time.sleep(0.05)
            return super().generate(requests)

    return DyingRollout


def job_config(output_dir, backend: str = "nccl") -> JobConfig:
    gpu = {"num_cpus": 1, "num_gpus": 1}
    return validate(JobConfig, {
        "model": {"preset": "tiny-llada", "dtype": "bfloat16",
                  "preset_shape": {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4,
                                   "num_attention_heads": 8, "num_key_value_heads": 8}},
        "task": {"name": "arithmetic", "held_out": 0, "source": {"kind": "generated", "n": 2000}},
        "sampler": {"gen_length": 8, "block_length": 8, "steps": 8, "temperature": 1.0},
        "estimator": {"name": "block_random", "block_length": 8, "num_draws": 2},
        "loss": {"name": "stabledrl"},
        "algorithm": {"group_size": 8, "groups_per_step": 4, "inner_iterations": 1, "max_staleness": 1,
                      "in_order": True},
        "rollout": {"num_workers": 2, "max_workers": 3, "prompts_per_request": 1, "request_timeout_s": 300},
        "learner": {"num_ranks": 1, "dist_timeout_s": 300, "optimizer": {"lr": 1e-4},
                    "deepspeed": {"zero_stage": 2, "dtype": "bf16"}},
        "cluster": {"learner": gpu, "rollout": gpu, "start_timeout_s": 600},
        "weights": {"backend": backend, "timeout_s": 300, "bucket_mb": 1},
        "run": {"steps": 12, "seed": 0, "output_dir": str(output_dir), "progress": False, "tensorboard": False,
                "save_final_checkpoint": False, "export_final": False, "name": NAME},
    })


@pytest.fixture(scope="module")
def gpu_cluster():
    with local_gpu_ray(4, sys.modules[__name__], harness) as gpus:
        yield gpus


@pytest.mark.parametrize("backend", ["nccl", "auto"])
def test_the_push_group_follows_scale_out_and_a_killed_worker(gpu_cluster, tmp_path, backend, job_log):
    cfg = job_config(tmp_path, backend)
    lines, joined = job_log, tmp_path / "joined"

    class Joined(logging.Handler):  # after job_log's handler: ``lines`` holds the line already
        def emit(self, record: logging.LogRecord) -> None:
            started = {w for w in (0, 2) if any(x.startswith(f"rollout worker {w} started on node") for x in lines)}
            if started == {0, 2}:  # the added worker and worker 0's replacement
                joined.touch()

    watch = Joined()
    logging.getLogger("stabledrl").addHandler(watch)
    driver = Driver(cfg, rollout_cls=dying_rollout(str(tmp_path / "died"), str(joined)), learner_cls=InspectedLearner,
                    record_batches=True)
    driver.setup()
    events = {}

    def operator():
        while len(driver.history) < 1:
            time.sleep(0.05)
        events["scale"] = scale(NAME, 3)[0]

    thread = threading.Thread(target=operator, daemon=True)
    thread.start()
    try:
        driver.train()
        driver.drain()
        learner = ray.get([a.weights.remote() for a in driver.actors.learners], timeout=300)[0]
        held = ray.get([w.weights.remote() for w in driver.active_rollouts()], timeout=300)
    finally:
        driver.close()
        logging.getLogger("stabledrl").removeHandler(watch)
    thread.join(timeout=10)
    assert "3 rollout workers requested" in events["scale"]
    last = driver.history[-1]
    assert last["elastic/workers_added"] == 1 and last["faults/rollout_worker_deaths"] == 1
    assert last["faults/rollout_workers_replaced"] == 1 and last["rollout/workers"] == 3
    assert os.path.exists(tmp_path / "died")
    for b, batch in enumerate(driver.batches):
        assert [e.uid for e in batch] == list(range(4 * b, 4 * b + 4))
        assert all(max(0, b - 1) <= x.policy_version <= b for e in batch for x in e.group.samples)
    steps = cfg.run.steps
    assert len(held) >= 2 and all(version == steps for version, _ in held)  # a replacement may still be syncing
    for _, weights in held:
        assert all(torch.equal(weights[n], learner[n].cpu()) for n in learner)
    chosen = [line for line in lines if line.startswith("weights: the push group")]
    # auto: one line, the first group's; the groups rebuilt for the added worker and the replacement (one
    # host) are pulled over peer as well
    assert chosen == (["weights: the push group of rollout workers [0, 1] is built over peer (auto: every learner "
                       "rank and rollout worker runs on one host)"] if backend == "auto" else []), lines
    print("\nworkers per step:", [int(r["rollout/workers"]) for r in driver.history],
          "push (s):", [round(r["time/weight_push"], 3) for r in driver.history])

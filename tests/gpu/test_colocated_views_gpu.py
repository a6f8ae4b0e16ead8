"""A colocated job on GPUs whose rollout workers view their learner ranks' parameters (``weights.ipc:
view``, common/transport/views.py), against the copying push (``weights.ipc: copy``): DeepSpeed's
real flat buffers exported through CUDA IPC, ZeRO-2 and ZeRO-3 on one rank (the partition is the
parameter), and, with 2 GPUs, ZeRO-3 over two ranks (each rank all-gathers into one buffer the worker
views).

    python -m pytest -q -m gpu tests/gpu/test_colocated_views_gpu.py     # 1 GPU; 2 GPUs: also the gather

Checks: the job resolved the mode it was meant to; after the last push every worker holds exactly
its rank's weights under the final version; a viewing worker's own allocator holds less than half
the weights' bytes (its copy was freed at the first push: the weights are on the card once), a
copying worker at least the weights' bytes. A viewing worker loaded its policy on the host and its
allocator's peak over the set-up (load and first push) stays under a quarter of the weights' bytes:
no copy of its own was ever on the card, not even until the first push; a copying worker's peak is
at least the weights' bytes. Without Ray, a rollout engine whose policy waits on the host runs on its
views after the first push (only the buffers moved to the GPU), and on a copy of its own moved there
whole before any other push (rollout/engine.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from stabledrl.common.config.base import validate  # noqa: E402
from stabledrl.common.config.job import JobConfig  # noqa: E402
from stabledrl.common.config.sampler import SamplerConfig  # noqa: E402
from stabledrl.common.models import build_tiny_policy  # noqa: E402
from stabledrl.common.transport import WeightPushConfig  # noqa: E402
from stabledrl.common.transport.base import WeightHandle  # noqa: E402
from stabledrl.common.transport.views import ViewPush  # noqa: E402
from stabledrl.common.transport.plan import PushInputs, plan_push  # noqa: E402
from stabledrl.coordinator.driver import Driver  # noqa: E402
from stabledrl.rollout.engine import TorchRolloutEngine  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
import harness  # noqa: E402  (the test workers the e2e tests share)
from harness import InspectedLearner, InspectedRollout  # noqa: E402
from gpu_ray import local_gpu_ray  # noqa: E402

pytestmark = pytest.mark.gpu

# ~0.2 GB of bf16 weights: a worker's fixed buffers (cuBLAS keeps a 32 MiB workspace on Hopper) are a small
# part of it; at 4 layers of width 512 (26 MB) that workspace alone outweighed the weights
SHAPE = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
         "num_key_value_heads": 16}


class SetUpRollout(InspectedRollout):
    def peak(self) -> int:
        """The most bytes this process's allocator has held on its GPU so far."""
        return torch.cuda.max_memory_allocated()


def job_config(output_dir, ranks: int, zero_stage: int, ipc: str) -> JobConfig:
    gpu = {"num_cpus": 1, "num_gpus": 1}
    return validate(JobConfig, {
        "model": {"preset": "tiny-llada", "dtype": "bfloat16", "preset_shape": SHAPE},
        "task": {"name": "arithmetic", "held_out": 0, "source": {"kind": "generated", "n": 2000},
                 "reward": {"custom": harness.REWARD, "isolation": "inline", "format_weight": 0.0}},
        "sampler": {"gen_length": 8, "block_length": 8, "steps": 8, "temperature": 1.0},
        "estimator": {"name": "block_random", "block_length": 8, "num_draws": 2},
        "loss": {"name": "stabledrl"},
        "algorithm": {"group_size": 8, "groups_per_step": 2 * ranks, "inner_iterations": 2, "max_staleness": 0},
        "rollout": {"num_workers": ranks, "prompts_per_request": 1, "request_timeout_s": 300},
        "learner": {"num_ranks": ranks, "dist_timeout_s": 300, "optimizer": {"lr": 1e-3},
                    "deepspeed": {"zero_stage": zero_stage, "dtype": "bf16", "param_persistence_threshold": 0}},
        "cluster": {"learner": gpu, "rollout": gpu, "colocate": True, "start_timeout_s": 600},
        "weights": {"backend": "auto", "ipc": ipc, "timeout_s": 300},
        "run": {"steps": 3, "seed": 0, "output_dir": str(output_dir), "progress": False, "tensorboard": False,
                "save_final_checkpoint": False, "export_final": False},
    })


@pytest.fixture(scope="module")
def gpu_cluster():
    with local_gpu_ray(1, sys.modules[__name__], harness) as gpus:
        yield gpus


@pytest.mark.parametrize("ranks, zero_stage, ipc", [(1, 2, "auto"), (1, 2, "copy"), (1, 3, "auto"), (2, 3, "auto")],
                         ids=["zero2_view", "zero2_copy", "zero3_one_rank_view", "zero3_two_ranks_view"])
def test_a_viewing_worker_holds_no_copy_and_the_ranks_weights(gpu_cluster, tmp_path, ranks, zero_stage, ipc):
    if gpu_cluster < ranks:
        pytest.skip(f"needs {ranks} GPUs")
    cfg = job_config(tmp_path, ranks, zero_stage, ipc)
    resolved = plan_push(PushInputs.of(cfg)).transport
    assert (resolved.backend, resolved.ipc) == ("ipc", "view" if ipc == "auto" else "copy")
    driver = Driver(cfg, rollout_cls=SetUpRollout, learner_cls=InspectedLearner)
    driver.setup()
    try:
        loaded_on = [info["loaded_on"] for info in driver.actors.info["rollouts"]]
        peaks = ray.get([w.peak.remote() for w in driver.actors.rollouts], timeout=300)  # the load and first push
        driver.train()
        driver.drain()
        learner = ray.get([a.weights.remote() for a in driver.actors.learners], timeout=300)[0]
        held = ray.get([w.weights.remote() for w in driver.active_rollouts()], timeout=300)
        memory = ray.get([w.memory.remote() for w in driver.active_rollouts()], timeout=300)
    finally:
        driver.close()
    assert driver.snapshot().worker_versions == [cfg.run.steps] * ranks
    for version, weights in held:
        assert version == cfg.run.steps and weights.keys() == learner.keys()
        assert all(torch.equal(weights[n], learner[n].cpu()) for n in learner), \
            [n for n in learner if not torch.equal(weights[n], learner[n].cpu())]
    for m, peak in zip(memory, peaks, strict=True):
        if resolved.ipc == "view":
            assert m["allocated"] < 0.5 * m["parameters"], m  # a copy of its own would be all of them
            assert peak < 0.25 * m["parameters"], (peak, m)  # loaded on the host: never on the card
        else:
            assert m["allocated"] >= m["parameters"], m
            assert peak >= m["parameters"], (peak, m)
    assert loaded_on == ["cpu" if resolved.ipc == "view" else "cuda:0"] * ranks
    print("\nworker memory:", memory, "set-up peaks:", peaks, "step times (s):",
          [round(r["time/step"], 3) for r in driver.history])


class SameProcessViews(ViewPush):
    """A view push of ``learner``'s parameters in this process (CUDA IPC maps another process's
    memory only): each parameter of the receiver is bound to the learner's."""

    def __init__(self, learner) -> None:
        super().__init__(WeightPushConfig(backend="ipc", ipc="view"))
        self.learner = learner

    def receive(self, handle, load) -> int:
        for name, param in self.learner.named_parameters():
            load.bind(name, param.detach())
        return handle.version


class Copies:
    """Any other push: the learner's parameters copied into the receiver's."""

    def __init__(self, learner) -> None:
        self.learner = learner

    def receive(self, handle, load) -> int:
        load([(name, param.detach()) for name, param in self.learner.named_parameters()])
        return handle.version


@pytest.mark.parametrize("views", [True, False], ids=["view", "copy"])
def test_a_policy_that_waits_on_the_host_runs_on_the_gpu_after_its_first_push(views):
    gpu = torch.device("cuda", 0)
    learner = build_tiny_policy("llada", seed=0, dtype=torch.bfloat16, **SHAPE).to(gpu)
    worker = build_tiny_policy("llada", seed=1, dtype=torch.bfloat16, **SHAPE)  # loaded on the host
    weights = sum(p.numel() * p.element_size() for p in worker.parameters())
    engine = TorchRolloutEngine(worker, device=gpu)
    assert engine.on_host
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    engine.update_weights(SameProcessViews(learner) if views else Copies(learner), WeightHandle(1, "ipc"))
    grown = torch.cuda.max_memory_allocated() - before
    assert not engine.on_host and all(t.device == gpu for t in [*worker.parameters(), *worker.buffers()])
    learned = dict(learner.named_parameters())
    if views:  # the parameters are the learner's; only the buffers (rotary tables) moved
        assert all(p.data_ptr() == learned[n].data_ptr() for n, p in worker.named_parameters())
        assert grown < 0.05 * weights, (grown, weights)
    else:  # moved whole before the push, which copied into it
        assert all(p.data_ptr() != learned[n].data_ptr() and torch.equal(p, learned[n])
                   for n, p in worker.named_parameters())
        assert grown >= weights, (grown, weights)
    cfg = SamplerConfig(gen_length=8, block_length=8, steps=8, temperature=1.0)
    prompt, seeds = [torch.arange(4, 12)], torch.tensor([3])
    out = engine.generate(prompt, seeds, cfg)
    assert torch.equal(out.completion_ids, TorchRolloutEngine(learner).generate(prompt, seeds, cfg).completion_ids)

"""The pool tells a rollout worker whether its pushes make its parameters views of its learner
rank's (``weights.ipc: view``): only a worker in a bundle beside that rank (``cluster.colocate``)
of a job whose push plan views, which then loads its policy on the host (rollout/worker.py). The
plan is the driver's, handed down through ``start_actors``; the whole path runs in
tests/e2e/test_colocate.py."""
from __future__ import annotations

from stabledrl.common.config.base import validate
from stabledrl.common.config.job import JobConfig
from stabledrl.common.transport.plan import PushInputs, plan_push
from stabledrl.coordinator.runtime.pool import Placement, RolloutPool
from stabledrl.rollout.worker import RolloutWorker


def job(ipc: str = "auto") -> JobConfig:
    gpu = {"num_cpus": 1, "num_gpus": 1}
    return validate(JobConfig, {
        "model": {"preset": "tiny-llada", "dtype": "bfloat16"},
        "task": {"name": "arithmetic", "source": {"kind": "generated", "n": 20}},
        "estimator": {"name": "block_random", "block_length": 32}, "loss": {"name": "stabledrl"},
        "algorithm": {"group_size": 2, "groups_per_step": 1, "max_staleness": 0},
        "learner": {"deepspeed": {"dtype": "bf16"}}, "rollout": {"num_workers": 1},
        "cluster": {"learner": gpu, "rollout": gpu, "colocate": True},
        "weights": {"ipc": ipc},
    })


class Started:
    """Stands for the pool's actor class: records the arguments each worker is started with."""

    def __init__(self) -> None:
        self.kwargs: list[dict] = []

    def options(self, **options) -> "Started":
        return self

    def remote(self, *args, **kwargs) -> object:
        self.kwargs.append(kwargs)
        return object()


def started(cfg: JobConfig, shared: bool) -> dict:
    pool = RolloutPool(cfg, RolloutWorker, views=plan_push(PushInputs.of(cfg)).views)
    pool.actor_cls = Started()
    pool.free = [Placement(group=None, bundle=0, owned=False, shared=shared)]
    pool.launch(0, replaces=False)
    return pool.actor_cls.kwargs[0]


def test_only_a_worker_beside_its_rank_in_a_job_that_views_is_told_it_will_view():
    assert started(job(), shared=True) == {"group_size": 2, "seed": 0, "share_gpu": True, "view_weights": True}
    assert not started(job("copy"), shared=True)["view_weights"]  # the copying ipc: a copy of its own
    assert not started(job(), shared=False)["view_weights"]  # a worker beyond the shared GPUs

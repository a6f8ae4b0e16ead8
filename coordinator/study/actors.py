"""Warm actors: one rollout worker set and one learner group serve a study's runs one after another.

Starting a run's actors costs a process each, with torch, transformers and DeepSpeed imported and
the learner group formed: 20-30 s on a busy 2-core machine, longer than a tiny run itself. A
``Slot`` starts them once; before each run ``prepare`` puts them back to the state a fresh start
would give for that run's config (the initial weights reloaded from disk, a new optimizer and
ZeRO engine, the run's loss, estimator, sampler, task and seed; version 0), keeping only the
processes and the learner's process group. ``tests/e2e/test_study.py`` checks that a run on
reused actors repeats a run on fresh ones exactly.
"""
from __future__ import annotations

import gc
import time
from typing import Any, Callable

import ray
import torch

from common.config.job import JobConfig
from coordinator.actors import Actors, rollout_model, wait
from learner.worker import LearnerWorker, _needs_reference
from rollout.worker import RolloutWorker


def _release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class StudyLearner(LearnerWorker):
    """A learner rank that can be reset for the next run (same rank, world size and group)."""

    def reset(self, model: Any, learner: Any, estimator: Any, loss: Any, **algorithm: Any) -> dict[str, Any]:
        """Drop the engine and rebuild it from ``model`` with the new run's sections, as ``start``
        does after the group is formed (the group itself is kept)."""
        from common.models import load_policy
        from learner.engine import LearnerEngine

        t0 = time.perf_counter()
        if self.push is not None:
            self.push.close()
        if self.engine is not None and hasattr(self.engine.engine, "destroy"):
            self.engine.engine.destroy()  # DeepSpeed's hooks and buffers
        self.engine = self.reference = None
        _release_memory()
        LearnerWorker.__init__(self, self.rank, self.world_size, model, learner, estimator, loss, **algorithm)
        policy, self.tokenizer = load_policy(self.model_cfg)
        self.pad_token_id = policy.pad_token_id
        if _needs_reference(self.loss_cfg):
            self.reference, _ = load_policy(self.model_cfg.model_copy(update={"gradient_checkpointing": False}))
            self.reference.requires_grad_(False)
        self.engine = LearnerEngine(policy, self.cfg)
        if self.reference is not None:
            self.reference.to(device=self.engine.device, dtype=self.engine.dtype)
        return {"rank": self.rank, "device": str(self.engine.device), "dtype": str(self.engine.dtype),
                "start_s": time.perf_counter() - t0}


class StudyRollout(RolloutWorker):
    """A rollout worker that can be reset for the next run (weights reloaded, version 0)."""

    def reset(self, index: int, model: Any, sampler: Any, estimator: Any, task: Any, **kwargs: Any) -> dict[str, Any]:
        self.close()
        self.policy = self.engine = None
        _release_memory()
        RolloutWorker.__init__(self, index, model, sampler, estimator, task, **kwargs)
        return self.ready()


def _learner_args(cfg: JobConfig) -> tuple[tuple, dict]:
    a = cfg.algorithm
    return ((cfg.model, cfg.learner, cfg.estimator, cfg.loss),
            {"inner_iterations": a.inner_iterations, "advantage_scale": a.advantage_scale,
             "micro_batch_size": a.micro_batch_size})


def _rollout_args(cfg: JobConfig) -> tuple[tuple, dict]:
    return ((rollout_model(cfg), cfg.sampler, cfg.estimator, cfg.task),
            {"group_size": cfg.algorithm.group_size, "seed": cfg.run.seed})


class Slot:
    """The actors of one concurrent lane of a study: M learner ranks and N rollout workers, started
    on the first run and reset for each later one. No placement groups (a study runs on one node,
    and lanes must not collide on group names); Ray's per-actor resources still apply."""

    def __init__(self, index: int, log: Callable[[str], None] = print) -> None:
        self.index, self.log = index, log
        self.actors: Actors | None = None

    def prepare(self, cfg: JobConfig) -> Actors:
        """The actors, in the state a fresh start for ``cfg`` gives (started on first use)."""
        if self.actors is None:
            return self._start(cfg)
        t0 = time.perf_counter()
        (l_args, l_kwargs), (r_args, r_kwargs) = _learner_args(cfg), _rollout_args(cfg)
        refs = [a.reset.remote(*l_args, **l_kwargs) for a in self.actors.learners]
        refs += [w.reset.remote(i, *r_args, **r_kwargs) for i, w in enumerate(self.actors.rollouts)]
        names = [f"learner rank {r} (reset)" for r in range(len(self.actors.learners))]
        names += [f"rollout worker {i} (reset)" for i in range(len(self.actors.rollouts))]
        infos = wait(refs, cfg.cluster.start_timeout_s, names)
        m = len(self.actors.learners)
        self.actors.info = {"learners": infos[:m], "rollouts": infos[m:], "start_s": time.perf_counter() - t0}
        return self.actors

    def _start(self, cfg: JobConfig) -> Actors:
        t0 = time.perf_counter()
        res_l, res_r = cfg.cluster.learner, cfg.cluster.rollout
        learner_actor = ray.remote(num_cpus=res_l.num_cpus, num_gpus=res_l.num_gpus)(StudyLearner)
        rollout_actor = ray.remote(num_cpus=res_r.num_cpus, num_gpus=res_r.num_gpus)(StudyRollout)
        (l_args, l_kwargs), (r_args, r_kwargs) = _learner_args(cfg), _rollout_args(cfg)
        m, n = cfg.learner.num_ranks, cfg.rollout.num_workers
        learners = [learner_actor.remote(r, m, *l_args, **l_kwargs) for r in range(m)]
        rollouts = [rollout_actor.remote(i, *r_args, **r_kwargs) for i in range(n)]
        self.actors = Actors(learners, rollouts)
        timeout = cfg.cluster.start_timeout_s
        try:
            addr, port = wait([learners[0].rendezvous_address.remote()], timeout, "learner rank 0 (rendezvous address)")[0]
            infos = wait([a.start.remote(addr, port) for a in learners] + [w.ready.remote() for w in rollouts], timeout,
                         [f"learner rank {r} (start)" for r in range(m)] + [f"rollout worker {i} (model load)" for i in range(n)])
        except BaseException:
            self.shutdown()
            raise
        self.actors.info = {"learners": infos[:m], "rollouts": infos[m:], "start_s": time.perf_counter() - t0}
        self.log(f"lane {self.index}: {m} learner rank(s) on {infos[0]['device']} ({infos[0]['dtype']}), {n} rollout "
                 f"worker(s), {infos[m]['parameters'] / 1e6:.2f}M parameters, up in {self.actors.info['start_s']:.1f} s")
        return self.actors

    def shutdown(self) -> None:
        """Kill the actors (after a failed or stopped run, or at the end of the study)."""
        if self.actors is not None:
            self.actors.shutdown()
            self.actors = None

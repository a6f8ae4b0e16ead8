"""The rollout worker: a Ray actor holding a policy copy, the sampler and the task's reward.

The coordinator sends it requests of a few prompts (``generate``); each call returns a
RolloutResult (one ``Episode`` per prompt, the reward calls, the worker's clock) as soon as that
request is done, so groups stream back request by request
while other requests are still queued. Between requests it takes new weights
(``receive_weights``: versioned, bounded by the push timeout) and reports the version it holds;
every later request is sampled, and its behaviour estimate computed, under those weights. The
model is reached only through the rollout engine (rollout/engine.py): sampling, scoring and the
weights with their version all go through it.

The class is plain Python; the coordinator makes it an actor with the resources of the config
(``ray.remote(RolloutWorker).options(num_cpus=..., num_gpus=...)``). On a GPU the policy sits on
``cuda:0`` (Ray exposes the one GPU it assigned); on a CPU the actor uses one torch thread, so
several actors share the cores without oversubscribing them. A worker whose first push makes its
parameters views of its learner rank's on that GPU (``view_weights``) loads the policy on the host
instead (``load_device``): loaded on the GPU it would be a second copy of the weights on the
learner's card until that push.
"""
from __future__ import annotations

import os
import time
from typing import Any, Optional, Sequence

import ray
import torch

from stabledrl.common.actor_time import BACKGROUND, ActorClock
from stabledrl.common.gil import settle_heap
from stabledrl.common.config.estimator import EstimatorConfig
from stabledrl.common.config.learner import LoraConfig
from stabledrl.common.config.model import ModelConfig
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.config.task import AnyTaskConfig
from stabledrl.common.models import load_policy
from stabledrl.common.actor_setup import hand_back_gpu_memory, setup_actor_process
from stabledrl.common.sandbox.scorer import RewardScorer
from stabledrl.common.tasks import Row, build_task
from stabledrl.common.transport import WeightHandle, WeightPushConfig, setup_weight_push
from stabledrl.common.transport.clocks import STAGE, PushTimer
from stabledrl.common.types import EvalResult, PromptRequest, RolloutResult, WorkerInfo
from stabledrl.rollout.engine import TorchRolloutEngine
from stabledrl.rollout.evaluate import evaluate
from stabledrl.rollout.workflow import behaviour_estimator, run_episodes
from stabledrl.rollout.eval_worker import complete


def load_device(device: torch.device, view_weights: bool) -> torch.device:
    """Where a worker on ``device`` loads its policy: the host where its first push binds the
    parameters to views of its learner rank's on a GPU (the engine moves the rest there after that
    push, or the whole policy before any other: rollout/engine.py), else ``device`` itself."""
    return torch.device("cpu") if view_weights and device.type == "cuda" else device


class RolloutWorker:
    def __init__(
        self,
        index: int,
        model: ModelConfig,
        sampler: SamplerConfig,
        estimator: EstimatorConfig,
        task: AnyTaskConfig,
        *,
        group_size: int,
        seed: int,
        share_gpu: bool = False,
        view_weights: bool = False,
    ) -> None:
        t0 = time.perf_counter()
        self.share_gpu = share_gpu  # cluster.colocate: a learner rank trains on this GPU between requests
        self.clock = ActorClock(background=BACKGROUND + STAGE)
        self.index = index
        self.device = setup_actor_process()
        # view_weights: the pushes make the parameters views of that rank's (weights.ipc: view)
        self.loaded_on = load_device(self.device, view_weights)
        policy, self.tokenizer = load_policy(model, device=self.loaded_on)
        self.engine = TorchRolloutEngine(policy, policy_version=0, device=self.device)
        self.sampler, self.group_size, self.seed = sampler, group_size, seed
        self.estimator = behaviour_estimator(estimator)
        self.task, self.task_cfg = build_task(task), task
        inline = task.reward.resolved_isolation == "inline"
        self.scorer = RewardScorer(task, self.task) if inline else RewardScorer(task)
        self.push, self.partial_push = None, False
        settle_heap()  # a full collection later walks only what came after (common/gil.py)
        self.start_s = time.perf_counter() - t0
        self.clock.add("load", self.start_s)

    def ready(self) -> WorkerInfo:
        """What the coordinator logs once the actor is up, and where it runs (elasticity: which node)."""
        return {"worker": self.index, "device": str(self.device), "pid": os.getpid(), "load_s": self.start_s,
                "node_id": ray.get_runtime_context().get_node_id(), "reward_sandbox": self.scorer.confinement,
                "parameters": self.engine.num_parameters, "version": self.version(), "loaded_on": str(self.loaded_on)}

    def version(self) -> int:
        return self.engine.policy_version

    # ---- rollouts -------------------------------------------------------------------------
    def generate(self, requests: Sequence[PromptRequest]) -> RolloutResult:
        """G completions per prompt, rewarded and behaviour-estimated (rollout/workflow.py), with
        this request's reward-call counts by outcome and the worker's clock."""
        before = self.scorer.stats.as_metrics(prefix="")
        self._check_turn("before")
        episodes = run_episodes(
            self.engine, requests, tokenizer=self.tokenizer, task=self.task,
            scorer=self.scorer, group_size=self.group_size, sampler=self.sampler, estimator=self.estimator,
            seed=self.seed, worker=self.index,
        )
        self._check_turn("after")
        after = self.scorer.stats.as_metrics(prefix="")
        hand_back_gpu_memory(self.share_gpu)
        if not episodes:
            return RolloutResult([])
        stats, n = episodes[0].stats, len(requests)  # per-prompt shares of the request's seconds
        for activity, key in (("generate", "generate_s"), ("reward", "reward_s"), ("score", "estimate_s")):
            self.clock.add(activity, stats.get(key, 0.0) * n)
        return RolloutResult(episodes, {k: after[k] - before[k] for k in after}, self.clock.snapshot())

    def _check_turn(self, when: str) -> None:
        """``weights.ipc: view``: the learner rank's parameters this worker reads in place are still
        the version it holds (common/transport/views.py); a no-op for the other transports."""
        if self.push is not None:
            self.push.check_turn(self.engine.policy_version, when)

    # ---- weights --------------------------------------------------------------------------
    def setup_weight_push(self, cfg: WeightPushConfig, *, partial: bool = False, lora: Optional[LoraConfig] = None,
                          **kwargs: Any) -> None:
        """This worker's end of the push (object store: no arguments; broadcast: its rank etc.).
        ``partial``: a push may carry only some parameters (a LoRA learner sends the adapted
        matrices); the others keep the weights this worker loaded. ``lora``: pushes carry these
        LoRA adapters, held here unmerged (``learner.lora.push: adapters``; rollout/engine.py)."""
        if self.push is not None:
            self.push.close()
        self.push = setup_weight_push(cfg, **kwargs)
        self.partial_push = partial
        self.engine.hold_adapters(lora)
        self.engine.discard_staged()  # a copy staged through the old group is not applied

    @ray.method(concurrency_group="weights")
    def stage_weights(self, handle: WeightHandle, keep_order: bool = False) -> int:
        """Receive version ``handle.version`` of a broadcast push into the engine's staging copy
        while requests run (this method's own thread, the actor's "weights" concurrency group);
        ``receive_weights`` of that version then swaps it in, in order with the requests
        (rollout/engine.py). Returns the version staged."""
        if self.push is None:
            raise RuntimeError(f"rollout worker {self.index}: setup_weight_push was never called")
        timer = PushTimer(self.clock)
        with timer.part("stage"):
            version = self.engine.stage_weights(self.push, handle, partial=self.partial_push, keep_order=keep_order,
                                                timeout_s=self.push.cfg.timeout_s)
        timer.transfer(self.push, "stage")  # the wait for the sender's first byte; a pull's parts
        return version

    def receive_weights(self, handle: WeightHandle) -> int:
        """Hold version ``handle.version`` (or a newer one) from now on, through the engine: the
        staged copy where ``stage_weights`` received it, else received now. Returns the version held."""
        if self.push is None:
            raise RuntimeError(f"rollout worker {self.index}: setup_weight_push was never called")
        with PushTimer(self.clock).part("receive"):
            version = self.engine.update_weights(self.push, handle, partial=self.partial_push)
        hand_back_gpu_memory(self.share_gpu)
        return version

    # ---- evaluation -----------------------------------------------------------------------
    def evaluate(self, rows: Sequence[Row], samples_per_prompt: int, seed: int,
                 sampler: Optional[SamplerConfig] = None) -> tuple[int, EvalResult]:
        """(version held, EvalResult) of ``rows`` under the current weights (rollout/evaluate.py),
        sampled with ``sampler`` (default: the worker's own sampler config)."""
        self._check_turn("before")
        with self.clock.timed("eval"):
            result = evaluate(self.engine, rows, self.task, self.tokenizer, sampler or self.sampler, samples_per_prompt,
                              seed, eos_token_id=self.engine.eos_token_id,
                              scorer=self.scorer, failure_check=self.task_cfg)  # the rollouts' sandbox and stop
        self._check_turn("after")
        return self.version(), result

    def complete(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], sampler: SamplerConfig) -> list[str]:
        """Decoded completions of token-id prompts under the current weights (a published evaluation
        protocol during training: stabledrl/evaluation/protocol.py; the same call as
        rollout/eval_worker.py's)."""
        return complete(self.engine, self.tokenizer, prompts, seeds, sampler, self.engine.eos_token_id)

    def close(self) -> None:
        self.scorer.close()
        if self.push is not None:
            self.push.close()


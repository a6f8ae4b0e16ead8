"""The rollout worker: a Ray actor holding a policy copy, the sampler and the task's reward.

The coordinator sends it requests of a few prompts (``generate``); each call returns one
``Episode`` per prompt as soon as that request is done, so groups stream back request by request
while other requests are still queued. Between requests it takes new weights
(``receive_weights``: versioned, bounded by the push timeout) and reports the version it holds;
every later request is sampled, and its behaviour estimate computed, under those weights.

The class is plain Python; the coordinator makes it an actor with the resources of the config
(``ray.remote(RolloutWorker).options(num_cpus=..., num_gpus=...)``). On a GPU the policy sits on
``cuda:0`` (Ray exposes the one GPU it assigned); on a CPU the actor uses one torch thread, so
several actors share the cores without oversubscribing them.
"""
from __future__ import annotations

import os
import time
from typing import Any, Optional, Sequence

import ray

from common.actor_time import ActorClock
from common.config.model import ModelConfig
from common.config.sampler import SamplerConfig
from common.config.task import AnyTaskConfig
from common.models import load_policy
from common.runtime import setup_actor_process
from common.tasks import RewardScorer, Row, build_task
from common.transport.broadcast import StagedWeights
from common.transport.weights import ParameterLoader, WeightHandle, WeightPushConfig, setup_weight_push
from rollout.engine import TorchRolloutEngine
from rollout.workflow import Episode, PromptRequest, behaviour_estimator, run_episodes


class RolloutWorker:
    def __init__(
        self,
        index: int,
        model: ModelConfig,
        sampler: SamplerConfig,
        estimator: Any,
        task: AnyTaskConfig,
        *,
        group_size: int,
        seed: int,
    ) -> None:
        t0 = time.perf_counter()
        self.clock = ActorClock(background=("push_stage",))
        self.index = index
        self.device = setup_actor_process()
        self.policy, self.tokenizer = load_policy(model, device=self.device)
        self.engine = TorchRolloutEngine(self.policy, policy_version=0)
        self.sampler, self.group_size, self.seed = sampler, group_size, seed
        self.estimator = behaviour_estimator(estimator)
        self.task = build_task(task)
        inline = task.reward.resolved_isolation == "inline"
        self.scorer = RewardScorer(task, self.task) if inline else RewardScorer(task)
        self.push, self.partial_push, self.staged = None, False, None
        self.start_s = time.perf_counter() - t0
        self.clock.add("load", self.start_s)

    def ready(self) -> dict[str, Any]:
        """What the coordinator logs once the actor is up, and where it runs (elasticity: which node)."""
        return {"worker": self.index, "device": str(self.device), "pid": os.getpid(), "load_s": self.start_s,
                "node_id": ray.get_runtime_context().get_node_id(), "reward_sandbox": self.scorer.confinement,
                "parameters": sum(p.numel() for p in self.policy.parameters()), "version": self.version()}

    def version(self) -> int:
        return self.engine.policy_version

    # ---- rollouts -------------------------------------------------------------------------
    def generate(self, requests: Sequence[PromptRequest]) -> list[Episode]:
        """G completions per prompt, rewarded and behaviour-estimated (rollout/workflow.py). The
        first episode also carries this request's reward-call counts (``reward_calls/<outcome>``),
        so the coordinator counts every delivered call once, also of a worker that dies later."""
        before = self.scorer.stats.as_metrics(prefix="")
        episodes = run_episodes(
            self.engine, requests, policy=self.policy, tokenizer=self.tokenizer, task=self.task,
            scorer=self.scorer, group_size=self.group_size, sampler=self.sampler, estimator=self.estimator,
            seed=self.seed, worker=self.index,
        )
        after = self.scorer.stats.as_metrics(prefix="")
        if episodes:
            calls = {f"reward_calls/{k}": after[k] - before[k] for k in after}
            stats, n = episodes[0].stats, len(requests)  # per-prompt shares of the request's seconds
            for activity, key in (("generate", "generate_s"), ("reward", "reward_s"), ("score", "estimate_s")):
                self.clock.add(activity, stats.get(key, 0.0) * n)
            episodes[0].stats = {**stats, **calls, **self.clock.snapshot()}  # the episodes share one stats dict
        return episodes

    def reward_stats(self) -> dict[str, float]:
        return self.scorer.stats.as_metrics(prefix="rollout/reward_calls/")

    # ---- weights --------------------------------------------------------------------------
    def setup_weight_push(self, cfg: WeightPushConfig, *, partial: bool = False, **kwargs: Any) -> None:
        """This worker's end of the push (object store: no arguments; broadcast: its rank etc.).
        ``partial``: a push may carry only some parameters (a LoRA learner sends the adapted
        matrices); the others keep the weights this worker loaded."""
        if self.push is not None:
            self.push.close()
        self.push = setup_weight_push(cfg, **kwargs)
        self.partial_push = partial
        self.staged = None  # a copy staged through the old group is not applied

    @ray.method(concurrency_group="weights")
    def stage_weights(self, handle: WeightHandle, keep_order: bool = False) -> int:
        """Receive version ``handle.version`` of a broadcast push into a staging copy while requests
        run (this method's own thread); ``receive_weights`` swaps it in, in order with the requests
        (common/transport/broadcast.py: StagedWeights). Returns the version staged."""
        if self.push is None:
            raise RuntimeError(f"rollout worker {self.index}: setup_weight_push was never called")
        if self.staged is None:
            self.staged = StagedWeights(self.policy)
        with self.clock.timed("push_stage"):
            return self.staged.receive(self.push, handle, keep_order=keep_order, timeout_s=self.push.cfg.timeout_s,
                                       partial=self.partial_push)

    def receive_weights(self, handle: WeightHandle) -> int:
        """Hold version ``handle.version`` (or a newer one) from now on: the staged copy where
        ``stage_weights`` received it, else received now. Returns the version held."""
        if self.push is None:
            raise RuntimeError(f"rollout worker {self.index}: setup_weight_push was never called")
        with self.clock.timed("push_receive"):
            if self.staged is not None and (self.staged.last or -1) >= handle.version:
                applied = self.staged.apply()  # None: a newer version was staged and applied already
                if applied is not None:
                    self.engine.policy_version = applied
            else:
                self.engine.policy_version = self.push.receive(handle, ParameterLoader(self.policy,
                                                                                       partial=self.partial_push))
        return self.engine.policy_version

    # ---- evaluation -----------------------------------------------------------------------
    def evaluate(self, rows: Sequence[Row], samples_per_prompt: int, seed: int,
                 sampler: Optional[Any] = None) -> tuple[int, Any]:
        """(version held, EvalResult) of ``rows`` under the current weights (rollout/evaluate.py),
        sampled with ``sampler`` (default: the worker's own sampler config)."""
        from rollout.evaluate import evaluate

        with self.clock.timed("eval"):
            result = evaluate(self.engine, rows, self.task, self.tokenizer, sampler or self.sampler, samples_per_prompt,
                              seed, eos_token_id=self.policy.eos_token_id, scorer=self.scorer)  # the rollouts' sandbox
        return self.version(), result

    def close(self) -> None:
        self.scorer.close()
        if self.push is not None:
            self.push.close()


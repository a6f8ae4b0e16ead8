"""The learner rank: a Ray actor, rank r of M, holding one DeepSpeed ZeRO shard of the policy.

One RL step on a batch of groups (``train``), as StableDRL / SPG / d1 run it:

    A_i = group_advantages(r)                                  per group, on the rank holding it
    for k in 0 .. μ-1:                                         inner iterations, one update each
        ℓ_θ(o_i) = estimate(θ, o_i, learner_seeds(mask_seed_i, masks, k))
        L = compute_loss(ℓ_θ, ELBO_μ, A, global counts)        micro-batched, ÷ step totals
        θ ← AdamW(θ, ∇L)                                       LearnerEngine.train_step

``ELBO_μ`` is the behaviour estimate the rollout worker shipped with each sample (version v_b).
Under ``estimator.masks: per_iteration`` (d1's scheme) it is the learner's own instead: before the
first update, the old policy (these weights) and the reference are scored under each mask the
iterations read (d1's counters: micro-batch m of M reads mask (M·k + m + 1) mod μ), and iteration
k's ratio and KL read the values under its mask (``_score_iterations``); with
μ = 1 the old value is the new one detached, as d1 takes it.
With the SPG sandwich, ℓ_θ is the sandwich but ratios must compare ELBOs: the loss receives
``behaviour_logp + (ℓ_θ − ELBO_θ).detach()`` so that ℓ_θ − behaviour = ELBO_θ − ELBO_μ exactly,
while the gradient flows through ℓ_θ (losses stay pure; no loss needs to know the estimator).

Every method that touches the engine is collective: the coordinator calls it on all ranks.
"""
from __future__ import annotations

import os

import time
from pathlib import Path
from typing import Any, Optional, Sequence

import ray
import torch

from stabledrl.common.actor_time import BACKGROUND, TRAIN_PARTS, ActorClock
from stabledrl.common.compiling import graphs_compiled
from stabledrl.common.gil import prompt_gil, settle_heap
from stabledrl.common.config.estimator import EstimatorConfig
from stabledrl.common.config.learner import LearnerConfig
from stabledrl.common.config.loss import LossConfig
from stabledrl.common.config.model import ModelConfig
from stabledrl.common.estimators import estimate
from stabledrl.common.models import load_policy
from stabledrl.common.models.adapter_folder import Adapters
from stabledrl.common.models.export import export_adapters, export_policy
from stabledrl.common.actor_setup import hand_back_gpu_memory, settle_gpu, setup_actor_process
from stabledrl.common.transport import WeightHandle, WeightPushConfig, setup_weight_push
from stabledrl.common.transport.clocks import PUSH_PARTS, STAGE, PushTimer
from stabledrl.common.stats import Reduce, Stat, combine
from stabledrl.common.types import Group, StepResult
from stabledrl.learner.lora import adapters_off
from stabledrl.learner.losses import LossInputs, Metric, compute_loss, needs_whole_groups
from stabledrl.learner.profile import profiled_step
from stabledrl.learner.rl_batch import MicroBatch, global_counts, micro_batches
from stabledrl.learner.group import init_learner_group, rendezvous_address
from stabledrl.learner.engine import LearnerEngine
from stabledrl.learner.async_checkpoint import disk_cause


class LearnerWorker:
    def __init__(
        self,
        rank: int,
        world_size: int,
        model: ModelConfig,
        learner: LearnerConfig,
        estimator: EstimatorConfig,
        loss: LossConfig,
        *,
        inner_iterations: int,
        advantage_scale: str,
        micro_batch_size: int,
        share_gpu: bool = False,
    ) -> None:
        setup_actor_process()
        self.share_gpu = share_gpu  # cluster.colocate: a rollout worker uses this GPU between steps
        self.rank, self.world_size = rank, world_size
        self.model_cfg, self.cfg, self.estimator, self.loss_cfg = model, learner, estimator, loss
        self.inner_iterations, self.advantage_scale = inner_iterations, advantage_scale
        self.micro_batch_size = micro_batch_size
        self.whole_groups = needs_whole_groups(loss)
        self.engine = self.reference = self.tokenizer = self.push = None
        self.reference_is_base = False  # LoRA: the reference is the policy with its adapters off (start)
        self._reference_cache: dict[tuple, Any] = {}  # _reference_estimate's, one step's
        self._old_cache: dict[tuple, Any] = {}  # per_iteration: the old policy's estimates, one step's
        self._scoring = False  # inside the step's scoring pass (per_iteration), which its own clock times
        self.push_sources = 0  # a sharded push's learner ranks that send (setup_weight_push)
        self.steps = 0
        self.clock = ActorClock(background=BACKGROUND + STAGE, within=PUSH_PARTS + TRAIN_PARTS)

    def rendezvous_address(self) -> tuple[str, int]:
        return rendezvous_address()

    def start(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Join the learner group and build the ZeRO engine (collective)."""
        t0 = time.perf_counter()
        init_learner_group(master_addr, master_port, self.rank, self.world_size, backend=self.cfg.backend,
                           timeout_s=self.cfg.dist_timeout_s)
        setup_actor_process()  # the group set-up resets DeepSpeed's log level
        policy, self.tokenizer = load_policy(self.model_cfg)
        self.pad_token_id = policy.pad_token_id
        # GRPO's KL reads the initial weights: with LoRA the frozen base is them (adapters_off), else a copy
        self.reference_is_base = _needs_reference(self.loss_cfg) and self.cfg.lora is not None
        if _needs_reference(self.loss_cfg) and not self.reference_is_base:
            self.reference, _ = load_policy(self.model_cfg.model_copy(update={"gradient_checkpointing": False}))
            self.reference.requires_grad_(False)
        self.engine = LearnerEngine(policy, self.cfg)
        if self.cfg.checkpoint.reserve:  # false where the run saves no checkpoint during training (start_actors)
            self.engine.expect_background_saves()
        if self.reference is not None:
            self.reference.to(device=self.engine.device, dtype=self.engine.dtype)
        settle_heap()  # a full collection later walks only what came after (common/gil.py)
        self.clock.add("load", time.perf_counter() - t0)
        return {"rank": self.rank, "device": str(self.engine.device), "dtype": str(self.engine.dtype),
                "start_s": time.perf_counter() - t0,
                "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None}

    # ---- one RL step ----------------------------------------------------------------------
    def train(self, groups: Sequence[Group], version: int, group_offset: int) -> StepResult:
        """μ updates on this rank's ``groups`` (collective). ``version`` is the learner version
        v_l the batch trains at; the returned ``learner/staleness_max`` is measured here, from the
        samples' own stamps, as an independent check of the coordinator's bound."""
        t0, compiled0 = time.perf_counter(), graphs_compiled()
        if self.push is not None:  # a worker that views these parameters must not read them now
            self.push.begin_update()
        optimizer_s = self.engine.optimizer_s
        try:
            with self.clock.timed("train"), profiled_step(self.steps + 1, self.rank, self.engine.module):
                per_iteration = self._updates(groups, version, group_offset)
            self.clock.add("train_optimizer", self.engine.optimizer_s - optimizer_s)
        except RuntimeError as e:  # gloo / NCCL raise RuntimeError subclasses when a peer stalls or dies
            cause = (str(e).strip().splitlines() or [""])[0][:300]
            raise RuntimeError(
                f"learner rank {self.rank} of {self.world_size}: the step at version {version} failed; a collective "
                f"that ends after learner.dist_timeout_s = {self.cfg.dist_timeout_s:.0f} s means another rank stalled "
                f"or died ({type(e).__name__}: {cause})") from e
        self.steps += 1
        out = step_stats(per_iteration)
        samples = [s for g in groups for s in g.samples]
        out["learner/staleness_max"] = Stat(max(version - s.policy_version for s in samples), Reduce.MAX)
        out["learner/samples"] = Stat(len(samples), Reduce.COUNT)
        out["learner/tokens"] = Stat(sum(s.completion_length for s in samples), Reduce.COUNT)
        out["time/train_rank"] = Stat(time.perf_counter() - t0, Reduce.MAX)
        # graphs compiled in this step, the most of any rank (common/compiling.py: zero in the steady state)
        out["learner/compiles"] = Stat(graphs_compiled() - compiled0, Reduce.MAX)
        out.update(self.engine.memory_metrics())
        with self.clock.timed("release"):
            hand_back_gpu_memory(self.share_gpu)
        return StepResult(out, self.clock.snapshot())

    def _updates(self, groups: Sequence[Group], version: int, group_offset: int) -> list[dict[str, Stat]]:
        """The μ optimizer updates of one step (every collective of the step happens in here)."""
        counts = global_counts(groups)
        mbs = micro_batches(groups, group_offset=group_offset, pad_token_id=self.pad_token_id,
                            advantage_scale=self.advantage_scale, micro_batch_size=self.micro_batch_size,
                            whole_groups=self.whole_groups, counts=counts,
                            normalisation=self.cfg.loss_normalisation, world_size=self.world_size,
                            per_forward=self.cfg.micro_batches_per_forward)
        per_iteration = []
        self._reference_cache, self._old_cache = {}, {}
        try:
            if self._scores_old():
                _settle()  # the scoring pass on the clock (train_score), not the work queued before it
                t0, self._scoring = time.perf_counter(), True
                try:
                    self.engine.evaluate(mbs, self._score_iterations)
                finally:
                    self._scoring = False
                _settle()
                self.clock.add("train_score", time.perf_counter() - t0)
            for k in range(self.inner_iterations):
                batch = [mb.for_iteration(self.estimator.masks, k, self.inner_iterations) for mb in mbs]
                per_iteration.append(self.engine.train_step(batch, self._loss))
        finally:
            self._reference_cache, self._old_cache = {}, {}
        return per_iteration

    def _scores_old(self) -> bool:
        """Whether the learner scores the old policy itself (d1's per-iteration masks, μ > 1)."""
        return getattr(self.estimator, "masks", None) == "per_iteration" and self.inner_iterations > 1

    def _score_iterations(self, model: Any, mb: MicroBatch) -> None:
        """per_iteration, before the step's first update: the old policy's estimate of ``mb`` under
        each mask its iterations read, and the reference's where the loss has a KL term (d1 scores
        both under all μ masks when it generates; a mask that two iterations read is scored once here:
        with 2 micro-batches a update and μ = 12, 6 of 12). Iteration k's loss reads them back
        (``_loss``, ``_reference_estimate``)."""
        for k in range(self.inner_iterations):
            mb_k = mb.for_iteration(self.estimator.masks, k, self.inner_iterations)
            key = _cache_key(mb_k)
            if key in self._old_cache:
                continue
            self._old_cache[key] = estimate(model, mb_k.batch, mb_k.seeds, self.estimator).detach()
            if self.reference is not None or self.reference_is_base:
                self._reference_estimate(model, mb_k)

    def _reference_estimate(self, model: Any, mb: MicroBatch) -> Any:
        """The frozen reference's estimate of ``mb`` under this iteration's masks, computed once a step
        for each (micro-batch, seeds): with masks shared across the μ iterations (``masks: shared``,
        d1's recipe) every iteration asks for the same value, and the reference never changes, so
        the 11 later ones of μ = 12 are read back instead of re-run (a forward each of the 8B model).
        With LoRA the reference is ``model`` itself with its adapters off (no second copy)."""
        key = _cache_key(mb)
        if key not in self._reference_cache:
            if not self._scoring:  # inside the scoring pass its own clock counts it
                _settle()  # the policy's queued work is not the reference's
            t0 = time.perf_counter()
            with torch.no_grad():
                if self.reference_is_base:
                    with adapters_off(model):
                        value = estimate(model, mb.batch, mb.seeds, self.estimator)
                else:
                    value = estimate(self.reference, mb.batch, mb.seeds, self.estimator)
            if not self._scoring:
                _settle()
                self.clock.add("train_score", time.perf_counter() - t0)
            self._reference_cache[key] = value
        return self._reference_cache[key]

    def _loss(self, model: Any, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, Metric]]:
        """The micro-batch's share of the global loss (``model`` is the DeepSpeed engine): one
        forward of its rows, then the loss of each of its parts (one, or the micro-batches that
        ``learner.micro_batches_per_forward`` put together), summed."""
        # the reference first: its forward's transient memory is freed before the policy's graph is built
        ref = self._reference_estimate(model, mb) if self.reference is not None or self.reference_is_base else None
        ll = estimate(model, mb.batch, mb.seeds, self.estimator)
        device = ll.sequence.device
        behaviour, behaviour_token = self._behaviour(mb, ll)
        behaviour = behaviour.to(device)
        if ll.elbo is not None:  # SPG sandwich: ratios compare ELBOs (module docstring)
            behaviour = behaviour + (ll.sequence - ll.elbo).detach()
        rows = dict(
            logp=ll.sequence, behaviour_logp=behaviour, advantages=mb.batch.advantages.to(device),
            group_index=mb.group_index.to(device), completion_length=mb.completion_length.to(device),
            token_logp=ll.token, token_mask=None if ll.token is None else ll.token_mask.to(device),
            behaviour_token_logp=None if ll.token is None or behaviour_token is None
            else behaviour_token.to(device),
            ref_logp=None if ref is None else ref.ratio_value, ref_token_logp=None if ref is None else ref.token,
            elbo=ll.ratio_value,
        )
        total, metrics = None, {}
        for part in mb.loss_parts():
            inputs = LossInputs(
                **{k: None if v is None else v[part.rows] for k, v in rows.items()},
                num_groups=part.counts["num_groups"].to(device), num_samples=part.counts["num_samples"].to(device),
                num_tokens=part.counts["num_tokens"].to(device),
            )
            loss, part_metrics = compute_loss(inputs, self.loss_cfg)
            total = loss if total is None else total + loss
            _add_metrics(metrics, _engine_metrics(part_metrics, part.share))
        return total, metrics

    def _behaviour(self, mb: MicroBatch, ll: Any) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(sequence, token) estimates the ratios compare with: the rollout's, or under per_iteration
        the old policy's under this iteration's mask (the new estimate detached when μ = 1)."""
        if getattr(self.estimator, "masks", None) != "per_iteration":
            return mb.behaviour_logp, mb.behaviour_token_logp
        old = self._old_cache[_cache_key(mb)] if self._scores_old() else ll.detach()
        return old.ratio_value, old.token

    # ---- weights, checkpoints, export -----------------------------------------------------
    def setup_weight_push(self, cfg: WeightPushConfig, **kwargs: Any) -> None:
        """Rank 0 builds the sending end; the other ranks only take part in the gathers. A sharded
        push (``sources`` S >= 1, common/transport/shards.py): ranks 0..S-1 each build an end of
        their own (group rank = learner rank), the others take no part."""
        if self.push is not None:
            self.push.close()
        self.push_sources = sources = kwargs.get("sources", 0)
        # ipc: every rank sends to the worker on its own device (sharded under ZeRO-3: common/transport/ipc.py)
        member = self.rank < sources if sources else (self.rank == 0 or cfg.backend == "ipc")
        self.push = setup_weight_push(cfg, **{**kwargs, "rank": self.rank if sources else 0}) if member else None

    def push_weights(self, version: int) -> Optional[WeightHandle]:
        """Send the weights as ``version`` through this rank's end of the push (``send_weights``: the
        transport reads them gathered, as this rank's partitions or in place). A rank without an end
        joins rank 0's ZeRO-3 gathers of a gathered push, and has nothing to do in a sharded one."""
        timer = PushTimer(self.clock)
        handle = None
        with timer.part(), prompt_gil():  # beside a checkpoint's writer thread (common/gil.py)
            with timer.part("pending"):  # GPU work the step left queued, so it is not billed below
                settle_gpu(self.engine.device)
            if self.push is None and self.push_sources:  # ZeRO-1/2 sharded: rank 0 sends alone
                return None
            with timer.part("send"):  # the ZeRO-3 gathers and the copies or sends, settled
                if self.push is not None:
                    handle = self.push.send_weights(self.engine, version)
                else:
                    for _ in self.engine.named_parameters_for_push():
                        pass
                settle_gpu(self.engine.device)
            timer.transfer(self.push)  # push_wait: a part of push_send
            with timer.part("release"):
                hand_back_gpu_memory(self.share_gpu)  # the gathered buckets
        return handle

    def parameter_shapes(self) -> dict[str, list[int]]:
        """Full shape of every parameter (ZeRO-3 partitions report their unpartitioned ``ds_shape``),
        recorded with a checkpoint so that a resume into another model is refused."""
        return {
            name: list(getattr(p, "ds_shape", None) or p.shape) for name, p in self.engine.module.named_parameters()
        }

    def save_checkpoint(self, directory: str, client_state: dict, tag: str, background: bool = False) -> str:
        """DeepSpeed checkpoint of this rank (collective). ``background``: its files are written by
        a child process of this rank while training goes on, which leaves a marker file once they
        are durable (learner/checkpoint_process.py)."""
        with self.clock.timed("checkpoint"):
            try:
                if background:
                    return self.engine.save_checkpoint_async(directory, client_state, tag=tag,
                                                             on_written=self._checkpoint_written)
                return self.engine.save_checkpoint(directory, client_state, tag=tag)
            except Exception as e:  # a full disk reads "unexpected pos 6144 vs 6038" from torch's writer: say so
                cause = disk_cause(os.path.join(directory, tag), e)
                if cause is e:
                    raise
                raise cause from e

    def _checkpoint_written(self, seconds: float) -> None:
        """The background save's seconds (its thread's, from the save to the marker) and, within
        them, its copy to host memory (what the next optimizer step may wait for)."""
        self.clock.add("checkpoint_write", seconds)
        snapshot_s = self.engine.writer.snapshot_s
        if snapshot_s is not None:
            self.clock.add("checkpoint_snapshot", snapshot_s)

    def load_checkpoint(self, directory: str, tag: Optional[str] = None, seed: int = 0) -> dict:
        """Restore this rank (collective); a checkpoint of another rank count or ZeRO stage is
        re-sharded (learner/reshard.py), its RNG streams derived from (``seed``, step, rank)."""
        with self.clock.timed("load"):
            return self.engine.load_checkpoint(directory, tag, seed)

    def resharded_from(self) -> Optional[tuple[int, int]]:
        """(ranks, ZeRO stage) the loaded checkpoint was written at, if not this engine's."""
        return self.engine.resharded_from

    def export(self, directory: str, adapter_directory: Optional[str] = None) -> Optional[str]:
        """Write the policy in its family's released format (common/models/export.py; LoRA: the
        adapters merged in fp32, rounded once) and, with ``adapter_directory`` (a LoRA run), the
        adapters themselves as a PEFT folder for the base model: rank 0 writes, every rank gathers."""
        state = self.engine.state_dict_for_export()
        adapters = self.engine.adapters_for_export() if adapter_directory is not None else None
        if state is None:
            return None
        policy, tokenizer = load_policy(self.model_cfg.model_copy(update={"gradient_checkpointing": False}))
        missing = sorted(set(dict(policy.named_parameters())) - set(state))
        if missing:
            raise RuntimeError(
                f"export: {len(missing)} parameters missing from the gathered weights, e.g. {missing[:3]}"
            )
        policy.load_state_dict(state, strict=False)  # buffers (rotary tables) are rebuilt, not trained
        export_policy(policy, tokenizer, Path(directory), self.model_cfg)
        if adapters is not None:
            lora = self.cfg.lora
            pairs = {name.removeprefix("model.").removesuffix(".lora_A"): (t, adapters[name[: -len("A")] + "B"])
                     for name, t in adapters.items() if name.endswith(".lora_A")}
            export_adapters(Adapters(lora.rank, lora.alpha, pairs), Path(adapter_directory), self.model_cfg,
                            policy.spec.name)
        return str(directory)


def _cache_key(mb: MicroBatch) -> tuple:
    """A step's cache key of a micro-batch's estimate under its seeds (its rows: the batch object)."""
    return (id(mb.batch), tuple(mb.seeds.tolist()))


def _settle() -> None:
    """Wait for this process's queued GPU work (a no-op without CUDA), so that a host clock times what follows."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _needs_reference(loss: Any) -> bool:
    base = getattr(loss, "base", None)
    return getattr(loss, "kl_beta", 0.0) > 0 or (base is not None and _needs_reference(base))


def _engine_metrics(metrics: dict[str, Metric], share: float) -> dict[str, Metric]:
    """Loss metrics as LearnerEngine combines them over micro-batches and ranks: shares and
    extremes as they are; a row statistic (``mean``) weighted by the micro-batch's share of the
    step's rows, so that the sum over the step is a row-weighted mean."""
    return {key: Metric(m.value * share, Reduce.SHARE) if m.reduce is Reduce.MEAN else m for key, m in metrics.items()}


def _add_metrics(into: dict[str, Metric], metrics: dict[str, Metric]) -> None:
    """Engine metrics of two parts of one forward as the engine would combine two micro-batches'."""
    for key, m in metrics.items():
        if key not in into:
            into[key] = m
        elif m.reduce is Reduce.SHARE:
            into[key] = Metric(into[key].value + m.value, Reduce.SHARE)
        else:
            pick = torch.maximum if m.reduce is Reduce.MAX else torch.minimum
            into[key] = Metric(pick(torch.as_tensor(into[key].value), torch.as_tensor(m.value)), m.reduce)


def step_stats(per_iteration: list[dict[str, Stat]]) -> dict[str, Stat]:
    """One record per step from the inner iterations' records, each value by its own reduction
    (common/stats.py); the grad norm also as its max, the loss also as its first iteration's value."""
    out = combine(per_iteration, across="iterations")
    out["train/grad_norm_max"] = Stat(max(m["train/grad_norm"] for m in per_iteration), Reduce.MAX, replicated=True)
    out["train/loss_first"] = Stat(per_iteration[0]["train/loss"], replicated=True)
    return out

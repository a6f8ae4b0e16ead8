"""A learner rank's share of a step: micro-batch cuts, step-global counts and shares, the metric
forms the engine reduces, and the SPG-sandwich ratio correction in the learner's loss."""
from __future__ import annotations

import pytest
import torch

from stabledrl.common.config.estimator import BlockRandomConfig, SPGSandwichConfig
from stabledrl.common.config.learner import LearnerConfig
from stabledrl.common.config.loss import StableDrlLossConfig
from stabledrl.common.config.model import ModelConfig
from stabledrl.common.stats import Stat
from stabledrl.common.estimators import estimate
from stabledrl.common.models import load_policy
from stabledrl.common.types import Group, Sample, collate_samples
from stabledrl.learner.losses import Metric, Reduce
from stabledrl.learner.rl_batch import _cuts, global_counts, micro_batch_count, micro_batches
from stabledrl.learner.worker import LearnerWorker, _engine_metrics, step_stats


def groups(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for k, size in enumerate(sizes):
        samples = []
        for i in range(size):
            completion = torch.randint(4, 40, (4,), generator=g)
            length = int(torch.randint(1, 5, (1,), generator=g))
            samples.append(Sample(sample_id=f"q{k}/{i}", prompt_id=f"q{k}", index=i,
                                  prompt_ids=torch.randint(4, 40, (2 + k % 3,), generator=g), completion_ids=completion,
                                  completion_length=length, reward=float(torch.rand(1, generator=g)),
                                  behaviour_logp=-float(torch.rand(1, generator=g)), mask_seed=100 * k + i))
        out.append(Group(f"q{k}", samples))
    return out


def test_cuts_keep_groups_whole_or_cut_rows():
    assert _cuts([4, 4, 4], 8, whole_groups=True) == [(0, 8), (8, 12)]
    assert _cuts([4, 4, 4], 6, whole_groups=True) == [(0, 4), (4, 8), (8, 12)]
    assert _cuts([4, 4, 4], 2, whole_groups=True) == [(0, 4), (4, 8), (8, 12)]  # never splits a group
    assert _cuts([4, 4, 4], 5, whole_groups=False) == [(0, 5), (5, 10), (10, 12)]


def test_micro_batches_carry_step_counts_and_shares_summing_to_one():
    gs = groups([3, 4, 2])
    counts = global_counts(gs)  # no process group: the local counts are the step's
    assert float(counts["num_groups"]) == 3 and float(counts["num_samples"]) == 9
    assert float(counts["num_tokens"]) == sum(s.completion_length for g in gs for s in g.samples)
    mbs = micro_batches(gs, group_offset=10, pad_token_id=0, advantage_scale="none", micro_batch_size=5,
                        whole_groups=True, counts=counts)
    assert [len(mb.mask_seeds) for mb in mbs] == [3, 4, 2]
    assert [(mb.unit, mb.units) for mb in mbs] == [(0, 3), (1, 3), (2, 3)]
    assert micro_batch_count([3, 4, 2], 5, whole_groups=True) == 3
    assert sum(mb.share for mb in mbs) == pytest.approx(1.0)
    assert torch.equal(torch.cat([mb.group_index for mb in mbs]), torch.tensor([10] * 3 + [11] * 4 + [12] * 2))
    for mb in mbs:  # group-relative advantages: each group's sum is 0
        assert float(mb.batch.advantages.sum()) == pytest.approx(0.0, abs=1e-6)
        assert mb.behaviour_token_logp is None
    assert torch.equal(mbs[0].for_iteration("shared", 3).seeds, mbs[0].mask_seeds)
    assert not torch.equal(mbs[0].for_iteration("independent", 1).seeds, mbs[0].for_iteration("independent", 0).seeds)


def test_metrics_combine_by_their_reduction_not_their_name():
    metrics = {"loss/policy": Metric.share(torch.tensor(0.5)), "ratio/max": Metric.max(torch.tensor(3.0)),
               "log_ratio/min": Metric.min(torch.tensor(-1.0)), "odd/max_name": Metric.mean(torch.tensor(0.7)),
               "ratio/mean": Metric.mean(torch.tensor(2.0))}
    sent = _engine_metrics(metrics, share=0.25)  # what the engine adds up over micro-batches and ranks
    assert set(sent) == set(metrics)
    assert sent["ratio/mean"] == Metric(torch.tensor(0.5), Reduce.SHARE) and sent["loss/policy"].value == 0.5
    assert sent["odd/max_name"].reduce is Reduce.SHARE and float(sent["odd/max_name"].value) == pytest.approx(0.175)
    assert sent["ratio/max"].reduce is Reduce.MAX and sent["log_ratio/min"].reduce is Reduce.MIN
    # what the engine returns for two inner iterations: each value carries its reduction (common/stats.py)
    same = lambda v, r=Reduce.MEAN: Stat(v, r, replicated=True)  # noqa: E731
    engine_out = [{"train/loss": same(1.0), "train/grad_norm": same(2.0), "train/ratio/max": same(3.0, Reduce.MAX),
                   "train/ratio/mean": same(1.0, Reduce.SHARE), "train/odd/max_name": same(1.0, Reduce.SHARE),
                   "train/skipped": same(0.0, Reduce.COUNT), "train/skipped_total": same(0.0, Reduce.LAST)},
                  {"train/loss": same(3.0), "train/grad_norm": same(5.0), "train/ratio/max": same(4.0, Reduce.MAX),
                   "train/ratio/mean": same(2.0, Reduce.SHARE), "train/odd/max_name": same(2.0, Reduce.SHARE),
                   "train/skipped": same(1.0, Reduce.COUNT), "train/skipped_total": same(1.0, Reduce.LAST)}]
    combined = step_stats(engine_out)
    assert combined["train/ratio/max"] == 4.0 and combined["train/ratio/mean"] == 1.5
    assert combined["train/odd/max_name"] == 1.5  # a name ending in max means nothing: its reduction decides
    assert combined["train/loss"] == 2.0 and combined["train/loss_first"] == 1.0
    assert combined["train/grad_norm_max"] == 5.0 and combined["train/skipped"] == 1.0
    assert combined["train/skipped_total"] == 1.0


def test_sandwich_ratios_compare_elbos_while_the_loss_reads_the_sandwich():
    """Behaviour = block_random's ELBO under the same weights and shared masks: every importance
    ratio must be exactly 1 although the sandwich value differs from the ELBO for A <= 0."""
    model = ModelConfig(preset="tiny-llada")
    sandwich = SPGSandwichConfig(block_length=4, num_draws=2, masks="shared")
    worker = LearnerWorker(0, 1, model, LearnerConfig(), sandwich, StableDrlLossConfig(), inner_iterations=1,
                           advantage_scale="none", micro_batch_size=64)
    policy, _ = load_policy(model)
    gs = groups([4, 4])
    samples = [s for g in gs for s in g.samples]
    behaviour = estimate(policy, collate_samples(samples, 0), [s.mask_seed for s in samples],
                         BlockRandomConfig(**{k: v for k, v in sandwich.model_dump().items()
                                              if k in BlockRandomConfig.model_fields and k != "name"}))
    for s, value in zip(samples, behaviour.sequence.tolist()):
        s.behaviour_logp = value
    mb = micro_batches(gs, group_offset=0, pad_token_id=0, advantage_scale="none", micro_batch_size=64,
                       whole_groups=True, counts=global_counts(gs))[0]
    loss, metrics = worker._loss(policy, mb)
    assert float(metrics["log_ratio/max"].value) == pytest.approx(0.0, abs=1e-5)
    assert float(metrics["log_ratio/min"].value) == pytest.approx(0.0, abs=1e-5)
    assert loss.requires_grad


def test_micro_batches_take_groups_by_prompt_length_and_need_no_mask_then():
    from stabledrl.common.estimators import build_inputs

    gs = groups([4, 4, 4, 4], seed=3)  # prompt lengths 2, 3, 4, 2 (k % 3)
    counts = global_counts(gs)
    mbs = micro_batches(gs, group_offset=0, pad_token_id=0, advantage_scale="none", micro_batch_size=8,
                        whole_groups=True, counts=counts)
    # groups 0 and 3 share a prompt length: one micro-batch without padding, then groups 1 and 2
    assert [sorted(set(mb.group_index.tolist())) for mb in mbs] == [[0, 3], [1, 2]]
    assert bool(mbs[0].batch.prompt_mask.all()) and not bool(mbs[1].batch.prompt_mask.all())
    policy, _ = load_policy(ModelConfig(preset="tiny-llada"))
    p = mbs[0].batch.prompt_width
    unpadded = build_inputs(policy, mbs[0].batch.input_ids[:, :p], mbs[0].batch.prompt_mask,
                            mbs[0].batch.completion_ids, mbs[0].batch.completion_ids)
    padded = build_inputs(policy, mbs[1].batch.input_ids[:, :mbs[1].batch.prompt_width], mbs[1].batch.prompt_mask,
                          mbs[1].batch.completion_ids, mbs[1].batch.completion_ids)
    assert unpadded[1] is None and padded[1] is not None
    # every sample exactly once, with its own group's index, and advantages still group-relative
    seen = sorted(int(s) for mb in mbs for s in mb.mask_seeds)
    assert seen == sorted(s.mask_seed for g in gs for s in g.samples)
    assert all(int(s) // 100 == int(g) for mb in mbs for s, g in zip(mb.mask_seeds, mb.group_index))
    per_group = {int(g): float(mb.batch.advantages[mb.group_index == g].sum()) for mb in mbs for g in mb.group_index}
    assert all(v == pytest.approx(0.0, abs=1e-6) for v in per_group.values())


def test_an_unpadded_forward_without_mask_scores_as_with_the_full_mask():
    from stabledrl.common.attention import full_mask
    from stabledrl.common.estimators import build_inputs

    for preset in ("tiny-llada", "tiny-dream"):
        policy, _ = load_policy(ModelConfig(preset=preset))
        ids = torch.randint(4, 40, (3, 12), generator=torch.Generator().manual_seed(0))
        prompt_mask = torch.ones(3, 5, dtype=torch.bool)
        inputs, mask, positions, start = build_inputs(policy, ids[:, :5], prompt_mask, ids[:, 5:], ids[:, 5:])
        assert mask is None
        with torch.no_grad():
            free = policy(inputs, attention_mask=None, position_ids=positions, logits_from=start).logits
            masked = policy(inputs, attention_mask=full_mask(torch.ones(3, 12, dtype=torch.bool)),
                            position_ids=positions, logits_from=start).logits
        assert torch.allclose(free, masked, atol=1e-6)


def _d1_shaped_groups(seed=0, width=256):
    """4 groups of 6 (d1's per-device micro-batch) whose completions total 168, 549, 1339, 1020 tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k, total in enumerate((168, 549, 1339, 1020)):
        lengths = [total // 6 + (1 if i < total % 6 else 0) for i in range(6)]
        samples = [Sample(sample_id=f"q{k}/{i}", prompt_id=f"q{k}", index=i, prompt_ids=torch.full((3 + k,), 5),
                          completion_ids=torch.randint(4, 40, (width,), generator=g), completion_length=n,
                          reward=float(torch.randint(0, 3, (1,), generator=g)),
                          behaviour_token_logp=-torch.rand(width, generator=g), mask_seed=k * 10 + i)
                   for i, n in enumerate(lengths)]
        out.append(Group(f"q{k}", samples))
    return out


def _token_logp(theta, mb, width=256):
    feats = torch.sin(mb.batch.completion_ids[:, :width, None].float() * torch.arange(1, 4).float())  # [b, C, 3]
    return -torch.nn.functional.softplus(feats @ theta)  # [b, C]


def _project_grad(theta, ranks, normalisation):
    from stabledrl.common.config.loss import GrpoLossConfig
    from stabledrl.learner.losses import LossInputs, compute_loss

    total = 0.0
    for rank_groups in ranks:
        counts = global_counts([g for r in ranks for g in r])  # the step's counts over both "ranks"
        mbs = micro_batches(rank_groups, group_offset=0, pad_token_id=0, advantage_scale="none", micro_batch_size=6,
                            whole_groups=False, counts=counts, normalisation=normalisation, world_size=len(ranks))
        for mb in mbs:
            logp = _token_logp(theta, mb)
            mask = torch.arange(logp.shape[1])[None, :] < mb.completion_length[:, None]
            inputs = LossInputs(logp=(logp * mask).sum(1), behaviour_logp=mb.behaviour_logp,
                                advantages=mb.batch.advantages, group_index=mb.group_index,
                                completion_length=mb.completion_length, num_groups=mb.counts["num_groups"],
                                num_samples=mb.counts["num_samples"], num_tokens=mb.counts["num_tokens"],
                                token_logp=logp, token_mask=mask, behaviour_token_logp=mb.behaviour_token_logp)
            total = total + compute_loss(inputs, GrpoLossConfig(level="token", kl_beta=0.0, clip_eps=0.2)).loss
    return torch.autograd.grad(total, theta)[0]


def _d1_grad(theta, ranks):
    """d1's update: per micro-batch (per_token_loss · mask).sum() / mask.sum(), averaged over the
    gradient-accumulation micro-batches of a rank, then over ranks (DDP)."""
    rank_losses = []
    for rank_groups in ranks:
        counts = global_counts(rank_groups)
        mbs = micro_batches(rank_groups, group_offset=0, pad_token_id=0, advantage_scale="none", micro_batch_size=6,
                            whole_groups=False, counts=counts)
        per_mb = []
        for mb in mbs:
            logp = _token_logp(theta, mb)
            mask = (torch.arange(logp.shape[1])[None, :] < mb.completion_length[:, None]).float()
            ratio = torch.exp(logp - mb.behaviour_token_logp)
            adv = mb.batch.advantages[:, None]
            per_token_loss = -torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)
            per_mb.append((per_token_loss * mask).sum() / mask.sum())
        rank_losses.append(torch.stack(per_mb).mean())
    return torch.autograd.grad(torch.stack(rank_losses).mean(), theta)[0]


@pytest.mark.parametrize("num_ranks", [1, 2])
def test_micro_batch_normalisation_gives_d1s_gradient(num_ranks):
    gs = _d1_shaped_groups()
    ranks = [gs] if num_ranks == 1 else [[gs[0], gs[2]], [gs[1], gs[3]]]
    theta = torch.tensor([0.3, -0.2, 0.5], requires_grad=True)
    reference = _d1_grad(theta, ranks)
    torch.testing.assert_close(_project_grad(theta, ranks, "micro_batch"), reference, rtol=1e-5, atol=1e-7)
    step = _project_grad(theta, ranks, "step")  # the default weighs every token of the step alike
    assert not torch.allclose(step, reference, rtol=0.02)


def test_unknown_loss_normalisation_is_refused():
    gs = groups([2])
    with pytest.raises(ValueError, match="valid: step, micro_batch"):
        micro_batches(gs, group_offset=0, pad_token_id=0, advantage_scale="none", micro_batch_size=2,
                      whole_groups=False, counts=global_counts(gs), normalisation="sequence")
    assert LearnerConfig().loss_normalisation == "step"


@pytest.mark.parametrize("masks, reference_forwards", [("shared", 2), ("independent", 6)])
def test_the_reference_runs_once_a_step_when_every_iteration_shares_its_masks(masks, reference_forwards):
    """GRPO's KL reads the frozen reference's estimate under each iteration's masks. With masks shared
    over the μ iterations (d1's recipe) it is the same value every time: 2 micro-batches x μ = 3
    iterations run the reference twice, not 6 times; with fresh masks per iteration, 6 times. Either
    way each iteration's loss equals the one computed with the reference run afresh."""
    from stabledrl.common.config.estimator import MeanFieldConfig
    from stabledrl.common.config.loss import GrpoLossConfig

    model = ModelConfig(preset="tiny-llada")
    estimator = MeanFieldConfig(masks=masks)
    worker = LearnerWorker(0, 1, model, LearnerConfig(), estimator, GrpoLossConfig(kl_beta=0.04),
                           inner_iterations=3, advantage_scale="none", micro_batch_size=4)
    policy, _ = load_policy(model)
    worker.reference, _ = load_policy(model.model_copy(update={"seed": 7}))  # another init: a nonzero KL
    calls, order = [], []
    worker.reference.register_forward_hook(lambda *_: calls.append(1))
    worker.reference.register_forward_hook(lambda *_: order.append("reference"))
    policy.register_forward_hook(lambda *_: order.append("policy"))
    gs = groups([4, 4])

    class Engine:  # the engine's part in _updates: every micro-batch's loss, in order
        def __init__(self):
            self.losses = []

        def train_step(self, mbs, loss_fn):
            self.losses.append([float(loss_fn(policy, mb)[0]) for mb in mbs])
            return {}

    worker.engine, worker.pad_token_id = Engine(), 0
    worker._updates(gs, version=0, group_offset=0)
    assert len(calls) == reference_forwards and worker._reference_cache == {}
    assert order[:2] == ["reference", "policy"]  # the reference's forward is over before the policy's graph grows
    mbs = micro_batches(gs, group_offset=0, pad_token_id=0, advantage_scale="none", micro_batch_size=4,
                        whole_groups=True, counts=global_counts(gs))
    for k, losses in enumerate(worker.engine.losses):
        for mb, cached in zip(mbs, losses):
            worker._reference_cache = {}  # afresh: the reference estimated again for this iteration
            assert float(worker._loss(policy, mb.for_iteration(masks, k))[0]) == pytest.approx(cached, rel=1e-6)


@pytest.mark.parametrize("normalisation", ["micro_batch", "step"])
def test_micro_batches_forwarded_together_give_the_separate_forwards_update(normalisation):
    """learner.micro_batches_per_forward = 2: the rows of two micro-batches (prompts of different
    lengths: left padding) in one forward, each micro-batch's loss with its own counts. The loss,
    the gradient and the metrics the engine receives are those of the two forwards apart."""
    from stabledrl.common.config.estimator import MeanFieldConfig
    from stabledrl.common.config.loss import GrpoLossConfig
    from stabledrl.learner.worker import _add_metrics

    model = ModelConfig(preset="tiny-llada", dtype="float32")
    estimator = MeanFieldConfig(masks="shared")
    gs = groups([3, 3, 3, 3], seed=5)  # prompt lengths 2, 3, 4, 2
    for g in gs:
        for s in g.samples:
            s.behaviour_token_logp = -torch.rand(4, generator=torch.Generator().manual_seed(s.mask_seed))
    worker = LearnerWorker(0, 1, model, LearnerConfig(loss_normalisation=normalisation), estimator,
                           GrpoLossConfig(kl_beta=0.0, level="token"), inner_iterations=1, advantage_scale="none",
                           micro_batch_size=3)
    results = []
    for per_forward in (1, 2):
        policy, _ = load_policy(model)
        cut = dict(group_offset=0, pad_token_id=0, advantage_scale="none", micro_batch_size=3, whole_groups=False,
                   counts=global_counts(gs), normalisation=normalisation, per_forward=per_forward)
        mbs = micro_batches(gs, **cut)
        assert len(mbs) == 4 // per_forward
        total, metrics = 0.0, {}
        for mb in mbs:
            loss, m = worker._loss(policy, mb)
            loss.backward()
            total += float(loss)
            _add_metrics(metrics, m)
        grad = torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])
        results.append((total, grad, {k: float(v.value) for k, v in metrics.items()}))
    (loss1, grad1, m1), (loss2, grad2, m2) = results
    assert loss2 == pytest.approx(loss1, rel=1e-5) and loss1 != 0.0
    torch.testing.assert_close(grad2, grad1, rtol=1e-4, atol=1e-7)
    assert m1.keys() == m2.keys() and all(m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6) for k in m1)


def test_lora_reference_is_the_frozen_base_with_its_adapters_off():
    """With LoRA the KL reference is the policy's own base (no second copy of the model): after the
    adapters moved, the estimate with them off equals the initial model's, gradients still reach
    the adapters afterwards, and the worker loads no reference model."""
    from stabledrl.common.config.estimator import MeanFieldConfig
    from stabledrl.common.config.learner import LoraConfig
    from stabledrl.common.config.loss import GrpoLossConfig
    from stabledrl.learner.lora import adapters_off, add_adapters

    model = ModelConfig(preset="tiny-llada", dtype="float32")
    policy, _ = load_policy(model)
    initial, _ = load_policy(model)
    adapted = add_adapters(policy, LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "up_proj"]))
    with torch.no_grad():
        for a in adapted:
            a.lora_B.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    gs = groups([4])
    mb = micro_batches(gs, group_offset=0, pad_token_id=0, advantage_scale="none", micro_batch_size=4,
                       whole_groups=False, counts=global_counts(gs))[0]
    estimator = MeanFieldConfig()
    with torch.no_grad():
        base = estimate(initial, mb.batch, mb.seeds, estimator).sequence
        adapted_value = estimate(policy, mb.batch, mb.seeds, estimator).sequence
        with adapters_off(policy):
            off = estimate(policy, mb.batch, mb.seeds, estimator).sequence
    torch.testing.assert_close(off, base)
    assert not torch.allclose(adapted_value, base, atol=1e-3)
    assert all(a.lora_A.requires_grad and a.lora_B.requires_grad for a in adapted)

    worker = LearnerWorker(0, 1, model, LearnerConfig(lora=LoraConfig(rank=4)), estimator,
                           GrpoLossConfig(kl_beta=0.04), inner_iterations=1, advantage_scale="none",
                           micro_batch_size=4)
    worker.reference_is_base = True  # what start() sets for a LoRA job with a KL term
    assert worker.reference is None
    ref = worker._reference_estimate(policy, mb)
    torch.testing.assert_close(ref.sequence, base)
    loss, metrics = worker._loss(policy, mb)
    loss.backward()
    assert float(metrics["kl/k3_mean"].value) > 0 and all(a.lora_B.grad is not None for a in adapted)


def test_a_step_reports_the_graphs_it_compiled():
    """``learner/compiles``: the graphs torch.compile built during the step (common/compiling.py), so a
    recompilation in the steady state shows in the job's metrics. Here the step's work is one compiled
    function: its first shape compiles, the same shape again does not."""
    worker = LearnerWorker(0, 1, ModelConfig(preset="tiny-llada"), LearnerConfig(), BlockRandomConfig(),
                           StableDrlLossConfig(), inner_iterations=1, advantage_scale="none", micro_batch_size=4)
    double = torch.compile(lambda x: x * 2 + 1)

    class Engine:  # what train reads of the engine besides _updates
        module, optimizer_s = None, 0.0

        def memory_metrics(self):
            return {}

    def updates(*args, **kwargs):
        double(torch.ones(3))
        return [{"train/loss": Stat(0.5, replicated=True), "train/grad_norm": Stat(1.0, replicated=True)}]

    worker.engine, worker._updates = Engine(), updates
    counts = [float(worker.train(groups([2]), version=0, group_offset=0).metrics["learner/compiles"])
              for _ in range(2)]
    assert counts[0] >= 1 and counts[1] == 0

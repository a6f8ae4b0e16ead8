"""``estimator.masks: per_iteration``: d1's masks, a new one at every inner iteration, under which the
old and the reference policy are scored before the step's first update.

The d1 figures were printed by tests/parity/d1_masks.py, which ran d1's own ``forward_process``,
``_get_per_token_logps`` and ``compute_loss`` (dllm-reasoning/d1, diffu-grpo/diffu_grpo_trainer.py)
on the tiny fp32 LLaDA and micro-batch of ``tiny_case()``, with the seeds below as its mask seeds
(CPU); no code of d1 is used here."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from stabledrl.common.config.estimator import ElboMCConfig, MeanFieldConfig
from stabledrl.common.estimators import distinct_iteration_masks, learner_seeds, per_iteration_index
from stabledrl.common.estimators.base import PER_ITERATION_SEEDS
from stabledrl.common.estimators.mean_field import mean_field_views
from stabledrl.common.types import collate_samples

_spec = importlib.util.spec_from_file_location("d1_masks_parity",
                                               Path(__file__).resolve().parents[2] / "parity" / "d1_masks.py")
parity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parity)

SEEDS = [[1426, 1402, 1753, 2077], [3848, 1343, 3332, 1915]]  # each micro-batch's μ = 4 seeds, by mask index
D1_INDEX = [[1, 2], [3, 0], [1, 2], [3, 0]]  # the mask index d1's counters read, [iteration][micro-batch]
D1_MASKS = [  # prompt positions d1's forward_process masked, [iteration][micro-batch][row]
    [[[1], [6], [0, 7], [4, 5, 8], [8], [6]], [[1], [2, 4], [6], [6, 7], [1, 8], [6]]],
    [[[0, 1], [], [], [3, 7], [0, 7], [3, 7, 8]], [[1, 5, 7], [], [1], [], [2, 4], [0, 4]]],
    [[[1], [6], [0, 7], [4, 5, 8], [8], [6]], [[1], [2, 4], [6], [6, 7], [1, 8], [6]]],
    [[[0, 1], [], [], [3, 7], [0, 7], [3, 7, 8]], [[1, 5, 7], [], [1], [], [2, 4], [0, 4]]],
]
D1_LOSSES = [0.06428609043359756, -0.010587252676486969, -0.045657381415367126, -0.025632403790950775]
D1_WEIGHTS = 14881.421029786581  # Σ|w| after the 4 SGD updates
# d1's index over a round of μ = 12 with its gradient accumulation 2, [update][micro-step]
D1_INDEX_MU12 = [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 0]] * 2


def test_a_step_under_per_iteration_masks_is_d1s():
    """Two of d1's micro-batches, μ = 4, d1's own counters on its side: the same mask index and masks
    at every (iteration, micro-batch); each iteration's loss (ratio to the old policy and KL to the
    reference, both under that iteration's mask, scored before the first update) and the weights
    after the four updates are d1's. Each micro-batch meets 2 of its 4 masks, so the scoring pass
    runs the old policy 4 times, not 8."""
    ours = parity.project_figures(4)
    assert ours["seeds"] == SEEDS
    assert ours["index"] == D1_INDEX
    assert ours["masks"] == D1_MASKS
    assert ours["losses"] == pytest.approx(D1_LOSSES, rel=1e-5)
    assert ours["weights"] == pytest.approx(D1_WEIGHTS, rel=1e-9)
    assert ours["scoring_forwards"] == 2 * distinct_iteration_masks(2, 4) == 4


def test_the_mask_index_is_d1s_counters():
    assert [[per_iteration_index(k, m, 2, 12) for m in range(2)] for k in range(12)] == D1_INDEX_MU12
    assert distinct_iteration_masks(2, 12) == 6 and distinct_iteration_masks(1, 12) == 12
    assert distinct_iteration_masks(3, 12) == 4 and distinct_iteration_masks(2, 1) == 1
    # one micro-batch a update (gradient accumulation 1): every mask once, from the second on
    assert [per_iteration_index(k, 0, 1, 4) for k in range(4)] == [1, 2, 3, 0]


def test_per_iteration_seeds_are_one_per_micro_batch_and_iteration_in_d1s_range():
    seeds = [learner_seeds([5, 6, 7], "per_iteration", k) for k in range(12)]
    assert all(len(set(s.tolist())) == 1 and 0 <= int(s[0]) < PER_ITERATION_SEEDS for s in seeds)
    assert len({int(s[0]) for s in seeds}) > 6  # fresh masks across iterations
    assert torch.equal(learner_seeds([5, 6, 7], "per_iteration", 3), seeds[3])  # a function of the rows alone
    assert not torch.equal(learner_seeds([5, 6, 8], "per_iteration", 3), seeds[3])


def test_each_micro_batch_of_a_forward_draws_its_own_stream():
    """learner.micro_batches_per_forward = 2: the two micro-batches of one forward draw the masks they
    draw apart (each its own seed and stream, its own left-padded width), even when their seeds are equal."""
    from stabledrl.learner.rl_batch import global_counts, micro_batches

    from test_learner_batch import groups  # noqa: PLC0415 (tests/unit/learner is on sys.path under pytest)

    gs = groups([3, 3], seed=5)  # prompt lengths 2 and 3: the forward pads the first
    estimator = MeanFieldConfig(masks="per_iteration", prompt_mask_prob=0.5)
    cut = dict(group_offset=0, pad_token_id=0, advantage_scale="none", micro_batch_size=3, whole_groups=False,
               counts=global_counts(gs))
    joint = micro_batches(gs, per_forward=2, **cut)[0].for_iteration("per_iteration", 2, 12)
    apart = [mb.for_iteration("per_iteration", 2, 12) for mb in micro_batches(gs, **cut)]

    def assert_drawn_apart(seeds, seeds_apart):
        views = mean_field_views(joint.batch, seeds, estimator)
        for j, (mb, own_seeds) in enumerate(zip(apart, seeds_apart)):
            own = mean_field_views(mb.batch, own_seeds, estimator)
            for r in range(3):
                real = joint.batch.prompt_mask[3 * j + r]
                assert views.prompt[3 * j + r, 0, real].tolist() == own.prompt[r, 0, mb.batch.prompt_mask[r]].tolist()

    assert (joint.seeds // PER_ITERATION_SEEDS).tolist() == [0, 0, 0, 1, 1, 1]  # part j numbered j
    assert_drawn_apart(joint.seeds, [mb.seeds for mb in apart])
    same = joint.seeds.clone()
    same[3:] = same[0] + PER_ITERATION_SEEDS  # the second micro-batch drew the first one's seed
    assert_drawn_apart(same, [apart[0].seeds, apart[0].seeds])


@pytest.mark.parametrize("groups, iterations, scored", [(1, 3, 3), (2, 4, 4), (2, 12, 12)])
def test_old_and_reference_are_scored_once_per_mask_before_the_first_update(groups, iterations, scored):
    """Before any update the old policy and the reference each run one forward per mask that a
    micro-batch's iterations read, none afterwards; the policy then runs one forward per micro-batch
    and iteration. One micro-batch a update: μ masks; two: μ / 2 each (d1's 6 of 12)."""
    policy, reference, group = parity.tiny_case(groups)
    events = []
    policy.register_forward_hook(lambda *_: events.append("policy"))
    reference.register_forward_hook(lambda *_: events.append("reference"))
    from stabledrl.common.config.learner import LearnerConfig
    from stabledrl.common.config.loss import GrpoLossConfig
    from stabledrl.common.config.model import ModelConfig
    from stabledrl.learner.worker import LearnerWorker

    class Engine(parity._SgdEngine):
        def train_step(self, mbs, loss_fn):
            events.append("update")
            return super().train_step(mbs, loss_fn)

    worker = LearnerWorker(0, 1, ModelConfig(preset="tiny-llada"), LearnerConfig(),
                           MeanFieldConfig(masks="per_iteration"), GrpoLossConfig(kl_beta=0.04, level="token"),
                           inner_iterations=iterations, advantage_scale="none", micro_batch_size=6)
    worker.reference, worker.pad_token_id, worker.engine = reference, 0, Engine(policy)
    worker._updates(group if groups > 1 else [group], version=0, group_offset=0)
    first = events.index("update")
    assert scored == groups * distinct_iteration_masks(groups, iterations)
    assert sorted(events[:first]) == ["policy"] * scored + ["reference"] * scored
    assert events[first:] == (["update"] + ["policy"] * groups) * iterations
    assert worker._old_cache == {} and worker._reference_cache == {}


def test_one_iteration_takes_the_new_estimate_detached_as_the_old_one():
    """μ = 1: d1's compute_loss uses per_token_logps.detach() as the old value: every ratio is 1."""
    policy, _, group = parity.tiny_case()
    from stabledrl.common.config.learner import LearnerConfig
    from stabledrl.common.config.loss import GrpoLossConfig
    from stabledrl.common.config.model import ModelConfig
    from stabledrl.learner.rl_batch import global_counts, micro_batches
    from stabledrl.learner.worker import LearnerWorker

    worker = LearnerWorker(0, 1, ModelConfig(preset="tiny-llada"), LearnerConfig(),
                           MeanFieldConfig(masks="per_iteration"), GrpoLossConfig(kl_beta=0.0, level="token"),
                           inner_iterations=1, advantage_scale="none", micro_batch_size=6)
    worker.pad_token_id = 0
    mb = micro_batches([group], group_offset=0, pad_token_id=0, advantage_scale="none", micro_batch_size=6,
                       whole_groups=False, counts=global_counts([group]))[0].for_iteration("per_iteration", 0, 1)
    _, metrics = worker._loss(policy, mb)
    assert float(metrics["ratio/max"].value) == 1.0
    assert float(metrics["log_ratio/min"].value) == float(metrics["log_ratio/max"].value) == 0.0


def test_per_iteration_is_a_mean_field_scheme():
    with pytest.raises(ValueError, match="masks"):
        ElboMCConfig(masks="per_iteration")
    sample = parity.tiny_case()[2].samples[0]
    batch = collate_samples([sample], 0)
    one = mean_field_views(batch, torch.tensor([42]), MeanFieldConfig(masks="per_iteration"))
    per_row = mean_field_views(batch, torch.tensor([42]), MeanFieldConfig(masks="shared"))
    assert torch.equal(one.prompt, per_row.prompt)  # one unpadded row: d1's mask either way

"""Estimator contract: registry and configs, determinism, shared vs independent masks, row
invariance (a sample's value ignores its batch neighbours and padding), gradients, batching."""
import pytest
import torch
from pydantic import TypeAdapter, ValidationError

from stabledrl.common.config.estimator import (
    BlockRandomConfig,
    CoupledConfig,
    ElboMCConfig,
    EstimatorConfig,
    MeanFieldConfig,
    SPGSandwichConfig,
    StaircaseConfig,
    TrajectoryConfig,
)
from stabledrl.common.estimators import ESTIMATORS, estimate, get_estimator, learner_seeds
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.types import SequenceBatch, left_pad

C = 8
PROMPTS = [torch.tensor([5, 6, 7, 8, 9, 10, 11]), torch.tensor([12, 13]), torch.tensor([14, 15, 16, 17])]


def _configs(family: str):
    cfgs = [
        MeanFieldConfig(num_draws=2),
        ElboMCConfig(num_draws=3, prompt_mask_prob=0.2),
        ElboMCConfig(num_draws=3, weighting="mean"),
        BlockRandomConfig(block_length=4, num_draws=3),
        SPGSandwichConfig(block_length=4, num_draws=3),
        CoupledConfig(num_draws=2),
        TrajectoryConfig(shrink=2),
    ]
    return cfgs + [StaircaseConfig(num_draws=2)] if family == "sdar" else cfgs


@pytest.fixture(scope="module")
def policies():
    torch.set_num_threads(1)
    out = {}
    for family in ("llada", "sdar"):
        p = build_tiny_policy(family, block_size=4, seed=1)
        with torch.no_grad():
            p.model.lm_head.weight.mul_(10.0)
        out[family] = p
    return out


def _completions() -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    comp = torch.randint(4, 90, (3, C), generator=g)
    comp[1, 5:] = 1  # EOS at 5
    return comp


def _batch(rows, width=None) -> SequenceBatch:
    comp = _completions()[rows]
    lengths = torch.tensor([C, 6, C])[rows]
    ids, pm = left_pad([PROMPTS[r] for r in rows], pad_id=0, width=width)
    g = torch.Generator().manual_seed(9)
    steps = torch.stack([torch.randperm(C, generator=g) for _ in range(3)])[rows]
    return SequenceBatch(
        input_ids=torch.cat([ids, comp], 1),
        prompt_mask=pm,
        completion_mask=torch.arange(C)[None] < lengths[:, None],
        decode_step=steps,
        advantages=torch.tensor([1.0, -0.5, 0.0])[rows],
    )


SEEDS = torch.tensor([101, 202, 303])


def test_registry_names_and_unknown_name():
    assert ESTIMATORS.names() == sorted(
        [
            "mean_field",
            "elbo_mc",
            "block_random",
            "spg_sandwich",
            "coupled",
            "trajectory",
            "staircase",
            "uniform_staircase",
        ]
    )
    with pytest.raises(KeyError, match="valid: block_random, coupled"):
        get_estimator("elbo")


def test_eubo_beta_default_and_its_doc_are_the_releases():
    # the StableDRL release's configs (sudoku, countdown, gsm8k_math, math _spg_snis.yaml) all set spg_beta 1.5
    field = SPGSandwichConfig.model_fields["eubo_beta"]
    assert field.default == 1.5
    assert "1.5 for every task" in field.description and "1.0 for Sudoku" not in field.description


def test_configs_parse_by_name_with_released_defaults():
    ta = TypeAdapter(EstimatorConfig)
    spg = ta.validate_python({"name": "spg_sandwich"})
    assert isinstance(spg, SPGSandwichConfig)
    assert (spg.num_draws, spg.block_length, spg.prompt_mask_prob, spg.mix_weight, spg.eubo_beta) == (
        2,
        32,
        0.15,
        0.5,
        1.5,
    )
    assert spg.masks == "independent" and spg.logp_estimation == "mix"
    mf = ta.validate_python({"name": "mean_field"})
    assert (mf.prompt_mask_prob, mf.num_draws, mf.masks) == (0.15, 1, "shared")
    co = ta.validate_python({"name": "coupled"})
    assert (co.t_min, co.t_max) == (0.2, 0.8)
    assert ta.validate_python({"name": "trajectory"}).shrink == 1
    with pytest.raises(ValidationError):
        ta.validate_python({"name": "elbo_mc", "num_draw": 2})  # typo: extra keys are rejected
    with pytest.raises(ValidationError):
        ta.validate_python({"name": "elbo_mc", "t_min": 0.9, "t_max": 0.1})
    with pytest.raises(ValidationError):
        ta.validate_python({"name": "mean_fields"})


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_shared_masks_give_bitwise_equal_estimates(policies, family):
    """theta = mu with shared masks: the behaviour and learner estimates agree bitwise (ratio exactly 1)."""
    policy, batch = policies[family], _batch([0, 1, 2])
    for cfg in _configs(family):
        seeds = learner_seeds(SEEDS, "shared", inner_iteration=3)
        with torch.no_grad():
            behaviour = estimate(policy, batch, SEEDS, cfg)
            learner = estimate(policy, batch, seeds, cfg)
        assert torch.equal(behaviour.sequence, learner.sequence), cfg.name
        if behaviour.token is not None:
            assert torch.equal(behaviour.token, learner.token), cfg.name


def test_independent_seeds_are_fresh_and_deterministic():
    a = learner_seeds(SEEDS, "independent", inner_iteration=0)
    assert torch.equal(a, learner_seeds(SEEDS.tolist(), "independent", inner_iteration=0))
    assert not torch.equal(a, learner_seeds(SEEDS, "independent", inner_iteration=1))
    assert (a != SEEDS).all() and a.dtype == torch.long and (a >= 0).all()


def test_independent_ratio_spread_shrinks_with_draws(policies):
    """Independent masks give log-ratios != 0 at theta = mu, with a spread that falls like 1/sqrt(n)."""
    policy, batch = policies["llada"], _batch([0])
    spreads = {}
    for n in (1, 16):
        cfg = ElboMCConfig(num_draws=n)
        log_ratios = []
        for s in range(24):
            seed = torch.tensor([1000 + s])
            with torch.no_grad():
                mu = estimate(policy, batch, seed, cfg).sequence
                theta = estimate(policy, batch, learner_seeds(seed, "independent", 0), cfg).sequence
            log_ratios.append(theta - mu)
        log_ratios = torch.cat(log_ratios)
        assert (log_ratios != 0).float().mean() > 0.5  # equal only when both draws mask everything
        spreads[n] = log_ratios.std()
    assert spreads[16] < 0.5 * spreads[1], spreads  # 1/sqrt(16) = 0.25 in expectation


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_row_invariance_to_neighbours_and_padding(policies, family):
    policy = policies[family]
    alone = _batch([1])  # row 1 by itself: no padding at all
    crowded = _batch([2, 1, 0], width=10)  # other neighbours, order and a wider left padding
    for cfg in _configs(family):
        with torch.no_grad():
            a = estimate(policy, alone, SEEDS[1:2], cfg)
            b = estimate(policy, crowded, SEEDS[[2, 1, 0]], cfg)
        torch.testing.assert_close(a.sequence[0], b.sequence[1], atol=1e-5, rtol=0, msg=cfg.name)
        if a.token is not None:
            torch.testing.assert_close(a.token[0], b.token[1], atol=1e-5, rtol=0, msg=cfg.name)


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_differentiable_under_grad_and_sequence_matches_tokens(policies, family):
    policy, batch = policies[family], _batch([0, 1, 2])
    for cfg in _configs(family):
        policy.zero_grad()
        ll = estimate(policy, batch, SEEDS, cfg)
        ll.sequence.sum().backward()
        grad = policy.model.lm_head.weight.grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, cfg.name
        if ll.token is not None:
            torch.testing.assert_close(ll.sequence, (ll.token * ll.token_mask).sum(-1), msg=cfg.name)
            assert torch.equal(ll.token_mask, batch.completion_mask)
        with torch.no_grad():
            assert not estimate(policy, batch, SEEDS, cfg).sequence.requires_grad


def test_draw_batch_changes_forwards_not_values(policies):
    policy, batch = policies["llada"], _batch([0, 1, 2])
    calls = []
    handle = policy.register_forward_hook(lambda *_: calls.append(1))
    try:
        for cfg in _configs("llada"):
            values = []
            for draw_batch in (None, 1):
                calls.clear()
                with torch.no_grad():
                    ll = estimate(policy, batch, SEEDS, cfg.model_copy(update={"draw_batch": draw_batch}))
                values.append(ll.sequence)
                assert len(calls) == (1 if draw_batch is None else ll.forwards), cfg.name
            torch.testing.assert_close(values[0], values[1], atol=1e-5, rtol=0, msg=cfg.name)
    finally:
        handle.remove()


def test_mean_field_is_the_all_masked_forward(policies):
    policy, batch = policies["llada"], _batch([0, 1])
    with torch.no_grad():
        ll = estimate(policy, batch, SEEDS[:2], MeanFieldConfig(prompt_mask_prob=0.0))
        p = batch.prompt_width
        x = batch.input_ids.clone()
        x[:, p:] = policy.mask_token_id
        valid = batch.valid
        mask = valid[:, None, None, :] & valid[:, None, :, None] | torch.eye(x.shape[1], dtype=torch.bool)
        logp = torch.log_softmax(policy(x, attention_mask=mask, position_ids=batch.position_ids).logits[:, p:], -1)
        want = logp.gather(-1, batch.completion_ids[..., None])[..., 0]
    torch.testing.assert_close(ll.token * batch.completion_mask, want * batch.completion_mask, atol=1e-5, rtol=0)
    assert ll.forwards == 1

"""The episode (rollout/workflow.py) in one process: what a group carries, seeded by (seed, uid,
index) only, the behaviour estimate reproducible by the learner from the sample's mask seed."""
from __future__ import annotations

import pytest
import torch

from stabledrl.common.config.estimator import BlockRandomConfig, SPGSandwichConfig
from stabledrl.common.config.model import ModelConfig
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.config.task import parse_task_config
from stabledrl.common.estimators import estimate
from stabledrl.common.models import load_policy
from stabledrl.common.seeding import derive_seed
from stabledrl.common.sandbox.scorer import RewardScorer
from stabledrl.common.tasks import build_task, load_task_data
from stabledrl.common.types import PromptRequest, collate_samples
from stabledrl.rollout.engine import TorchRolloutEngine
from stabledrl.rollout.workflow import behaviour_estimator, run_episodes

G, SEED = 4, 11
SAMPLER = SamplerConfig(gen_length=4, block_length=4, steps=4, temperature=1.0)
ESTIMATOR = BlockRandomConfig(block_length=4, num_draws=2)


@pytest.fixture(scope="module")
def setup():
    policy, tokenizer = load_policy(ModelConfig(preset="tiny-llada"))
    task_cfg = parse_task_config({"name": "arithmetic", "source": {"kind": "generated", "n": 50}})
    rows = load_task_data(task_cfg).train
    return policy, tokenizer, task_cfg, rows


def episodes(setup, requests, version=0, estimator=ESTIMATOR, task_cfg=None, sampler=SAMPLER):
    policy, tokenizer, default_cfg, _ = setup
    task_cfg = task_cfg or default_cfg
    task = build_task(task_cfg)
    engine = TorchRolloutEngine(policy, policy_version=version)
    with RewardScorer(task_cfg, task) as scorer:
        return run_episodes(engine, requests, tokenizer=tokenizer, task=task, scorer=scorer,
                            group_size=G, sampler=sampler, estimator=behaviour_estimator(estimator), seed=SEED)


def test_a_group_is_g_stamped_samples_of_one_prompt(setup):
    policy, _, _, rows = setup
    requests = [PromptRequest(7, rows[0]), PromptRequest(8, rows[1])]
    out = episodes(setup, requests, version=3)
    assert [e.uid for e in out] == [7, 8]
    for request, e in zip(requests, out):
        assert e.group.prompt_id == request.row.prompt_id and len(e.group.samples) == G
        for i, s in enumerate(e.group.samples):
            assert s.sample_id == f"{request.row.prompt_id}/{i}" and s.index == i
            assert s.policy_version == 3 and s.estimator == "block_random"
            assert s.mask_seed == derive_seed(SEED, "mask", request.uid, i)
            assert s.completion_ids.shape == (SAMPLER.gen_length,) and s.decode_step.shape == (SAMPLER.gen_length,)
            assert 1 <= s.completion_length <= SAMPLER.gen_length
            # the learner reproduces the behaviour estimate from the mask seed alone (same weights)
            alone = estimate(policy, collate_samples([s], policy.pad_token_id), [s.mask_seed], ESTIMATOR)
            assert float(alone.sequence.detach()) == pytest.approx(s.behaviour_logp, abs=1e-5)


def test_a_request_is_reproduced_whatever_it_is_batched_with(setup):
    _, _, _, rows = setup
    alone = episodes(setup, [PromptRequest(5, rows[2])])[0]
    batched = episodes(setup, [PromptRequest(9, rows[3]), PromptRequest(5, rows[2])])[1]
    other_uid = episodes(setup, [PromptRequest(6, rows[2])])[0]
    for a, b in zip(alone.group.samples, batched.group.samples):
        assert torch.equal(a.completion_ids, b.completion_ids)
        assert a.behaviour_logp == pytest.approx(b.behaviour_logp, abs=1e-5)
    assert any(not torch.equal(a.completion_ids, c.completion_ids) or a.mask_seed != c.mask_seed
               for a, c in zip(alone.group.samples, other_uid.group.samples))


def test_the_sandwich_ships_the_elbo_its_ratios_compare(setup):
    policy, _, _, rows = setup
    sandwich = SPGSandwichConfig(block_length=4, num_draws=2, masks="shared")
    assert behaviour_estimator(sandwich).name == "block_random"
    e = episodes(setup, [PromptRequest(1, rows[4])], estimator=sandwich)[0]
    batch = collate_samples(e.group.samples, policy.pad_token_id, advantages=-torch.ones(G))  # A <= 0: the mix
    ll = estimate(policy, batch, [s.mask_seed for s in e.group.samples], sandwich)
    assert not torch.allclose(ll.sequence, ll.elbo)  # the sandwich differs from the ELBO here ...
    torch.testing.assert_close(ll.ratio_value, torch.tensor([s.behaviour_logp for s in e.group.samples]),
                               rtol=1e-5, atol=1e-5)  # ... and the behaviour value is its ELBO


def test_samples_whose_reward_is_dropped_leave_the_group(setup, tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text("def score(completion, row):\n    raise ValueError('no reward today')\n")
    task_cfg = parse_task_config({"name": "arithmetic", "source": {"kind": "generated", "n": 50},
                                  "reward": {"custom": f"{reward}:score", "isolation": "inline", "on_failure": "drop"}})
    out = episodes(setup, [PromptRequest(0, setup[3][0])], task_cfg=task_cfg)
    assert out[0].group is None and out[0].uid == 0


def test_a_batched_reward_gets_every_completion_of_a_request_in_one_call(setup, tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text("def batch(prompts, completions, answer, **kwargs):\n"  # a generated row gives its answer
                      "    return [float(len(completions))] * len(answer)\n")
    task_cfg = parse_task_config({"name": "arithmetic", "source": {"kind": "generated", "n": 50},
                                  "reward": {"custom": f"{reward}:batch", "isolation": "inline", "format_weight": 0}})
    out = episodes(setup, [PromptRequest(0, setup[3][0]), PromptRequest(1, setup[3][1])], task_cfg=task_cfg)
    assert [s.reward for e in out for s in e.group.samples] == [2.0 * G] * (2 * G)  # 2 prompts x G, one call


def test_the_behaviour_estimate_is_the_completions_elbo_whatever_sampler_decoded_it(setup):
    """The 8B config's fast sampler (dual cache, threshold decoding) changes which completions are
    drawn, not what their behaviour value is: the same ELBO the learner computes from the completion
    and its mask seed (log-ratio 0 at theta = mu with shared masks)."""
    policy, _, _, rows = setup
    fast = SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=1.0, cache="dual", threshold=0.5)
    exact = fast.model_copy(update={"cache": "none", "threshold": None})
    estimator = BlockRandomConfig(block_length=4, num_draws=2)
    requests = [PromptRequest(3, rows[5]), PromptRequest(4, rows[6])]
    drawn = {name: episodes(setup, requests, estimator=estimator, sampler=cfg) for name, cfg in
             (("fast", fast), ("exact", exact))}
    pairs = [
        (a, b) for ea, eb in zip(drawn["fast"], drawn["exact"]) for a, b in zip(ea.group.samples, eb.group.samples)
    ]
    assert any(not torch.equal(a.completion_ids, b.completion_ids) for a, b in pairs)  # the samplers differ
    for samples in ([a for a, _ in pairs], [b for _, b in pairs]):
        batch = collate_samples(samples, policy.pad_token_id)
        learner = estimate(policy, batch, [s.mask_seed for s in samples], estimator).sequence.detach()
        torch.testing.assert_close(learner, torch.tensor([s.behaviour_logp for s in samples]), rtol=1e-5, atol=1e-5)


def test_behaviour_estimates_are_chunked_by_their_logits_and_unchanged(setup, monkeypatch):
    import stabledrl.rollout.workflow as workflow

    policy, _, _, rows = setup
    requests = [PromptRequest(20, rows[7]), PromptRequest(21, rows[8])]
    whole = episodes(setup, requests)
    calls: list[int] = []
    real = TorchRolloutEngine.score
    monkeypatch.setattr(TorchRolloutEngine, "score",
                        lambda self, batch, *a: calls.append(batch.input_ids.shape[0]) or real(self, batch, *a))
    per_sample = SAMPLER.gen_length * policy.vocab_size * ESTIMATOR.num_draws
    monkeypatch.setattr(workflow, "LOGIT_BUDGET", 3 * per_sample)  # 3 samples' logits per call
    chunked = episodes(setup, requests)
    assert calls == [3, 3, 2]  # 2 prompts x G = 4 samples each
    for a, b in zip(whole, chunked):
        for x, y in zip(a.group.samples, b.group.samples):
            assert x.behaviour_logp == pytest.approx(y.behaviour_logp, abs=1e-5)


def test_a_token_bound_cuts_the_sampler_and_estimate_calls_and_changes_nothing(setup, monkeypatch):
    """sampler.max_tokens_per_forward: every sampler call carries at most that many canvas tokens
    (rows x (longest prompt + gen_length)) and every behaviour-estimate call its views' tokens; the
    rows come out as from one call."""
    import stabledrl.rollout.engine as engine_module

    _, _, _, rows = setup
    requests = [PromptRequest(30, rows[3]), PromptRequest(31, rows[4])]
    whole = episodes(setup, requests)
    calls: dict[str, list[tuple[int, int]]] = {"generate": [], "score": []}
    real_generate, real_score = engine_module.generate, TorchRolloutEngine.score

    def counted_generate(policy, prompts, seeds, cfg, graphs):
        calls["generate"].append((len(prompts), max(len(p) for p in prompts) + cfg.gen_length))
        return real_generate(policy, prompts, seeds, cfg, graphs)

    monkeypatch.setattr(engine_module, "generate", counted_generate)
    monkeypatch.setattr(TorchRolloutEngine, "score", lambda self, batch, *a: calls["score"].append(
        tuple(batch.input_ids.shape)) or real_score(self, batch, *a))
    width = max(len(r.prompt) for r in (rows[3], rows[4]))  # characters: an upper bound of the prompt tokens
    bound = 3 * (width + SAMPLER.gen_length) * ESTIMATOR.num_draws
    cut = episodes(setup, requests, sampler=SAMPLER.model_copy(update={"max_tokens_per_forward": bound}))
    assert sum(n for n, _ in calls["generate"]) == 2 * G and len(calls["generate"]) >= 2
    assert all(n * w <= bound for n, w in calls["generate"])
    assert sum(n for n, _ in calls["score"]) == 2 * G and len(calls["score"]) >= 2
    assert all(n * w * ESTIMATOR.num_draws <= bound for n, w in calls["score"])
    for a, b in zip(whole, cut):
        assert [s.completion_ids.tolist() for s in a.group.samples] == \
            [s.completion_ids.tolist() for s in b.group.samples]
        for x, y in zip(a.group.samples, b.group.samples):
            assert x.behaviour_logp == pytest.approx(y.behaviour_logp, abs=1e-5)


def test_call_rows_keep_each_call_within_its_rows_and_tokens():
    from stabledrl.rollout.engine import call_rows

    lengths = [3, 10, 5, 5, 8, 20]
    order = sorted(range(6), key=lambda i: lengths[i])
    cfg = SAMPLER.model_copy(update={"max_batch_size": 2})
    assert call_rows(order, lengths, cfg) == [[0, 2], [3, 4], [1, 5]]
    cfg = SAMPLER.model_copy(update={"max_batch_size": 64, "max_tokens_per_forward": 30})  # gen_length 4
    # widths 7, 9, 9, 12, 14, 24: [7, 9, 9] -> 27; [12, 14] -> 28; the 24-token row alone
    assert call_rows(order, lengths, cfg) == [[0, 2, 3], [4, 1], [5]]
    assert call_rows(order, lengths, cfg.model_copy(update={"max_tokens_per_forward": 5})) == [[i] for i in order]


def test_a_request_reports_the_graphs_it_compiled(setup):
    """``compiles`` in an episode's stats (summed into ``rollout/compiles``): the graphs torch.compile
    built during the request, common/compiling.py. A compiled sampler's first request compiles, the
    same request again does not; an uncompiled one never does."""
    _, _, _, rows = setup
    requests = [PromptRequest(1, rows[0])]
    torch._dynamo.reset()  # nothing compiled by an earlier test in this process is reused
    compiled = SAMPLER.model_copy(update={"compile": True})
    first, again = (sum(e.stats["compiles"] for e in episodes(setup, requests, sampler=compiled)) for _ in range(2))
    assert first > 0 and again == 0
    assert sum(e.stats["compiles"] for e in episodes(setup, requests)) == 0

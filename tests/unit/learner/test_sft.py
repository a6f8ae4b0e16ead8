"""Masked-diffusion SFT (learner/sft.py): the layout, the mask law, the loss formula, its expectation
(the exact negative ELBO, by enumerating every mask), micro-batch additivity, and a loop that is
deterministic and learns."""
from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from transformers import PretrainedConfig

from stabledrl.common.config.task import parse_task_config
from stabledrl.common.config.warmstart import WarmStartConfig
from stabledrl.common.estimators.scoring import build_inputs, token_logp
from stabledrl.common.models import DiffusionPolicy, FamilySpec, build_tiny_policy
from stabledrl.common.seeding import generator
from stabledrl.common.tasks import load_task_data
from stabledrl.common.tokenizer import build_char_tokenizer
from stabledrl.common.types import SequenceBatch
from stabledrl.learner.sft import draw_masks, encode_pairs, run_sft, sft_loss
from job_lines import job_lines

torch.set_num_threads(1)
TOK = build_char_tokenizer()
IDS = dict(
    vocab_size=len(TOK), mask_token_id=TOK.mask_token_id, eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id
)


def tiny(family: str = "llada", **kw):
    return build_tiny_policy(family, **IDS, **kw)


def addition_data(n: int = 100, held_out: int = 0):
    cfg = parse_task_config(
        {
            "name": "arithmetic",
            "digits": 1,
            "operators": ["+"],
            "held_out": held_out,
            "source": {"kind": "generated", "n": n},
        }
    )
    return load_task_data(cfg)


def test_encode_pairs_left_pads_prompts_and_eos_fills_the_canvas():
    data = addition_data(20)
    rows = data.train[:5]
    batch = encode_pairs(TOK, data.task, rows, 4, eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id)
    assert batch.completion_width == 4 and batch.completion_mask.all()
    for i, row in enumerate(rows):
        prompt = [t for t, real in zip(batch.input_ids[i, : batch.prompt_width].tolist(), batch.prompt_mask[i]) if real]
        assert TOK.decode(prompt) == data.task.render_prompt(row)
        assert not batch.prompt_mask[i, : batch.prompt_width - len(prompt)].any()  # padding on the left only
        answer = TOK.encode(row.answer, add_special_tokens=False)
        completion = batch.completion_ids[i].tolist()
        assert completion == answer + [TOK.eos_token_id] * (4 - len(answer))
    with pytest.raises(ValueError, match="more than gen_length=1"):
        encode_pairs(TOK, data.task, [r for r in data.train if len(r.answer) == 2][:1], 1,
                     eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id)  # fmt: skip


def test_mask_probability_follows_t_and_the_prompt_is_never_masked():
    p_mask, masked = draw_masks(40000, 6, generator(0), eps=1e-3)
    assert p_mask.min() >= 1e-3 and p_mask.max() <= 1.0
    for lo, hi in [(0.0, 0.1), (0.45, 0.55), (0.9, 1.0)]:
        rows = (p_mask >= lo) & (p_mask < hi)
        assert abs(masked[rows].float().mean().item() - float(p_mask[rows].mean())) < 0.01
    # what the model sees: the prompt exactly as given, [M] exactly at the masked completion positions
    policy = tiny()
    data = addition_data(20)
    batch = encode_pairs(
        TOK, data.task, data.train[:8], 4, eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id
    )
    p_mask, masked = draw_masks(8, 4, generator(3))
    seen = {}
    inner = policy.model.forward
    policy.model.forward = lambda input_ids, **kw: (
        seen.setdefault("ids", input_ids) is not None and inner(input_ids=input_ids, **kw)
    )
    sft_loss(policy, batch, p_mask, masked)
    p = batch.prompt_width
    assert torch.equal(seen["ids"][:, :p], batch.input_ids[:, :p])
    assert torch.equal(seen["ids"][:, p:] == TOK.mask_token_id, masked)
    assert torch.equal(seen["ids"][:, p:][~masked], batch.completion_ids[~masked])


def reference_loss(policy, batch: SequenceBatch, p_mask, masked) -> torch.Tensor:
    """The formula written out row by row: (1/B) Σ_b (1/C) Σ_{k masked} -log p(r_k | view) / p_b."""
    b, c = masked.shape
    p = batch.prompt_width
    total = torch.zeros(())
    for i in range(b):
        noisy = batch.completion_ids[i : i + 1].masked_fill(masked[i : i + 1], policy.mask_token_id)
        inputs, attn, pos, start = build_inputs(
            policy, batch.input_ids[i : i + 1, :p], batch.prompt_mask[i : i + 1], batch.completion_ids[i : i + 1], noisy
        )
        logits = policy(inputs, attention_mask=attn, position_ids=pos, logits_from=start).logits[0]  # [C, V]
        for k in range(c):
            if masked[i, k]:
                total = total - token_logp(logits[k : k + 1], batch.completion_ids[i, k : k + 1])[0] / p_mask[i]
    return total / (b * c)


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_loss_equals_the_formula_and_micro_batches_add_up(family):
    policy = tiny(family, block_size=2) if family == "sdar" else tiny(family)
    data = addition_data(30)
    batch = encode_pairs(
        TOK, data.task, data.train[:6], 4, eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id
    )
    p_mask, masked = draw_masks(6, 4, generator(1))
    masked[0] = True  # at least one fully masked row and one clean row
    masked[1] = False
    loss, metrics = sft_loss(policy, batch, p_mask, masked)
    torch.testing.assert_close(loss, reference_loss(policy, batch, p_mask, masked), rtol=1e-5, atol=1e-6)
    halves = [sft_loss(policy, batch.select(r), p_mask[r], masked[r], num_rows=6)[0] for r in ([0, 1, 2], [3, 4, 5])]
    torch.testing.assert_close(halves[0] + halves[1], loss, rtol=1e-5, atol=1e-6)
    assert metrics["sft/masked_fraction"] == masked.float().mean()


def mask_weight(size: int, c: int, eps: float) -> float:
    """∫_0^1 p^(|M|-1) (1-p)^(C-|M|) dt with p = (1-eps) t + eps: the weight E[1/p · P(M | p)] of mask M."""
    poly = np.polynomial.Polynomial([0.0, 1.0]) ** (size - 1) * np.polynomial.Polynomial([1.0, -1.0]) ** (c - size)
    integral = poly.integ()
    return float(integral(1.0) - integral(eps)) / (1.0 - eps)


class ContextLM(nn.Module):
    """A toy LM whose predictions depend strongly on how much of the row is masked (random logits per
    position, sharpened by the number of [M] tokens), so the weights of the mask sizes matter."""

    def __init__(self, vocab: int, mask_token_id: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(64, vocab, generator=generator(11)))
        self.mask_token_id = mask_token_id
        self.config = PretrainedConfig(vocab_size=vocab)
        self.config._attn_implementation = "sdpa"

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, logits_to_keep=None, **kw):
        sharpness = 0.25 + (input_ids == self.mask_token_id).sum(1).float()  # [B]
        logits = self.table[position_ids] * sharpness[:, None, None]  # [B, L, V]
        return SimpleNamespace(logits=logits[:, logits_to_keep], cache=None)


def test_expected_loss_is_the_exact_negative_elbo_over_every_mask():
    """E_{t, mask}[loss] = (1/C) Σ_M w(|M|) Σ_{k in M} -log p(r_k | r with M masked): enumerate the
    2^C masks for the exact value, compare with the mean loss of many sampled masks."""
    spec = FamilySpec("toy", attention="full", shifted_logits=False, default_block_size=4)
    policy = DiffusionPolicy(ContextLM(len(TOK), TOK.mask_token_id), spec, mask_token_id=TOK.mask_token_id,
                             eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id)  # fmt: skip
    data = addition_data(30)
    c, eps, n, chunk = 3, 1e-3, 8000, 200
    one = encode_pairs(TOK, data.task, data.train[:1], c, eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id)
    exact, per_token = 0.0, {}
    with torch.no_grad():
        for bits in itertools.product([False, True], repeat=c):
            mask = torch.tensor([bits])
            if mask.any():  # Σ_{k in M} -log p, from the loss itself at p_mask = 1 (no reweighting)
                nll_sum = float(sft_loss(policy, one, torch.ones(1), mask)[0]) * c
                exact += mask_weight(int(mask.sum()), c, eps) * nll_sum / c
                per_token[bits] = nll_sum / int(mask.sum())
        p_mask, masked = draw_masks(n, c, generator(7), eps)
        rows = one.select([0] * chunk)  # the same pair in every row; each chunk's loss is its rows' mean
        values = [
            float(sft_loss(policy, rows, p_mask[s : s + chunk], masked[s : s + chunk])[0]) for s in range(0, n, chunk)
        ]
    assert max(per_token.values()) > 1.5 * min(per_token.values())  # the masks' values differ: weights matter
    mc = float(np.mean(values))
    se = float(np.std(values, ddof=1) / np.sqrt(len(values)))
    assert se < 0.05 * exact
    assert abs(mc - exact) < 4 * se, (mc, exact, se)


def test_run_sft_is_deterministic_given_the_seed_and_reduces_the_loss():
    data = addition_data(100)
    cfg = WarmStartConfig(steps=60, batch_size=16, lr=3e-3, log_every=20)

    def train(seed: int, steps: int = cfg.steps):
        policy = tiny()
        metrics = run_sft(
            policy, TOK, data.train, data.task, cfg.model_copy(update={"steps": steps}), seed, gen_length=3
        )
        return policy, metrics

    a, ma = train(0)
    b, mb = train(0)
    c, _ = train(1, steps=2)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert ma["sft/loss_curve"] == mb["sft/loss_curve"] and len(ma["sft/loss_curve"]) == 3
    assert not all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), c.state_dict().values()))
    assert ma["sft/loss"] < 0.5 * ma["sft/loss_first"]
    assert not a.training  # left in eval mode


def job(tmp_path, **over):
    from stabledrl.common.config.base import apply_overrides
    from stabledrl.common.config.job import JobConfig

    data = {
        "model": {"preset": "tiny-llada", "preset_shape": {"hidden_size": 32, "intermediate_size": 64}},
        "task": {
            "name": "arithmetic",
            "digits": 1,
            "operators": ["+"],
            "held_out": 20,
            "source": {"kind": "generated", "n": 100},
        },
        "sampler": {"gen_length": 4, "block_length": 4, "steps": 4},
        "estimator": {"name": "elbo_mc"},
        "loss": {"name": "stabledrl"},
        "warmstart": {"steps": 4, "batch_size": 8, "log_every": 2, "cache_dir": str(tmp_path / "cache")},
    }
    return JobConfig.model_validate(apply_overrides(data, [f"{k}={v}" for k, v in over.items()]))


def test_warm_start_trains_once_caches_by_content_and_loads_back(tmp_path):
    from stabledrl.common.config.model import ModelConfig
    from stabledrl.common.models import load_policy
    from stabledrl.recipes.warmstart import MANIFEST, warm_start

    with job_lines() as lines:
        path = warm_start(job(tmp_path))
    assert (path / MANIFEST).is_file() and any("sft step 4/4" in line for line in lines)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary directory left behind
    with job_lines() as lines:
        assert warm_start(job(tmp_path, **{"warmstart.log_every": 1})) == path  # log_every: same model
    assert len(lines) == 1 and "reusing" in lines[0]
    others = {warm_start(job(tmp_path, **{k: v})) for k, v in
              [("run.seed", 1), ("warmstart.steps", 5), ("sampler.gen_length", 8), ("task.held_out", 21),
               ("warmstart.seed", 2), ("warmstart.threads", 2)]}  # fmt: skip
    assert len(others | {path}) == 7  # each of these changes the weights, so each gets its own directory
    # warmstart.seed and warmstart.threads enter by their effective values: this run's seed (0) and thread count (1)
    same = {warm_start(job(tmp_path, **over)) for over in
            [{"warmstart.seed": 0}, {"warmstart.threads": 1}, {"run.seed": 1, "warmstart.seed": 0}]}  # fmt: skip
    assert same == {path}
    two = warm_start(job(tmp_path, **{"warmstart.threads": 2}))
    assert json.loads((path / MANIFEST).read_text())["threads"] == 1
    assert json.loads((two / MANIFEST).read_text())["threads"] == 2
    assert torch.get_num_threads() == 1  # the SFT's thread count is the process's again afterwards

    loaded, tokenizer = load_policy(ModelConfig(path=path))
    fresh, _ = load_policy(job(tmp_path).model)
    assert tokenizer.mask_token_id == loaded.mask_token_id == TOK.mask_token_id
    trained = dict(loaded.state_dict())
    assert trained.keys() == fresh.state_dict().keys()
    assert any(not torch.equal(trained[k], v) for k, v in fresh.state_dict().items())  # SFT moved the weights
    rerun = warm_start(job(tmp_path / "again"))  # the same config elsewhere: the same weights
    again, _ = load_policy(ModelConfig(path=rerun))
    assert all(torch.equal(trained[k], v) for k, v in again.state_dict().items())

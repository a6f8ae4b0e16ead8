"""The staircase layout as a flex BlockMask (common/models/flex_staircase.py): its mask_mod equals the
dense staircase mask elementwise, its tiles are what flex's own create_block_mask makes of the dense
mask, and the one-pass likelihood through flex equals the sdpa one-pass and the per-block multi-pass
value on left-padded batches of several lengths."""
import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

import stabledrl.common.models.flex_staircase as fs
from stabledrl.common.attention import block_causal_mask, block_ids, staircase_mask
from stabledrl.common.config.base import ConfigError, validate
from stabledrl.common.config.estimator import StaircaseConfig
from stabledrl.common.config.model import ModelConfig
from stabledrl.common.estimators import build_inputs, estimate
from stabledrl.common.models import build_tiny_policy, load_policy
from stabledrl.common.models.gqa_fold import foldable
from stabledrl.common.types import SequenceBatch, left_pad

torch.set_num_threads(1)
# (prompt lengths, completion width, block size): one row unpadded, the others left-padded; the
# longer ones span several 128-wide flex tiles, so empty, full and partial tiles all occur
LAYOUTS = [((5, 2), 12, 4), ((40, 3, 17), 32, 4), ((130, 1), 64, 4), ((1, 150, 6), 60, 8)]


def _prompt_mask(lengths) -> torch.Tensor:
    return left_pad([torch.ones(n, dtype=torch.long) for n in lengths], pad_id=0)[1]


@pytest.mark.parametrize("lengths,c,bs", LAYOUTS)
def test_mask_mod_equals_dense_staircase(lengths, c, bs):
    pm = _prompt_mask(lengths)
    dense = staircase_mask(pm, c, bs)  # [B, 1, L, L]
    block_mask = fs.staircase_block_mask(pm, c, bs)
    assert torch.equal(fs.dense_from_block_mask(block_mask), dense)
    assert dense[:, 0].any(dim=-1).all()  # no row is empty: padding rows see themselves
    # the tiles (empty / partial / full, in flex's order) are those flex derives from the dense mask
    d = dense[:, 0]
    ref = create_block_mask(lambda b, h, q, k: d[b, q, k], B=d.shape[0], H=None, Q_LEN=d.shape[1],
                            KV_LEN=d.shape[2], device="cpu")
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks"):
        assert torch.equal(getattr(block_mask, name), getattr(ref, name)), name
    assert block_mask.seq_lengths == ref.seq_lengths


def test_block_mask_is_built_in_bounded_chunks(monkeypatch):
    """A band of query tiles at a time: the same BlockMask whatever the chunk budget."""
    pm = _prompt_mask((130, 1, 60))
    whole = fs.staircase_block_mask(pm, 100, 4)
    monkeypatch.setattr(fs, "_CHUNK_ELEMENTS", 1)  # one query tile per chunk
    banded = fs.staircase_block_mask(pm, 100, 4)
    assert whole.kv_num_blocks.shape[-1] == 3
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        assert torch.equal(getattr(whole, name), getattr(banded, name))


def test_right_padding_is_refused():
    with pytest.raises(ValueError, match="left-padded"):
        fs.staircase_block_mask(torch.tensor([[True, True, False]]), 4, 2)


@pytest.fixture(scope="module")
def policies():
    sdpa = build_tiny_policy("sdar", block_size=4, seed=3)
    flex = build_tiny_policy("sdar", block_size=4, seed=3)
    for p in (sdpa, flex):
        with torch.no_grad():
            p.model.lm_head.weight.mul_(12.0)  # peaked, context-dependent predictions
    fs.use_flex_staircase(flex)
    return sdpa, flex


def _batch(lengths, c, seed=7):
    gen = torch.Generator().manual_seed(seed)
    ids, pm = left_pad([torch.randint(4, 90, (n,), generator=gen) for n in lengths], pad_id=0)
    completion = torch.randint(4, 90, (len(lengths), c), generator=gen)
    noisy = torch.where(torch.rand(completion.shape, generator=gen) < 0.5, 2, completion)
    noisy[:, ::4] = 2  # every block has a masked token
    return ids, pm, completion, noisy


def _one_pass(policy, ids, pm, completion, noisy):
    inputs, attn, positions, start = build_inputs(policy, ids, pm, completion, noisy)
    with torch.no_grad():
        return policy(inputs, attention_mask=attn, position_ids=positions, logits_from=start).logits, attn


def _multi_pass(policy, ids, pm, completion, noisy, bs=4):
    """Block b alone: [prompt | clean blocks < b | noisy block b] under the block-causal mask."""
    p, c, out = ids.shape[1], completion.shape[1], []
    for b in range(c // bs):
        end = (b + 1) * bs
        x = torch.cat([ids, completion[:, : b * bs], noisy[:, b * bs : end]], 1)
        valid = torch.cat([pm, torch.ones(len(ids), end, dtype=torch.bool)], 1)
        pos = (valid.long().cumsum(1) - 1).clamp(min=0)
        mask = block_causal_mask(block_ids(pm, end, bs), valid)
        with torch.no_grad():
            out.append(policy(x, attention_mask=mask, position_ids=pos, logits_from=p + b * bs).logits)
    return torch.cat(out, 1)


@pytest.mark.parametrize("lengths,c", [((5, 2), 12), ((40, 3, 17), 32), ((130, 1), 16)])
def test_flex_one_pass_equals_sdpa_and_multi_pass(policies, lengths, c, monkeypatch):
    monkeypatch.setattr(fs, "FLEX_OFF_CUDA", True)  # the flex kernel itself (eager on CPU)
    calls, kernel = [], fs._flex_kernel
    monkeypatch.setattr(fs, "_flex_kernel", lambda device: calls.append(device) or kernel(device))
    sdpa, flex = policies
    args = _batch(lengths, c)
    got, attn = _one_pass(flex, *args)
    assert isinstance(attn, BlockMask) and len(calls) == flex.model.config.num_hidden_layers
    want, dense = _one_pass(sdpa, *args)
    assert isinstance(dense, torch.Tensor)
    assert torch.isfinite(got).all()
    lp = lambda x: torch.log_softmax(x, -1)  # noqa: E731
    torch.testing.assert_close(lp(got), lp(want), atol=1e-5, rtol=0)
    torch.testing.assert_close(lp(got), lp(_multi_pass(sdpa, *args)), atol=1e-5, rtol=0)


def test_flex_estimate_and_gradient_equal_sdpa(policies, monkeypatch):
    """The staircase estimate through the flex policy: the same value, and off CUDA (no flex
    backward) the same gradient through the mask materialised from the mask_mod."""
    sdpa, flex = policies
    ids, pm, completion, _ = _batch((9, 3), 8)
    cm = torch.ones(2, 8, dtype=torch.bool)
    cm[1, 6:] = False
    batch = SequenceBatch(input_ids=torch.cat([ids, completion], 1), prompt_mask=pm, completion_mask=cm)
    cfg, seeds = StaircaseConfig(num_draws=2), torch.tensor([3, 4])
    values, grads = _values_and_q_grads((sdpa, flex), batch, seeds, cfg)
    torch.testing.assert_close(values[1], values[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(fs, "FLEX_OFF_CUDA", True)
    with torch.no_grad():
        torch.testing.assert_close(estimate(flex, batch, seeds, cfg).sequence, values[0], atol=1e-5, rtol=0)


def test_config_selects_the_flex_staircase():
    policy, _ = load_policy(ModelConfig(preset="tiny-sdar", staircase_attention="flex"))
    assert fs.uses_flex_staircase(policy) and foldable(policy) == foldable(load_policy(
        ModelConfig(preset="tiny-sdar"))[0])
    tensor_mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)  # every other forward stays on sdpa
    with torch.no_grad():
        policy(torch.tensor([[5, 6, 7]]), attention_mask=tensor_mask)
    full, _ = load_policy(ModelConfig(preset="tiny-llada", staircase_attention="flex"))  # no staircase: no effect
    assert not fs.uses_flex_staircase(full)
    with pytest.raises(ConfigError, match="staircase_attention"):
        validate(ModelConfig, {"preset": "tiny-sdar", "staircase_attention": "flex",
                               "attn_implementation": "flex_attention"})


def test_flex_staircase_refused_for_diffusion_gemma():
    pytest.importorskip("transformers.models.diffusion_gemma")
    from stabledrl.common.models import CheckpointError

    with pytest.raises(CheckpointError, match="diffusion_gemma"):
        load_policy(ModelConfig(preset="tiny-diffusion-gemma", staircase_attention="flex"))


@pytest.mark.gpu
def test_cuda_compiled_flex_equals_sdpa_value_and_gradient():
    """On CUDA the flex path is the compiled kernel: the staircase estimate and its gradient equal
    the dense-mask sdpa path's (float32), over batches of changing shapes (the kernel recompiles or
    goes dynamic, never falls back)."""
    sdpa = build_tiny_policy("sdar", block_size=4, seed=3).cuda()
    flex = build_tiny_policy("sdar", block_size=4, seed=3).cuda()
    fs.use_flex_staircase(flex)
    for lengths, c in [((5, 2), 12), ((40, 3, 17), 32), ((130, 1), 64), ((7, 90), 24)]:
        ids, pm, completion, _ = _batch(lengths, c)
        batch = SequenceBatch(input_ids=torch.cat([ids, completion], 1), prompt_mask=pm,
                              completion_mask=torch.ones(len(lengths), c, dtype=torch.bool))
        cfg, seeds = StaircaseConfig(num_draws=2), torch.arange(len(lengths))
        values, grads = _values_and_q_grads((sdpa, flex), batch, seeds, cfg)
        torch.testing.assert_close(values[1], values[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(grads[1], grads[0], atol=1e-4, rtol=1e-3)
    assert fs._compiled_flex is not None


@pytest.mark.parametrize("cache,graph", [("prefix", False), ("none", False), ("prefix", True)])
def test_sampling_is_unchanged_on_the_flex_staircase_policy(cache, graph):
    """The sampler's forwards (tensor masks, the mask-free and the folded-GQA steps) stay on sdpa."""
    from stabledrl.common.config.sampler import SamplerConfig
    from stabledrl.rollout.sampling import generate

    prompts, seeds = [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([10, 11])], torch.tensor([11, 22])
    cfg = SamplerConfig(gen_length=12, block_length=None, steps=6, temperature=0.9, cache=cache, cuda_graph=graph)
    plain = build_tiny_policy("sdar", block_size=4, seed=5)
    flex = build_tiny_policy("sdar", block_size=4, seed=5)
    fs.use_flex_staircase(flex)
    want, got = generate(plain, prompts, seeds, cfg), generate(flex, prompts, seeds, cfg)
    assert torch.equal(got.completion_ids, want.completion_ids)
    assert fs.uses_flex_staircase(flex)  # the folded-GQA steps put it back


def _values_and_q_grads(policies, batch, seeds, cfg) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each policy's staircase estimate and the gradient of its sum at the first layer's q_proj."""
    values, grads = [], []
    for policy in policies:
        policy.zero_grad()
        ll = estimate(policy, batch, seeds, cfg).sequence
        ll.sum().backward()
        values.append(ll.detach())
        grads.append(policy.model.model.layers[0].self_attn.q_proj.weight.grad.clone())
        policy.zero_grad()
    return values, grads

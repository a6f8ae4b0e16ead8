"""DiffusionGemma behind the one-forward interface: the staircase forward equals the release's
encoder/decoder pipeline block by block (sliding window included), the cache path equals the
one-shot forward, padding is invisible, and the checkpoint round-trips."""
from __future__ import annotations

import sys

import pytest
import torch

from stabledrl.common.config.model import ModelConfig
from stabledrl.common.models import build_tiny_policy, export_hf, load_policy, save_original_checkpoint
from stabledrl.common.models.diffusion_gemma import cache_kwarg
from stabledrl.common.tokenizer import build_char_tokenizer

pytest.importorskip("transformers.models.diffusion_gemma")
torch.set_num_threads(1)

P, BLOCK, BLOCKS = 5, 4, 3  # prompt length, canvas (block) length, blocks; window 5 < longest context 13
C = BLOCK * BLOCKS


@pytest.fixture(scope="module")
def policy():
    return build_tiny_policy("diffusion_gemma", block_size=BLOCK, sliding_window=5, seed=1)


def _native(model, context: torch.Tensor, canvas: torch.Tensor, sc_logits=None) -> torch.Tensor:
    """The release's path (as in DiffusionGemmaGenerationMixin.generate): encode the committed tokens
    into a sliding-window-aware cache, then run the decoder on the canvas against it."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config.get_text_config())
    model.model.encoder(input_ids=context, **{cache_kwarg(model.model.encoder.forward): cache})
    kwargs = {cache_kwarg(model.forward): cache}
    return model(decoder_input_ids=canvas, self_conditioning_logits=sc_logits, **kwargs).logits


def _staircase(p: int, c: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask [1, 1, L, L], positions [1, L]) of [prompt | clean | noisy] for one unpadded row."""
    length = p + 2 * c
    idx = torch.arange(length)
    positions = torch.cat([torch.arange(p + c), torch.arange(p, p + c)])
    noisy = idx >= p + c
    blocks = torch.where(idx < p, -1, (positions - p) // block)
    bq, bk = blocks[:, None], blocks[None, :]
    clean_rule = ~noisy[None, :] & (bk <= bq)
    noisy_rule = (~noisy[None, :] & (bk < bq)) | (noisy[None, :] & (bk == bq))
    mask = torch.where(noisy[:, None], noisy_rule, clean_rule)
    return mask[None, None], positions[None]


def _sequence(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(4, 97, (1, P), generator=g)
    clean = torch.randint(4, 97, (1, C), generator=g)
    noisy = torch.where(torch.rand(1, C, generator=g) < 0.5, torch.randint(4, 97, (1, C), generator=g), clean)
    return prompt, clean, noisy


def test_staircase_forward_equals_the_release_pipeline_block_by_block(policy):
    prompt, clean, noisy = _sequence()
    mask, positions = _staircase(P, C, BLOCK)
    x = torch.cat([prompt, clean, noisy], 1)
    with torch.no_grad():
        one_pass = policy(x, attention_mask=mask, position_ids=positions, logits_from=P + C).logits  # [1, C, V]
        for b in range(BLOCKS):
            context = torch.cat([prompt, clean[:, : b * BLOCK]], 1)
            expected = _native(policy.model, context, noisy[:, b * BLOCK : (b + 1) * BLOCK])
            torch.testing.assert_close(one_pass[:, b * BLOCK : (b + 1) * BLOCK], expected, rtol=1e-5, atol=1e-5)


def test_sliding_window_matters_and_is_applied(policy):
    """With a context longer than the window, dropping the window from our masks changes the logits
    (so the equality above is not vacuous)."""
    prompt, clean, noisy = _sequence(1)
    context = torch.cat([prompt, clean[:, : 2 * BLOCK]], 1)  # 13 tokens > window 5
    canvas = noisy[:, 2 * BLOCK : 3 * BLOCK]
    x = torch.cat([context, canvas], 1)
    with torch.no_grad():
        ours = policy(x, logits_from=context.shape[1]).logits
        window = policy.model.config.get_text_config().sliding_window
        policy.model.config.get_text_config().sliding_window = 10**6
        unwindowed = policy(x, logits_from=context.shape[1]).logits
        policy.model.config.get_text_config().sliding_window = window
        expected = _native(policy.model, context, canvas)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    assert (unwindowed - expected).abs().max() > 1e-4


def test_left_padding_is_invisible(policy):
    prompt, _, noisy = _sequence(2)
    canvas = noisy[:, :BLOCK]
    outs = []
    for pad in (0, 3):
        ids = torch.cat([torch.zeros(1, pad, dtype=torch.long), prompt, canvas], 1)
        valid = ids.new_ones(ids.shape, dtype=torch.bool)
        valid[:, :pad] = False
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)
        mask = valid[:, None, None, :].expand(1, 1, ids.shape[1], ids.shape[1]) | torch.eye(
            ids.shape[1], dtype=torch.bool
        )
        with torch.no_grad():
            outs.append(policy(ids, attention_mask=mask, position_ids=positions, logits_from=pad + P).logits)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_cache_path_equals_the_one_shot_forward(policy):
    """Prefill the prompt, decode block 0 against the cache, commit block 0, decode block 1."""
    prompt, clean, noisy = _sequence(3)
    with torch.no_grad():
        prefill = policy(prompt, logits_from=P, use_cache=True)
        assert prefill.logits.shape[1] == 0 and prefill.past_key_values.get_seq_length() == P
        cache = prefill.past_key_values
        block0 = policy(noisy[:, :BLOCK], past_key_values=cache).logits  # canvas only: nothing is cached
        assert cache.get_seq_length() == P
        torch.testing.assert_close(block0, _native(policy.model, prompt, noisy[:, :BLOCK]), rtol=1e-5, atol=1e-5)
        # commit clean block 0 and decode noisy block 1 in one call: context rows extend the cache
        x = torch.cat([clean[:, :BLOCK], noisy[:, BLOCK : 2 * BLOCK]], 1)
        block1 = policy(x, past_key_values=cache, logits_from=BLOCK).logits
        assert cache.get_seq_length() == P + BLOCK
    expected = _native(policy.model, torch.cat([prompt, clean[:, :BLOCK]], 1), noisy[:, BLOCK : 2 * BLOCK])
    torch.testing.assert_close(block1, expected, rtol=1e-5, atol=1e-5)


def test_self_conditioning_logits_reach_the_decoder(policy):
    prompt, _, noisy = _sequence(4)
    sc = torch.randn(1, BLOCK, policy.vocab_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = policy(torch.cat([prompt, noisy[:, :BLOCK]], 1), logits_from=P, self_conditioning_logits=sc).logits
        plain = policy(torch.cat([prompt, noisy[:, :BLOCK]], 1), logits_from=P).logits
    torch.testing.assert_close(ours, _native(policy.model, prompt, noisy[:, :BLOCK], sc), rtol=1e-5, atol=1e-5)
    assert (ours - plain).abs().max() > 1e-4


def test_a_canvas_needs_context(policy):
    with pytest.raises(ValueError, match="logits_from"):
        policy(torch.randint(4, 97, (1, 8)))


def test_corrupt_draws_uniform_tokens_not_the_mask(policy):
    ids = torch.randint(4, 97, (4, 64), generator=torch.Generator().manual_seed(0))
    masked = torch.rand(4, 64, generator=torch.Generator().manual_seed(1)) < 0.5
    a = policy.corrupt(ids, masked, torch.Generator().manual_seed(5))
    b = policy.corrupt(ids, masked, torch.Generator().manual_seed(5))
    assert policy.spec.noise == "uniform" and torch.equal(a, b) and torch.equal(a[~masked], ids[~masked])
    assert not (a[masked] == policy.mask_token_id).all() and a[masked].unique().numel() > 20


@pytest.mark.parametrize("writer", [save_original_checkpoint, export_hf])
def test_checkpoint_round_trip(policy, writer, tmp_path):
    tokenizer = build_char_tokenizer()
    writer(policy, tokenizer, tmp_path)
    loaded, _ = load_policy(ModelConfig(path=tmp_path))
    assert (loaded.spec.name, loaded.block_size, loaded.mask_token_id) == (
        "diffusion_gemma",
        BLOCK,
        tokenizer.mask_token_id,
    )
    prompt, _, noisy = _sequence(5)
    x = torch.cat([prompt, noisy[:, :BLOCK]], 1)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(x, logits_from=P).logits, policy(x, logits_from=P).logits, rtol=1e-5, atol=1e-5
        )
    bf16, _ = load_policy(ModelConfig(path=tmp_path, dtype="bfloat16"))
    assert next(bf16.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.isfinite(bf16(x, logits_from=P).logits).all()


def test_missing_module_names_the_transformers_release(monkeypatch):
    from stabledrl.common.models.diffusion_gemma import require_diffusion_gemma

    monkeypatch.setitem(sys.modules, "transformers.models.diffusion_gemma", None)
    with pytest.raises(ImportError, match="transformers release that ships transformers.models.diffusion_gemma"):
        require_diffusion_gemma()

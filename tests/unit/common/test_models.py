"""Model families: released on-disk formats load to the same function, ids come from the checkpoint,
Dream's shift is undone, block families obey block masks, and bad inputs fail with a clear reason.
(DiffusionGemma has its own file: test_models_gemma.py.)"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from stabledrl.common.attention import block_causal_mask, block_ids, full_mask
from stabledrl.common.config.base import ConfigError, validate
from stabledrl.common.config.model import ModelConfig
from stabledrl.common.models import (
    CheckpointError,
    build_tiny_policy,
    export_hf,
    load_policy,
    read_state_dict,
    save_original_checkpoint,
    write_preset,
)
from stabledrl.common.tokenizer import build_char_tokenizer
from stabledrl.common.types import left_pad

torch.set_num_threads(1)
FAMILIES3 = ["llada", "dream", "sdar"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def _logits(policy, ids: torch.Tensor) -> torch.Tensor:
    start = 1 if policy.spec.shifted_logits else None
    with torch.no_grad():
        return policy(ids, attention_mask=full_mask(torch.ones_like(ids, dtype=torch.bool)), logits_from=start).logits


def _ids(length: int = 12, batch: int = 2) -> torch.Tensor:
    return torch.randint(4, 97, (batch, length), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("family", FAMILIES3)
def test_original_format_round_trip_gives_the_same_logits(family, tokenizer, tmp_path):
    source = build_tiny_policy(family, seed=3)
    save_original_checkpoint(source, tokenizer, tmp_path)
    loaded, loaded_tok = load_policy(ModelConfig(path=tmp_path))
    assert loaded.spec.name == family and loaded_tok.mask_token_id == tokenizer.mask_token_id
    torch.testing.assert_close(_logits(loaded, _ids()), _logits(source, _ids()), rtol=0, atol=1e-6)


def test_llada_checkpoint_uses_released_names_and_keys(tokenizer, tmp_path):
    save_original_checkpoint(build_tiny_policy("llada"), tokenizer, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["model_type"] == "llada" and raw["architectures"] == ["LLaDAModelLM"]
    assert {"d_model", "n_heads", "n_kv_heads", "n_layers", "mlp_hidden_size", "rope_theta", "weight_tying"} <= set(raw)
    # LLaDA's code trains with dropout 0.1 wherever the config leaves one out; the release sets all three to 0
    assert (raw["attention_dropout"], raw["residual_dropout"], raw["embedding_dropout"]) == (0.0, 0.0, 0.0)
    names = set(read_state_dict(tmp_path))
    parts = ("q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out", "attn_norm", "ff_norm")
    block = {f"model.transformer.blocks.0.{n}.weight" for n in parts}
    assert block <= names
    assert {"model.transformer.wte.weight", "model.transformer.ln_f.weight", "model.transformer.ff_out.weight"} <= names
    assert not any(n.startswith("model.layers") or n == "lm_head.weight" for n in names)


def _llada_reference(raw: dict, state: dict, ids: torch.Tensor) -> torch.Tensor:
    """LLaDA's forward written from its released block (OLMo-style code), on its own parameter names:
    RMSNorm, rotate-half RoPE, bidirectional attention, SwiGLU ff_out(silu(ff_proj x) * up_proj x)."""
    b, n = ids.shape
    d, heads, kv_heads, eps = raw["d_model"], raw["n_heads"], raw["n_kv_heads"], raw["rms_norm_eps"]
    hd = d // heads
    inv_freq = 1.0 / raw["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)
    angles = torch.outer(torch.arange(n).float(), inv_freq).repeat(1, 2)  # [L, hd]

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(t):  # [B, h, L, hd]
        t1, t2 = t[..., : hd // 2], t[..., hd // 2 :]
        return t * angles.cos() + torch.cat([-t2, t1], -1) * angles.sin()

    x = state["model.transformer.wte.weight"][ids]
    for i in range(raw["n_layers"]):
        w = lambda name, i=i: state[f"model.transformer.blocks.{i}.{name}.weight"]  # noqa: E731
        h = rms(x, w("attn_norm"))
        q = (h @ w("q_proj").T).view(b, n, heads, hd).transpose(1, 2)
        k = (h @ w("k_proj").T).view(b, n, kv_heads, hd).transpose(1, 2).repeat_interleave(heads // kv_heads, 1)
        v = (h @ w("v_proj").T).view(b, n, kv_heads, hd).transpose(1, 2).repeat_interleave(heads // kv_heads, 1)
        att = F.scaled_dot_product_attention(rope(q), rope(k), v)  # no mask: every token sees every token
        x = x + att.transpose(1, 2).reshape(b, n, d) @ w("attn_out").T
        h = rms(x, w("ff_norm"))
        x = x + (F.silu(h @ w("ff_proj").T) * (h @ w("up_proj").T)) @ w("ff_out").T
    return rms(x, state["model.transformer.ln_f.weight"]) @ state["model.transformer.ff_out.weight"].T


def test_llada_conversion_computes_the_released_forward(tokenizer, tmp_path):
    """Gate vs up projection, norm eps, RoPE layout and bidirectionality all matter here: a swapped
    ff_proj / up_proj or a causal mask changes the logits."""
    save_original_checkpoint(build_tiny_policy("llada", seed=5), tokenizer, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    policy, _ = load_policy(ModelConfig(path=tmp_path))
    ids = _ids()
    with torch.no_grad():
        reference = _llada_reference(raw, read_state_dict(tmp_path), ids)
        unmasked = policy(ids).logits  # no mask given: the model itself must be bidirectional
    torch.testing.assert_close(_logits(policy, ids), reference, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(unmasked, reference, rtol=1e-4, atol=1e-5)


def _llada_reference_bf16(raw: dict, state: dict, ids: torch.Tensor) -> torch.Tensor:
    """LLaDA's forward in bf16 in its released code's operation order: the norm computed in fp32, cast,
    then times the bf16 weight; q and k rotated in fp32 (rope_full_precision) and cast back; everything
    else in bf16 through the same kernels a Linear calls."""
    b, n = ids.shape
    d, heads, kv_heads, eps = raw["d_model"], raw["n_heads"], raw["n_kv_heads"], raw["rms_norm_eps"]
    hd = d // heads
    state = {k: v.to(torch.bfloat16) for k, v in state.items()}
    inv_freq = 1.0 / raw["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)
    angles = torch.outer(torch.arange(n).float(), inv_freq)
    angles = torch.cat([angles, angles], -1)  # [L, hd] fp32

    def rms(x, w):
        x32 = x.float()
        return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)

    def rope(t):  # [B, h, L, hd] bf16 -> rotated in fp32, cast back
        t32 = t.float()
        t1, t2 = t32[..., : hd // 2], t32[..., hd // 2 :]
        return (t32 * angles.cos() + torch.cat([-t2, t1], -1) * angles.sin()).to(t.dtype)

    x = state["model.transformer.wte.weight"][ids]
    for i in range(raw["n_layers"]):
        w = lambda name, i=i: state[f"model.transformer.blocks.{i}.{name}.weight"]  # noqa: E731
        h = rms(x, w("attn_norm"))
        q = F.linear(h, w("q_proj")).view(b, n, heads, hd).transpose(1, 2)
        k = F.linear(h, w("k_proj")).view(b, n, kv_heads, hd).transpose(1, 2)
        v = F.linear(h, w("v_proj")).view(b, n, kv_heads, hd).transpose(1, 2)
        att = F.scaled_dot_product_attention(rope(q), rope(k), v, enable_gqa=heads != kv_heads)
        x = x + F.linear(att.transpose(1, 2).reshape(b, n, d), w("attn_out"))
        h = rms(x, w("ff_norm"))
        x = x + F.linear(F.silu(F.linear(h, w("ff_proj"))) * F.linear(h, w("up_proj")), w("ff_out"))
    return F.linear(rms(x, state["model.transformer.ln_f.weight"]), state["model.transformer.ff_out.weight"])


def test_llada_in_bf16_is_its_released_code_element_for_element(tokenizer, tmp_path):
    """In bf16 the project's LLaDA forward follows the released code's operation order, so its logits are
    equal to it bit for bit (transformers' Llama rotates q and k in bf16: then most elements differ)."""
    from transformers.models.llama import modeling_llama

    save_original_checkpoint(build_tiny_policy("llada", seed=5), tokenizer, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    policy, _ = load_policy(ModelConfig(path=tmp_path, dtype="bfloat16"))
    ids = _ids()
    with torch.no_grad():
        reference = _llada_reference_bf16(raw, read_state_dict(tmp_path), ids)
        assert torch.equal(policy(ids).logits, reference)
        policy.to(torch.float32).to(torch.bfloat16)  # a cast rounds the buffer, not the fp32 frequencies used
        assert torch.equal(policy(ids).logits, reference)
        # another Llama model, its tables in its own dtype: the rotation is transformers' own
        q, k = torch.randn(2, 1, 2, 5, 8, dtype=torch.bfloat16).unbind(0)
        cos, sin = torch.randn(2, 1, 5, 8, dtype=torch.bfloat16).unbind(0)
        rotated = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
        half = lambda t: torch.cat([-t[..., 4:], t[..., :4]], -1)  # noqa: E731
        assert torch.equal(rotated[0], q * cos[:, None] + half(q) * sin[:, None])


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_mask_token_id_comes_from_the_checkpoint_config(family, tokenizer, tmp_path):
    save_original_checkpoint(build_tiny_policy(family, mask_token_id=7), tokenizer, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["mask_token_id"] == 7
    policy, tok = load_policy(ModelConfig(path=tmp_path))
    assert policy.mask_token_id == 7 != tok.mask_token_id


def test_sdar_mask_token_comes_from_the_tokenizer_like_the_release(tokenizer, tmp_path):
    save_original_checkpoint(build_tiny_policy("sdar"), tokenizer, tmp_path)
    assert "mask_token_id" not in json.loads((tmp_path / "config.json").read_text())
    policy, _ = load_policy(ModelConfig(path=tmp_path))
    assert policy.mask_token_id == tokenizer.mask_token_id and policy.block_size == 4


def test_dream_aligned_logits_are_the_raw_logits_shifted_by_one(tokenizer, tmp_path):
    save_original_checkpoint(build_tiny_policy("dream"), tokenizer, tmp_path)
    policy, _ = load_policy(ModelConfig(path=tmp_path))
    ids = _ids(10)
    mask = full_mask(torch.ones_like(ids, dtype=torch.bool))
    with torch.no_grad():
        raw = policy.model(input_ids=ids, attention_mask=mask).logits  # [B, L, V], row k predicts k + 1
        aligned = policy(ids, attention_mask=mask, logits_from=1).logits  # row j predicts token j + 1
    torch.testing.assert_close(aligned, raw[:, :-1])
    with pytest.raises(ValueError, match="logits_from >= 1"):
        policy(ids)


def test_dream_is_bidirectional(tokenizer, tmp_path):
    save_original_checkpoint(build_tiny_policy("dream"), tokenizer, tmp_path)
    policy, _ = load_policy(ModelConfig(path=tmp_path))
    x = _ids(10)
    y = x.clone()
    y[:, -1] = 3
    assert (_logits(policy, x)[:, 0] - _logits(policy, y)[:, 0]).abs().max() > 1e-4


def test_loaded_sdar_honours_block_causal_masks_and_padding(tokenizer, tmp_path):
    save_original_checkpoint(build_tiny_policy("sdar", seed=2), tokenizer, tmp_path)
    policy, _ = load_policy(ModelConfig(path=tmp_path))
    prompt, completion = torch.tensor([5, 6, 7, 8]), torch.randint(4, 97, (8,))
    logits = []
    for width, last in ((4, 9), (7, 9), (4, 3)):
        ids, pm = left_pad([prompt], pad_id=0, width=width)
        block = completion.clone()
        block[4:] = last  # change the last block only in the third run
        x = torch.cat([ids, block[None]], 1)
        valid = torch.cat([pm, torch.ones(1, 8, dtype=torch.bool)], 1)
        pos = (valid.long().cumsum(1) - 1).clamp(min=0)
        with torch.no_grad():
            out = policy(
                x, attention_mask=block_causal_mask(block_ids(pm, 8, 4), valid), position_ids=pos, logits_from=width
            )
        logits.append(out.logits)
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)  # padding is invisible
    torch.testing.assert_close(logits[0][:, :4], logits[2][:, :4])  # block 0 never sees block 1
    assert (logits[0][:, 4:] - logits[2][:, 4:]).abs().max() > 1e-4


@pytest.mark.parametrize("family", FAMILIES3)
def test_bfloat16_loading(family, tokenizer, tmp_path):
    source = build_tiny_policy(family)
    save_original_checkpoint(source, tokenizer, tmp_path)
    policy, _ = load_policy(ModelConfig(path=tmp_path, dtype="bfloat16"))
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    reference = _logits(source, _ids())
    assert (_logits(policy, _ids()).float() - reference).abs().max() < 0.05 * reference.abs().max()


@pytest.mark.parametrize("family", FAMILIES3)
def test_export_hf_round_trips_through_plain_transformers(family, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    source = build_tiny_policy(family, block_size=8, mask_token_id=9)
    export_hf(source, tokenizer, tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True).eval()
    ids = _ids()
    with torch.no_grad():
        expected = source.model(input_ids=ids).logits
        torch.testing.assert_close(plain(input_ids=ids).logits, expected)  # bidirectional from config.json alone
    again, _ = load_policy(ModelConfig(path=tmp_path))
    assert (again.spec.name, again.mask_token_id, again.block_size) == (family, 9, 8)
    torch.testing.assert_close(_logits(again, ids), _logits(source, ids))


def test_block_size_and_dtype_overrides(tokenizer, tmp_path):
    save_original_checkpoint(build_tiny_policy("sdar", block_size=8), tokenizer, tmp_path)
    assert load_policy(ModelConfig(path=tmp_path))[0].block_size == 8  # recorded in config.json
    policy, _ = load_policy(ModelConfig(path=tmp_path, block_size=16), dtype=torch.bfloat16)
    assert policy.block_size == 16 and next(policy.parameters()).dtype == torch.bfloat16


def test_preset_writer_materialises_the_same_model(tmp_path):
    cfg = ModelConfig(preset="tiny-dream", preset_shape={"hidden_size": 32, "seed": 4})
    write_preset(cfg, tmp_path)
    preset, _ = load_policy(cfg)
    loaded, tok = load_policy(ModelConfig(path=tmp_path))
    assert loaded.model.config.hidden_size == 32 and len(tok) == preset.vocab_size
    torch.testing.assert_close(_logits(loaded, _ids()), _logits(preset, _ids()))


def test_gradient_checkpointing_keeps_the_gradients():
    grads = []
    for checkpointing in (False, True):
        policy, _ = load_policy(ModelConfig(preset="tiny-llada", gradient_checkpointing=checkpointing))
        policy.train()
        policy(_ids(), logits_from=0).logits.logsumexp(-1).mean().backward()
        grads.append(policy.model.model.layers[0].mlp.gate_proj.weight.grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_corrupt_writes_the_mask_token():
    policy = build_tiny_policy("llada")
    ids, masked = _ids(), torch.zeros(2, 12, dtype=torch.bool)
    masked[:, 3:6] = True
    out = policy.corrupt(ids, masked)
    assert (out[masked] == policy.mask_token_id).all() and torch.equal(out[~masked], ids[~masked])


def _padded_block_batch(policy):
    ids, pm = left_pad([torch.arange(5, 10), torch.tensor([10, 11])], pad_id=0)
    completion = torch.randint(4, 97, (2, 8), generator=torch.Generator().manual_seed(0))
    valid = torch.cat([pm, torch.ones(2, 8, dtype=torch.bool)], 1)
    mask = block_causal_mask(block_ids(pm, 8, 4), valid) if policy.is_block_diffusion else full_mask(valid)
    return torch.cat([ids, completion], 1), mask, (valid.long().cumsum(1) - 1).clamp(min=0), ids.shape[1]


@pytest.mark.gpu
@pytest.mark.parametrize("attn", ["sdpa", "flex_attention"])
@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "diffusion_gemma"])
def test_cuda_attention_backends_obey_our_masks(family, attn, tokenizer, tmp_path):
    """transformers' flex path adds a tensor mask to the scores, so a raw bool mask would mask
    nothing; the policy hands flex a BlockMask instead. Both backends must match the CPU logits."""
    if family == "diffusion_gemma":
        pytest.importorskip("transformers.models.diffusion_gemma")
    source = build_tiny_policy(family, seed=1)
    save_original_checkpoint(source, tokenizer, tmp_path)
    x, mask, pos, start = _padded_block_batch(source)
    policy, _ = load_policy(ModelConfig(path=tmp_path, attn_implementation=attn), device="cuda")
    with torch.no_grad():
        expected = source(x, attention_mask=mask, position_ids=pos, logits_from=start).logits
        got = policy(x.cuda(), attention_mask=mask.cuda(), position_ids=pos.cuda(), logits_from=start).logits.cpu()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_flash_attention_refuses_a_4d_mask():
    from stabledrl.common.models.masks import backend_mask

    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    assert backend_mask(mask, "sdpa") is mask and backend_mask(None, "flash_attention_2") is None
    with pytest.raises(ValueError, match="cannot apply a 4-D attention mask"):
        backend_mask(mask, "flash_attention_2")


# ----------------------------------------------------------------------------------- failures
def test_bad_directory_fails_clearly(tmp_path):
    with pytest.raises(CheckpointError, match="is not a directory"):
        load_policy(ModelConfig(path=tmp_path / "nope"))
    with pytest.raises(CheckpointError, match="no config.json"):
        load_policy(ModelConfig(path=tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match="no dLLM family"):
        load_policy(ModelConfig(path=tmp_path))


def test_missing_mask_token_fails_clearly(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(["<pad>", "<eos>", "x", "y"] + [f"t{i}" for i in range(93)])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    bare = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<pad>")
    save_original_checkpoint(build_tiny_policy("sdar"), bare, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw.pop("mask_token_id")
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="no mask token"):
        load_policy(ModelConfig(path=tmp_path))


def test_unsupported_llada_settings_and_missing_weights_fail(tokenizer, tmp_path):
    from safetensors.torch import load_file, save_file

    save_original_checkpoint(build_tiny_policy("llada"), tokenizer, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "alibi": True}))
    with pytest.raises(CheckpointError, match="alibi"):
        load_policy(ModelConfig(path=tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(raw))
    state = load_file(str(tmp_path / "model.safetensors"))
    state.pop("model.transformer.blocks.1.up_proj.weight")
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="up_proj"):
        load_policy(ModelConfig(path=tmp_path))


def test_family_override_must_match_the_checkpoint(tokenizer, tmp_path):
    save_original_checkpoint(build_tiny_policy("dream"), tokenizer, tmp_path)
    with pytest.raises(CheckpointError, match="'llada'"):
        load_policy(ModelConfig(path=tmp_path, family="llada"))


def test_flash_attention_is_refused_for_block_families(tokenizer, tmp_path):
    save_original_checkpoint(build_tiny_policy("sdar"), tokenizer, tmp_path)
    with pytest.raises(CheckpointError, match="block-causal"):
        load_policy(ModelConfig(path=tmp_path, attn_implementation="flash_attention_2"))


def test_model_config_rejects_eager_and_ambiguous_sources(tmp_path):
    with pytest.raises(ConfigError, match="ignores custom 4-D"):
        validate(ModelConfig, {"preset": "tiny-llada", "attn_implementation": "eager"})
    with pytest.raises(ConfigError, match="exactly one"):
        validate(ModelConfig, {"preset": "tiny-llada", "path": str(tmp_path)})
    with pytest.raises(ConfigError, match="exactly one"):
        validate(ModelConfig, {})
    with pytest.raises(ConfigError, match="must divide"):
        validate(ModelConfig, {"preset": "tiny-sdar", "preset_shape": {"hidden_size": 30}})
    with pytest.raises(ConfigError, match="contradicts"):
        validate(ModelConfig, {"preset": "tiny-sdar", "family": "dream"})
    with pytest.raises(ConfigError, match="dtyp: unknown key.*did you mean dtype"):
        validate(ModelConfig, {"preset": "tiny-sdar", "dtyp": "float32"})


def _byte_level_alphabet() -> list[str]:
    """GPT-2's byte -> printable-unicode map (what Qwen2's byte-level BPE vocab is written in)."""
    keep = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def test_dream_style_tokenizer_loads_without_its_shipped_code(tmp_path):
    """vocab.json + merges.txt, a custom tokenizer_class behind auto_map, and the special tokens
    declared only in added_tokens_decoder: rebuilt as a Qwen2 tokenizer at the declared ids."""
    from stabledrl.common.models import load_tokenizer

    alphabet = _byte_level_alphabet()
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab["ab"] = len(vocab)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    added = {"257": "<|endoftext|>", "258": "<|mask|>", "259": "<|im_start|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "DreamTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "mask_token": "<|mask|>",
        "added_tokens_decoder": {i: {"content": c, "special": True} for i, c in added.items()},
        "chat_template": "{% for m in messages %}<|im_start|>{{ m['content'] }}{% endfor %}",
    }))  # fmt: skip
    shipped_code = {"AutoModel": "modeling_dream.DreamModel"}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "Dream", "auto_map": shipped_code}))
    tok = load_tokenizer(tmp_path)
    assert (tok.mask_token_id, tok.eos_token_id) == (258, 257)
    assert tok("ab<|mask|>b").input_ids == [256, 258, vocab["b"]]
    assert tok.apply_chat_template([{"role": "user", "content": "ab"}], tokenize=False) == "<|im_start|>ab"


def test_checkpointed_layers_recompute_only_the_first_layers_and_keep_the_gradients():
    from transformers.modeling_layers import GradientCheckpointingLayer

    from stabledrl.learner.zero import enable_gradient_checkpointing

    grads = []
    for cfg in ({}, {"gradient_checkpointing": True, "checkpointed_layers": 1}):
        policy, _ = load_policy(ModelConfig(preset="tiny-llada", **cfg))
        layers = [m for m in policy.modules() if isinstance(m, GradientCheckpointingLayer)]
        if cfg:
            assert [m.gradient_checkpointing for m in layers] == [True] + [False] * (len(layers) - 1)
            recomputed, kept = [], []
            layers[0].mlp.register_forward_pre_hook(lambda *_, calls=recomputed: calls.append(1))
            layers[1].mlp.register_forward_pre_hook(lambda *_, calls=kept: calls.append(1))
            assert enable_gradient_checkpointing(policy)  # learner.deepspeed's switch keeps the loaded choice
            assert [m.gradient_checkpointing for m in layers] == [True] + [False] * (len(layers) - 1)
        policy.train()
        policy(_ids(), logits_from=0).logits.logsumexp(-1).mean().backward()
        if cfg:
            assert len(recomputed) == 2 and len(kept) == 1  # layer 0 recomputed in the backward, layer 1 not
        grads.append(policy.model.model.layers[1].mlp.gate_proj.weight.grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_checkpointed_layers_are_refused_without_checkpointing_or_beyond_the_model():
    with pytest.raises(ValueError, match="set model.gradient_checkpointing true"):
        ModelConfig(preset="tiny-llada", checkpointed_layers=1)
    with pytest.raises(CheckpointError, match="checkpointed_layers = 9, but the model has 2 decoder layers"):
        load_policy(ModelConfig(preset="tiny-llada", gradient_checkpointing=True, checkpointed_layers=9))

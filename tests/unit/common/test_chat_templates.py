"""Prompts through the chat template (common/tasks/prompts.py) with tokenizer files shaped like the
released LLaDA-8B-Instruct, Dream-v0-Instruct-7B and SDAR / TraDo tokenizers: the markers come out
at the released ids, exactly once, and rollouts, evaluation and the warm start encode alike."""
from __future__ import annotations

import pytest
import torch

from stabledrl.common.config.estimator import BlockRandomConfig
from stabledrl.common.config.model import ModelConfig
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.config.task import parse_task_config
from stabledrl.common.models import (
    build_tiny_policy, load_policy, load_tokenizer, resolve_token_ids, save_original_checkpoint,
)
from stabledrl.common.models.release_tokenizers import RELEASES, write_release_tokenizer
from stabledrl.common.sandbox.scorer import RewardScorer
from stabledrl.common.tasks import Row, build_task
from stabledrl.common.tasks.prompts import PromptError, prompt_ids, prompt_text
from stabledrl.common.tokenizer import build_char_tokenizer
from stabledrl.learner.sft import encode_pairs
from stabledrl.rollout.engine import TorchRolloutEngine
from stabledrl.rollout.evaluate import evaluate
from stabledrl.common.types import PromptRequest
from stabledrl.rollout.workflow import encode_prompt, run_episodes

ROW = Row(prompt_id="q1", prompt="What is 2+3?", answer="5")
SAMPLER = SamplerConfig(gen_length=4, block_length=4, steps=4, temperature=1.0)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    out = {}
    for family in RELEASES:
        write_release_tokenizer(family, root / family)
        out[family] = load_tokenizer(root / family)
    return out


def task(**fields):
    return build_task(parse_task_config({"name": "arithmetic", "template": "Q: {prompt}", **fields}))


def text_ids(text: str) -> list[int]:
    return list(text.encode())  # the test vocabulary is byte-level: one id per byte, the byte's value


# What each released template renders for a system + user conversation and for a user turn alone
# (for Dream and SDAR / TraDo also what their RL recipes' hand-written prompts hold).
EXPECTED = {
    "llada": (
        (
            "<|startoftext|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nQ: What is 2+3?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
        ),
        (
            "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nQ: What is 2+3?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
        ),
    ),
    "dream": (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ: What is 2+3?<|im_end|>\n<|im_start|>assistant\n",
        (
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nQ: What is 2+3?<|im_end|>\n"
            "<|im_start|>assistant\n"
        ),
    ),
    "sdar": (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ: What is 2+3?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nQ: What is 2+3?<|im_end|>\n<|im_start|>assistant\n",
    ),
}


@pytest.mark.parametrize("family", sorted(RELEASES))
def test_the_prompt_is_the_released_conversation(tokenizers, family):
    with_system, alone = EXPECTED[family]
    assert prompt_text(tokenizers[family], task(system_prompt="Be brief."), ROW) == with_system
    assert prompt_text(tokenizers[family], task(), ROW) == alone


def test_llada_ids_carry_bos_and_headers_once_at_the_released_ids(tokenizers):
    bos, start, end, eot = 126080, 126346, 126347, 126348
    ids = prompt_ids(tokenizers["llada"], task(), ROW)
    expected = ([bos, start] + text_ids("user") + [end] + text_ids("\n\nQ: What is 2+3?") + [eot, start]
                + text_ids("assistant") + [end] + text_ids("\n\n"))
    assert ids == expected
    assert ids.count(bos) == 1  # a second BOS is what encoding the templated text with special tokens adds
    assert tokenizers["llada"].encode(prompt_text(tokenizers["llada"], task(), ROW))[:2] == [bos, bos]


@pytest.mark.parametrize("family,mask", [("dream", 151666), ("sdar", 151669)])
def test_qwen_style_ids_carry_im_markers_at_the_released_ids(tokenizers, family, mask):
    im_start, im_end = 151644, 151645
    ids = prompt_ids(tokenizers[family], task(), ROW)
    system = [im_start] + text_ids("system\nYou are a helpful assistant.") + [im_end] + text_ids("\n")
    turn = (
        [im_start]
        + text_ids("user\nQ: What is 2+3?")
        + [im_end]
        + text_ids("\n")
        + [im_start]
        + text_ids("assistant\n")
    )
    assert ids == (system if family == "dream" else []) + turn
    assert tokenizers[family].mask_token_id == mask and mask not in ids


def test_plain_tokenizer_and_the_off_switch_encode_the_rendered_text(tokenizers):
    char = build_char_tokenizer()
    assert prompt_ids(char, task(), ROW) == char.encode("Q: What is 2+3?", add_special_tokens=False)
    off = task(chat_template="off", system_prompt="Be brief.")
    assert prompt_ids(tokenizers["llada"], off, ROW) == text_ids("Be brief.\n\nQ: What is 2+3?")
    with pytest.raises(PromptError, match="no chat template"):
        prompt_ids(char, task(chat_template="on"), ROW)


@pytest.mark.parametrize(
    "family,marker", [("llada", "<|start_header_id|>"), ("dream", "<|im_start|>"), ("sdar", "<|im_end|>")]
)
def test_content_that_is_already_templated_is_refused(tokenizers, family, marker):
    templated = Row(prompt_id="t", prompt=f"{marker}user\nWhat is 2+3?", answer="5")
    with pytest.raises(PromptError, match="already contains the special token"):
        prompt_ids(tokenizers[family], task(), templated)
    assert prompt_ids(tokenizers[family], task(chat_template="off"), templated)  # pre-templated data: template off


class RecordingEngine:
    """Answers every prompt with one EOS and records the prompts it was given."""

    policy_version = 0

    def __init__(self, eos: int) -> None:
        self.eos, self.prompts = eos, []

    def generate(self, prompts, seeds, sampler_cfg):
        from stabledrl.rollout.sampling import GenerationOutput

        self.prompts += [p.tolist() for p in prompts]
        n = len(prompts)
        ids = torch.full((n, sampler_cfg.gen_length), self.eos, dtype=torch.long)
        return GenerationOutput(completion_ids=ids, completion_length=torch.ones(n, dtype=torch.long),
                                decode_step=torch.zeros_like(ids), num_forwards=1, tokens_generated=n, time_s=0.0)


def test_rollouts_evaluation_and_warm_start_encode_alike(tokenizers, tmp_path):
    """A LLaDA-format checkpoint at the real vocabulary (tiny width) with the release tokenizer:
    the rollout's samples, the evaluation's prompts and the SFT pairs all carry ``prompt_ids``."""
    tok, spec = tokenizers["llada"], RELEASES["llada"]
    ids = spec.ids
    policy = build_tiny_policy("llada", vocab_size=spec.vocab_size, mask_token_id=ids["mask_token_id"],
                               eos_token_id=ids["eos_token_id"], pad_token_id=ids["pad_token_id"],
                               bos_token_id=ids["bos_token_id"], hidden_size=8, intermediate_size=16,
                               num_attention_heads=2, num_key_value_heads=1)
    save_original_checkpoint(policy, tok, tmp_path / "ckpt")
    write_release_tokenizer("llada", tmp_path / "ckpt")  # the release's own file layout, over save_pretrained's
    policy, tok = load_policy(ModelConfig(path=tmp_path / "ckpt"))
    assert (policy.mask_token_id, policy.eos_token_id, policy.vocab_size) == (126336, 126081, 126464)
    cfg = parse_task_config({"name": "arithmetic", "template": "Q: {prompt}"})
    t = build_task(cfg)
    expected = prompt_ids(tok, t, ROW)
    assert encode_prompt(tok, t, ROW).tolist() == expected

    with RewardScorer(cfg, t) as scorer:
        episodes = run_episodes(TorchRolloutEngine(policy), [PromptRequest(0, ROW)], tokenizer=tok,
                                task=t, scorer=scorer, group_size=2, sampler=SAMPLER,
                                estimator=BlockRandomConfig(block_length=4, num_draws=1), seed=0)
    assert [s.prompt_ids.tolist() for s in episodes[0].group.samples] == [expected, expected]

    engine = RecordingEngine(policy.eos_token_id)
    evaluate(engine, [ROW], t, tok, SAMPLER, 1, 0, eos_token_id=policy.eos_token_id)
    assert engine.prompts == [expected]

    batch = encode_pairs(tok, t, [ROW], 4, eos_token_id=policy.eos_token_id, pad_token_id=policy.pad_token_id)
    width = batch.prompt_width
    assert batch.input_ids[0, :width].tolist() == expected  # the answer follows the templated prompt
    assert batch.input_ids[0, width:].tolist() == [ord("5"), 126081, 126081, 126081]


@pytest.mark.parametrize("family", sorted(RELEASES))
def test_release_tokenizer_files_load_with_the_released_ids(tmp_path, family):
    spec = write_release_tokenizer(family, tmp_path / family)
    tok = load_tokenizer(tmp_path / family)
    assert max(tok.get_vocab().values()) < spec.vocab_size == {"llada": 126464, "dream": 152064, "sdar": 151936}[family]
    mask, eos, pad = resolve_token_ids({}, tok)
    assert (mask, eos, pad) == (spec.ids["mask_token_id"], spec.ids["eos_token_id"], spec.ids["pad_token_id"])
    assert {c: tok.convert_tokens_to_ids(c) for c, _ in spec.added.values()} == {
        c: i for i, (c, _) in spec.added.items()
    }
    if family == "dream":  # Dream ships vocab.json + merges.txt behind its own tokenizer class
        assert (tmp_path / family / "vocab.json").is_file() and not (tmp_path / family / "tokenizer.json").exists()
    assert (
        write_release_tokenizer(family, tmp_path / "big", vocab_size=spec.vocab_size + 64).vocab_size
        == spec.vocab_size + 64
    )
    with pytest.raises(ValueError, match="below"):
        write_release_tokenizer(family, tmp_path / "small", vocab_size=1000)

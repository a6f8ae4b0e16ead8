"""Tokenizer files shaped like the released LLaDA, Dream and SDAR / TraDo tokenizers.

    spec = write_release_tokenizer("llada", directory)      # tokenizer.json + tokenizer_config.json

The released tokenizers cannot be downloaded here, but what a run depends on can be rebuilt: every
special token sits at the id the released checkpoint uses, the files have the released layout (so
``load_tokenizer`` takes the same path through them), the chat template renders the same prompt,
and the vocabulary spans the same id range. The ordinary vocabulary is a byte-level BPE alphabet
(256 byte tokens, no merges: text encodes byte by byte) padded with unreachable filler entries up
to the first special id. The 8B stand-in benchmark writes these next to random weights at the real
shape; the chat-template tests write them to check the ids that prompts carry.

| family | files                          | special ids (from the released tokenizer configs)         | embedding rows |
|--------|--------------------------------|-----------------------------------------------------------|----------------|
| llada  | tokenizer.json                 | <|startoftext|> 126080 (BOS),                             | 126464 |
|        |                                | <|endoftext|> 126081 (EOS, pad), <|mdm_mask|> 126336,     |        |
|        |                                | <|start_header_id|> 126346, <|end_header_id|> 126347,     |        |
|        |                                | <|eot_id|> 126348                                         |        |
| dream  | vocab.json + merges.txt        | Qwen2.5's <|endoftext|> 151643 (EOS, pad), <|im_start|> 151644, | 152064 |
|        | (DreamTokenizer via auto_map)  | <|im_end|> 151645; <|beginoftext|> 151665, <|mask|> 151666   |        |
| sdar   | tokenizer.json (Qwen2Tokenizer)| the same Qwen ids; Qwen3's <think> 151667, </think> 151668; | 151936 |
|        |                                | <|MASK|> 151669                                              |        |

The templates are written here to render what the released ones render for system / user /
assistant turns (tool calls are not covered): LLaDA puts BOS before the first turn, trims each
message and always opens the assistant turn; Dream (Qwen2.5 style) adds the system message
"You are a helpful assistant." when the conversation has none; SDAR (Qwen3 style) adds none and
accepts ``enable_thinking=False`` (an empty think block). The LLaDA file also prepends BOS when a
caller asks for special tokens, as Llama-3-style tokenizers do: a prompt that is templated and
then encoded with ``add_special_tokens=True`` shows up with two BOS tokens.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from stabledrl.common.models.export import save_original_checkpoint
from stabledrl.common.models.presets import build_tiny_policy
from stabledrl.common.models.tokenizer_files import load_tokenizer

_LLADA_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if loop.first -%}{{ bos_token }}{%- endif -%}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + (m['content'] | trim) + '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
)
_DREAM_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' -%}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
_SDAR_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}"
    "{%- endif -%}"
)

_QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]  # 151643..151656
_QWEN_PLAIN = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>"]  # 151657..151664, not special


def _llada_added() -> dict[int, tuple[str, bool]]:
    names = ["<|startoftext|>", "<|endoftext|>", "[CLS]", "[gMASK]"] + [f"<|reserved_token_{k}|>" for k in range(256)]
    names[4 + 252] = "<|mdm_mask|>"  # 126336 takes the place of reserved token 252
    names += ["<role>", "</role>", "<|arithmetic_start|>", "<|arithmetic_end|>", "<|number_start|>", "<|number_end|>",
              "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    return {126080 + i: (name, True) for i, name in enumerate(names)}


def _qwen_added(extra: list[tuple[str, bool]]) -> dict[int, tuple[str, bool]]:
    entries = [(n, True) for n in _QWEN_SPECIAL] + [(n, False) for n in _QWEN_PLAIN] + extra
    return {151643 + i: entry for i, entry in enumerate(entries)}


@dataclass(frozen=True)
class ReleaseTokenizer:
    """What a family's released tokenizer looks like; ``write_release_tokenizer`` returns it with
    the ids a matching config.json should record."""

    family: str
    vocab_size: int  # embedding rows of the released checkpoint (>= every token id + 1)
    added: dict[int, tuple[str, bool]]  # id -> (content, special)
    roles: dict[str, str]  # bos_token / eos_token / pad_token / mask_token -> content
    chat_template: str
    layout: str  # "tokenizer.json" or "vocab+merges"
    tokenizer_class: str
    auto_map: Optional[dict[str, list[Optional[str]]]] = None
    bos_on_special: bool = False  # the tokenizer prepends BOS when asked for special tokens

    def id_of(self, content: str) -> int:
        return next(i for i, (c, _) in self.added.items() if c == content)

    @property
    def ids(self) -> dict[str, int]:
        """bos/eos/pad/mask token ids (what config.json's *_token_id keys hold)."""
        return {role.replace("_token", "_token_id"): self.id_of(content) for role, content in self.roles.items()}


RELEASES: dict[str, ReleaseTokenizer] = {
    "llada": ReleaseTokenizer(
        "llada", 126464, _llada_added(),
        {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
         "mask_token": "<|mdm_mask|>"},
        _LLADA_TEMPLATE, "tokenizer.json", "PreTrainedTokenizerFast", bos_on_special=True,
    ),
    "dream": ReleaseTokenizer(
        "dream", 152064, _qwen_added([("<|beginoftext|>", True), ("<|mask|>", True)]),
        {"bos_token": "<|beginoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
         "mask_token": "<|mask|>"},
        _DREAM_TEMPLATE, "vocab+merges", "DreamTokenizer",
        auto_map={"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
    ),
    "sdar": ReleaseTokenizer(
        "sdar", 151936,
        _qwen_added([("<tool_response>", False), ("</tool_response>", False), ("<think>", False),
                     ("</think>", False), ("<|MASK|>", True)]),
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "mask_token": "<|MASK|>"},
        _SDAR_TEMPLATE, "tokenizer.json", "Qwen2Tokenizer",
    ),
}


def write_release_tokenizer(
    family: str, directory: Union[str, Path], vocab_size: Optional[int] = None
) -> ReleaseTokenizer:
    """Write ``family``'s tokenizer files into ``directory`` (created) and return its spec;
    ``vocab_size`` overrides the embedding rows (it must cover every token id)."""
    if family not in RELEASES:
        raise ValueError(f"family {family!r}: tokenizer files exist for {sorted(RELEASES)}")
    spec = RELEASES[family]
    needed = max(spec.added) + 1
    if vocab_size is not None:
        if vocab_size < needed:
            raise ValueError(f"vocab_size {vocab_size} is below the {family} tokenizer's {needed} token ids")
        spec = ReleaseTokenizer(**{**spec.__dict__, "vocab_size": int(vocab_size)})
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = _byte_vocab(min(spec.added))
    if spec.layout == "tokenizer.json":
        (directory / "tokenizer.json").write_text(json.dumps(_tokenizer_json(spec, vocab)))
    else:
        (directory / "vocab.json").write_text(json.dumps(vocab))
        (directory / "merges.txt").write_text("#version: 0.2\n")
    config = {
        "tokenizer_class": spec.tokenizer_class,
        "added_tokens_decoder": {str(i): _entry(c, s) for i, (c, s) in sorted(spec.added.items())},
        "chat_template": spec.chat_template,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        **spec.roles,
    }
    if spec.auto_map:
        config["auto_map"] = spec.auto_map
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return spec


def _byte_vocab(size: int) -> dict[str, int]:
    """GPT-2's printable image of the 256 bytes (ids 0..255), then fillers up to ``size``."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    alphabet = [chr(b) if b in keep else chr(next(extra)) for b in range(256)]
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab.update({f"<|filler_{i}|>": i for i in range(256, size)})
    return vocab


def _entry(content: str, special: bool) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": special}


def _tokenizer_json(spec: ReleaseTokenizer, vocab: dict[str, int]) -> dict:
    post = None
    if spec.bos_on_special:
        bos = spec.roles["bos_token"]
        post = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos: {"id": bos, "ids": [spec.id_of(bos)], "tokens": [bos]}}}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, **_entry(c, s)} for i, (c, s) in sorted(spec.added.items())],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def write_tiny_release_checkpoint(family: str, directory: Union[str, Path], seed: int = 0, **shape: int) -> Path:
    """A randomly initialised tiny model of ``family`` at the released vocabulary, written in the
    family's released format next to these tokenizer files (chat template included): a stand-in for
    the released checkpoint where a test points ``model.path`` (``shape`` overrides the tiny width)."""
    directory = Path(directory)
    spec = write_release_tokenizer(family, directory)
    ids = spec.ids
    dims = {"hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1, **shape}
    policy = build_tiny_policy(family, vocab_size=spec.vocab_size, mask_token_id=ids["mask_token_id"],
                               eos_token_id=ids["eos_token_id"], pad_token_id=ids["pad_token_id"],
                               bos_token_id=ids.get("bos_token_id", ids["pad_token_id"]), seed=seed, **dims)
    save_original_checkpoint(policy, load_tokenizer(directory), directory)
    write_release_tokenizer(family, directory)  # the release's own file layout, over save_pretrained's
    return directory

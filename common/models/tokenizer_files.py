"""A checkpoint's tokenizer, loaded without running any code it ships.

Released dLLM directories differ: LLaDA ships a plain ``tokenizer.json``; Dream names its own
``DreamTokenizer`` (``auto_map`` -> tokenization_dream.py), a Qwen2 byte-level BPE over
``vocab.json`` + ``merges.txt`` whose special tokens (``<|mask|>``, ``<|im_start|>``, ...) are
declared in ``tokenizer_config.json``'s ``added_tokens_decoder``; SDAR / TraDo use Qwen's classes.
Transformers' own classes are used when the directory names one; otherwise the tokenizer is rebuilt
from the files, every declared added token is re-added at its declared id (a mismatch is an
error), and the chat template is carried over.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stabledrl.common.models.families import CheckpointError
from stabledrl.common.models.model_dir import read_json_file

SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token")


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer, PretrainedConfig

    path = Path(path)
    tok_cfg = _read_json(path / "tokenizer_config.json")
    # a config.json that maps to shipped code would make AutoTokenizer try (and refuse) that code first
    model_cfg = PretrainedConfig() if "auto_map" in _read_json(path / "config.json") else None
    if "auto_map" not in tok_cfg:
        try:
            return AutoTokenizer.from_pretrained(path, config=model_cfg, local_files_only=True, trust_remote_code=False)
        except (OSError, ValueError, TypeError, KeyError):
            pass
    tokenizer = _from_files(path, tok_cfg)
    _add_declared_tokens(tokenizer, tok_cfg)
    for key in SPECIAL_KEYS:  # roles after the declared tokens: a role token must not take an earlier id
        if tok_cfg.get(key):
            setattr(tokenizer, key, _text(tok_cfg[key]))
    template = tok_cfg.get("chat_template")
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text()
    if template:
        tokenizer.chat_template = template
    return tokenizer


def _from_files(path: Path, tok_cfg: dict[str, Any]) -> Any:
    from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

    if (path / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        vocab = json.loads((path / "vocab.json").read_text())
        lines = (path / "merges.txt").read_text().splitlines()
        merges = [tuple(line.split(" ")) for line in lines if line.strip() and not line.startswith("#version")]
        return Qwen2Tokenizer(vocab=vocab, merges=merges)
    raise CheckpointError(
        f"{path} has no tokenizer that loads without remote code (need tokenizer.json, or vocab.json + merges.txt)"
    )


def _add_declared_tokens(tokenizer: Any, tok_cfg: dict[str, Any]) -> None:
    """Add ``added_tokens_decoder`` entries missing from the vocabulary, in id order, and check ids."""
    from tokenizers import AddedToken

    declared = sorted(((int(i), e) for i, e in (tok_cfg.get("added_tokens_decoder") or {}).items()), key=lambda x: x[0])
    known = set(tokenizer.get_vocab())  # get_vocab() copies the whole vocabulary: once, not per token
    for token_id, entry in declared:
        content = entry["content"]
        if content not in known:
            known.add(content)
            options = {k: entry[k] for k in ("lstrip", "rstrip", "normalized", "single_word") if k in entry}
            special = bool(entry.get("special", False))
            tokenizer.add_tokens([AddedToken(content, special=special, **options)], special_tokens=special)
        got = tokenizer.convert_tokens_to_ids(content)
        if got != token_id:
            raise CheckpointError(
                f"tokenizer_config.json declares {content!r} as id {token_id}; the rebuilt tokenizer gives {got}"
            )


def _read_json(file: Path) -> dict[str, Any]:
    return read_json_file(file) if file.is_file() else {}


def _text(token: Any) -> str:
    return token["content"] if isinstance(token, dict) else str(token)

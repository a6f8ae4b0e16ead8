"""A task's prompt as the model reads it: through the tokenizer's chat template when it has one.

    ids = prompt_ids(tokenizer, task, row)      # list[int]; stabledrl.rollout.workflow.encode_prompt wraps it

Instruct checkpoints were tuned on conversations, so with ``task.chat_template: auto`` (the
default) and a tokenizer that carries a template, the row becomes messages (``Task.messages``: the
task's system prompt if it has one, then the user turn) and goes through
``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``. The text that comes back
already holds every marker the model expects (LLaDA's BOS and turn headers, Qwen's ``<|im_start|>``
turns, the opening of the assistant turn), so it is tokenized *without* adding special tokens: a
tokenizer's default would put a second BOS in front. ``chat_template: off``, or a tokenizer with
no template (the presets' character tokenizer), encodes ``task.render_prompt(row)`` as plain text,
exactly as before templates existed; ``on`` insists on a template.

Rollouts, the learner (which reads the prompt ids off the samples), the warm start's SFT pairs,
evaluation and ``max_prompt_tokens`` all count and encode through this one function.

Content that already holds one of the tokenizer's special tokens (a prompt templated upstream) is
refused when a template is applied: templating it again would nest one conversation in another.

This module does not import torch (the data loader and the reward sandbox import ``stabledrl.common.tasks``).
"""
from __future__ import annotations

import weakref
from typing import Any

from stabledrl.common.tasks.base import Row, Task


class PromptError(ValueError):
    """A prompt that cannot be encoded as configured (no template where one is required, or
    content that already carries chat markup)."""


_markers: "weakref.WeakKeyDictionary[Any, tuple[str, ...]]" = weakref.WeakKeyDictionary()


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def uses_chat_template(tokenizer: Any, task: Task) -> bool:
    """Whether ``task``'s prompts go through ``tokenizer``'s chat template (PromptError when the
    task requires a template the tokenizer lacks)."""
    if task.chat_template == "off":
        return False
    if has_chat_template(tokenizer):
        return True
    if task.chat_template == "on":
        raise PromptError(
            "task.chat_template is 'on' but the model's tokenizer has no chat template "
            "(set task.chat_template: auto or off to encode prompts as plain text)"
        )
    return False


def prompt_text(tokenizer: Any, task: Task, row: Row) -> str:
    """The full prompt string: the chat-templated conversation, or the rendered plain text; then
    ``task.response_prefix``, the start of the answer written for the model (empty by default)."""
    if not uses_chat_template(tokenizer, task):
        return task.render_prompt(row) + task.response_prefix
    messages = task.messages(row)
    _refuse_markup(tokenizer, messages, row)
    return apply_template(tokenizer, messages) + task.response_prefix


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot render a conversation (a property of the model
    directory, not of a row): refused, naming the template's file."""


def apply_template(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """``tokenizer.apply_chat_template``; a template that fails to render, or that transformers'
    sandboxed Jinja environment stops (``SecurityError``: it reached for Python internals), is a
    ChatTemplateError naming the model directory's template, never a traceback."""
    import jinja2

    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except jinja2.TemplateError as e:
        where = getattr(tokenizer, "name_or_path", "") or "the model directory"
        raise ChatTemplateError(
            f"the chat template of {where} (tokenizer_config.json 'chat_template' or chat_template.jinja) failed: "
            f"{type(e).__name__}: {e}; refused (a template only formats messages): fix or remove the template, or "
            "set task.chat_template: off") from None


def prompt_ids(tokenizer: Any, task: Task, row: Row) -> list[int]:
    """Token ids of ``prompt_text``; no special tokens are added (a template brings its own). With
    ``task.keep_last_tokens`` (``task.long_prompts: keep_last``) only the last that many, as d1 cuts."""
    ids = tokenizer.encode(prompt_text(tokenizer, task, row), add_special_tokens=False)
    if task.keep_last_tokens is not None:
        ids = ids[-task.keep_last_tokens:]
    return [int(i) for i in ids]


def _refuse_markup(tokenizer: Any, messages: list[dict[str, str]], row: Row) -> None:
    markers = _special_texts(tokenizer)
    for message in messages:
        found = next((m for m in markers if m in message["content"]), None)
        if found is not None:
            raise PromptError(
                f"prompt {row.prompt_id}: the {message['role']} message already contains the special token "
                f"{found!r}; for data that is already chat-templated set task.chat_template: off"
            )


def _special_texts(tokenizer: Any) -> tuple[str, ...]:
    """Text of every special token of ``tokenizer`` (declared specials and added special tokens)."""
    try:
        return _markers[tokenizer]
    except (KeyError, TypeError):
        pass
    texts = set(getattr(tokenizer, "all_special_tokens", None) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            texts.add(str(getattr(token, "content", token)))
    found = tuple(sorted(t for t in texts if t))
    try:
        _markers[tokenizer] = found
    except TypeError:  # not weak-referenceable: recompute next time
        pass
    return found

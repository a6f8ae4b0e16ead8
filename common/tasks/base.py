"""What a task is: rows, a prompt template, a reward, and a reference completion.

A ``Task`` is a small frozen record of functions, not a class hierarchy: each task module builds
one from its config section and registers the builder in ``TASKS``. The reward of a completion
``o`` for a row ``q`` is

    r(o, q) = w_c · correctness(o, q) + w_f · format(o, q)

with ``w_c`` / ``w_f`` from ``task.reward`` in the config. Built-in checkers and format scores lie
in [0, 1]; a user function (``reward.custom``) replacing the checker may return any real number.
TinyZero and d1 (arXiv 2504.12216) give 0.1 for a well-formed but wrong answer and 1.0 for a right
one; with ``w_f = 0.1`` a right
answer here scores 1.1 (it is necessarily well-formed), which keeps the same ranking and the
same right-minus-formatted gap of 1.0.

Contract for ``completion`` arguments: the decoded completion up to (not including) the first
EOS, special tokens removed. Reward functions never raise on any string (empty, huge, non-ASCII);
the sandbox (``stabledrl.common.sandbox.scorer``) still guards them.

This package does not import torch: the reward sandbox starts child processes that import it.
"""
from __future__ import annotations

import hashlib
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from stabledrl.common.registry import Registry
from stabledrl.common.tasks.anti_short import anti_short_boxed

PROMPT_SLOT = "{prompt}"
MAX_NUMBER_CHARS = 64  # longer digit runs are not numbers a task can mean (and int() caps at 4300)


@dataclass(frozen=True)
class Row:
    """One prompt of a task. ``prompt`` is the question text; the template wraps it.

    ``messages``: the prompt as chat messages when the data gives it so (``prompt`` is then the last
    user turn's text); ``record``: the whole source record (every column, nested fields included),
    for custom rewards; empty for generated rows."""

    prompt_id: str
    prompt: str
    answer: str  # the reference answer as text (for logging and the checkers)
    meta: Mapping[str, Any] = field(default_factory=dict)  # task data: numbers, target, puzzle, ...
    messages: tuple[Mapping[str, str], ...] = ()
    record: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardResult:
    total: float
    parts: dict[str, float]


class BadRow(ValueError):
    """A data record that cannot become a Row; ``reason`` is the counter it is skipped under."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


class Filtered(BadRow):
    """A valid record that a configured filter leaves out (a released recipe's data selection): skipped
    and counted under ``reason`` whatever ``on_bad_row`` says."""


class NonNumericReward(TypeError):
    """A reward function returned something that is not a real number."""


def as_reward_number(value: object, what: str) -> float:
    """``value`` as a float if it is a real number (bool and numpy scalars included), else raise."""
    if not isinstance(value, numbers.Real):
        raise NonNumericReward(f"{what} returned {type(value).__name__}, not a number")
    return float(value)


@dataclass(frozen=True)
class Task:
    """A task as the rollout worker and the warm-start stage see it.

    ``correctness`` and ``format_score`` map (completion, row) to [0, 1]; ``reference`` gives a
    right, well-formed completion; ``from_record`` turns a file record (canonical field names)
    into a Row or raises BadRow; ``generate`` makes the row for one seed (None: file data only).
    """

    name: str
    template: str
    correctness: Callable[[str, Row], float]
    format_score: Callable[[str, Row], float]
    reference: Callable[[Row], str]
    from_record: Callable[[Mapping[str, Any]], Row]
    required_fields: tuple[str, ...]
    generate: Optional[Callable[[int], Row]] = None
    system_prompt: Optional[str] = None
    correctness_weight: float = 1.0
    format_weight: float = 0.0
    anti_short_weight: float = 0.0  # the StableDRL release's anti-short term (common/tasks/anti_short.py)
    correctness_name: str = "correctness"  # "custom" when a user function replaced the checker
    chat_template: str = "auto"  # "auto" | "on" | "off": how stabledrl.common.tasks.prompts encodes prompts
    response_prefix: str = ""  # text the answer starts with, put after the prompt (d1's evaluation: "<reasoning>")
    judged_by: str = "correctness"  # what held-out evaluation reads: the checker's part, or the whole "reward"
    correct_at: float = 1.0  # a completion is correct when what it is judged by is at least this
    keep_last_tokens: Optional[int] = None  # task.long_prompts keep_last: a prompt keeps its last this many tokens

    def render_prompt(self, row: Row) -> str:
        """The prompt text a plain (non-chat) tokenizer encodes: [system + blank line +] template
        (a prompt given as messages: their contents, one blank line apart)."""
        if row.messages:
            return "\n\n".join(m["content"] for m in self.messages(row))
        body = self.template.replace(PROMPT_SLOT, row.prompt)
        return f"{self.system_prompt}\n\n{body}" if self.system_prompt else body

    def messages(self, row: Row) -> list[dict[str, str]]:
        """The same prompt as chat messages, for tokenizers with a chat template: [system +] the
        templated user turn, or the data's own messages (the system prompt added if they have none)."""
        given = [dict(m) for m in row.messages]
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        if given:
            return (system if given[0]["role"] != "system" else []) + given
        return system + [{"role": "user", "content": self.template.replace(PROMPT_SLOT, row.prompt)}]

    def reward(self, completion: str, row: Row) -> RewardResult:
        return self._total(self.correctness(completion, row), completion, row)

    def reward_batch(self, completions: Sequence[str], rows: Sequence[Row]) -> list[RewardResult | BaseException]:
        """The rewards of a batch of completions, each a RewardResult or the exception its call
        raised; batched user functions (``task.reward.custom``) are called once for the batch."""
        batch = getattr(self.correctness, "batch", None)
        if batch is not None and getattr(self.correctness, "batched", False):
            values = batch(completions, rows)
        else:
            values = [_attempt(self.correctness, c, r) for c, r in zip(completions, rows)]
        return [v if isinstance(v, BaseException) else _attempt(self._total, v, c, r)
                for v, c, r in zip(values, completions, rows)]

    def _total(self, value: Any, completion: str, row: Row) -> RewardResult:
        """The weighted reward from the checker's value (a user reward's RewardResult: its total,
        and each of several functions as a part of its own)."""
        parts: dict[str, float] = {}
        if isinstance(value, RewardResult):
            parts, value = dict(value.parts), value.total
        c = as_reward_number(value, self.correctness_name)
        parts[self.correctness_name] = c
        total = self.correctness_weight * c
        if self.format_weight:
            f = as_reward_number(self.format_score(completion, row), "format")
            parts["format"] = f
            total += self.format_weight * f
        if self.anti_short_weight:
            a = anti_short_boxed(completion)
            parts["anti_short"] = a
            total += self.anti_short_weight * a
        return RewardResult(total=total, parts=parts)

    def reference_completion(self, row: Row) -> str:
        return self.reference(row)


# name -> builder(task config section) -> Task
TASKS: Registry[Callable[[Any], Task]] = Registry("task")


def _attempt(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or the exception it raised (SystemExit included: reward code calling sys.exit)."""
    try:
        return fn(*args)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - one completion's failure, counted by the scorer
        return e


def stable_hash(*parts: object) -> int:
    """A 63-bit hash of ``parts``, the same in every process and Python run (``hash()`` is salted)."""
    digest = hashlib.blake2b(repr(parts).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def content_id(task_name: str, *content: object) -> str:
    """A prompt id derived from a row's content (so a row keeps its id whatever the file order)."""
    return f"{task_name}-{stable_hash(task_name, *content):016x}"


def last_answer_tag(text: str) -> Optional[str]:
    """Content of the last complete ``<answer>...</answer>`` (stripped), or None (d1, TinyZero).

    The last closing tag and the nearest opening tag before it, found with two linear scans (a
    non-greedy regex is quadratic on text with many unclosed tags). Where tags nest, as in
    ``<answer>a<answer>b</answer>``, this reads ``b``; d1's ``findall`` would read ``a<answer>b``.
    """
    close = text.rfind("</answer>")
    if close < 0:
        return None
    start = text.rfind("<answer>", 0, close)
    return None if start < 0 else text[start + len("<answer>") : close].strip()


def record_text(record: Mapping[str, Any], name: str) -> str:
    """A required text field of a file record; numbers are accepted and printed."""
    value = record.get(name)
    if value is None:
        raise BadRow(f"missing field {name!r}", "missing_field")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise BadRow(f"field {name!r} must be text, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise BadRow(f"field {name!r} is empty", "empty_field")
    return text


def record_id(record: Mapping[str, Any], task_name: str, *content: object) -> str:
    """The record's ``id`` if it has one, else an id derived from its content."""
    value = record.get("id")
    if value is None or str(value).strip() == "":
        return content_id(task_name, *content)
    return str(value).strip()


def configured_task(cfg: Any, name: str, default_template: str, required_fields: tuple[str, ...],
                    **functions: Any) -> Task:
    """The Task a builder returns: its own ``functions`` (correctness, format_score, reference,
    from_record and, for a generated task, generate) plus the fields every task takes from the
    shared part of its config (template, system prompt, chat template, reward weights)."""
    return Task(
        name=name,
        required_fields=required_fields,
        **functions,
        template=cfg.template if cfg.template is not None else default_template,
        system_prompt=cfg.system_prompt,
        chat_template=cfg.chat_template,
        keep_last_tokens=cfg.max_prompt_tokens if getattr(cfg, "long_prompts", "refuse") == "keep_last" else None,
        correctness_weight=cfg.reward.correctness_weight,
        format_weight=cfg.reward.format_weight,
        anti_short_weight=cfg.reward.anti_short_weight,
    )

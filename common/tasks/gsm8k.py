"""``gsm8k``: grade-school word problems whose answer is one number (Cobbe et al., arXiv 2110.14168).

The predicted number of a completion is, in this order of precedence:
1. the first number after the last ``####`` (GSM8K's own answer marker);
2. else the last number inside the last ``<answer>...</answer>`` (d1's format);
3. else the last number anywhere in the completion.
Numbers are ASCII digits with optional sign, thousands commas and decimals; ``$``, ``%`` and a
trailing period are ignored, and values compare exactly as decimals (``1,000.00`` = ``1000``).
correctness = 1 iff the predicted number equals the answer; format = 1 iff the answer is marked
(by ``####`` or an answer tag) and a number follows. ``grader: math-verify`` decides correctness as
the StableDRL release does instead: Math-Verify over the whole completion against the text after
the reference's last ``####`` (``stabledrl.common.tasks.whole_completion``).

File records: ``prompt`` (the question), ``answer`` (a number, or GSM8K's worked solution that ends
in ``#### <number>``: the text before the marker becomes the reference reasoning); optional ``id``.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping, Optional

from stabledrl.common.config.task import GSM8K_TEMPLATE
from stabledrl.common.tasks import whole_completion
from stabledrl.common.tasks.base import (
    MAX_NUMBER_CHARS,
    TASKS,
    BadRow,
    Row,
    Task,
    last_answer_tag,
    record_id,
    record_text,
    configured_task,
)

NAME = "gsm8k"
DEFAULT_TEMPLATE = GSM8K_TEMPLATE  # explicit in the config (task.template), so a dry run shows it
# a sign, an integer part with or without thousands commas, optional decimals
_NUMBER = re.compile(r"(?<![0-9.])-?\$?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?", re.ASCII)
_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\u2013": "-", "\uff0d": "-"})


def to_decimal(text: str) -> Optional[Decimal]:
    """The value of one number token (commas, ``$`` and ``+`` dropped), or None."""
    text = text.strip().translate(_MINUS_SIGNS).replace(",", "").replace("$", "").lstrip("+")
    if not text or len(text) > MAX_NUMBER_CHARS:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def numbers_in(text: str) -> list[str]:
    return _NUMBER.findall(text.translate(_MINUS_SIGNS))


def predicted_number(completion: str) -> Optional[Decimal]:
    if "####" in completion:
        found = numbers_in(completion.rsplit("####", 1)[1])
        return to_decimal(found[0]) if found else None
    tagged = last_answer_tag(completion)
    found = numbers_in(tagged if tagged is not None else completion)
    return to_decimal(found[-1]) if found else None


def correctness(completion: str, row: Row) -> float:
    predicted = predicted_number(completion)
    return float(predicted is not None and predicted == to_decimal(row.answer))


def format_score(completion: str, row: Row) -> float:
    if "####" in completion:
        return float(bool(numbers_in(completion.rsplit("####", 1)[1])))
    tagged = last_answer_tag(completion)
    return float(tagged is not None and bool(numbers_in(tagged)))


def reference(row: Row) -> str:
    reasoning = row.meta.get("solution")
    return f"{reasoning}\n#### {row.answer}" if reasoning else f"#### {row.answer}"


def from_record(record: Mapping[str, Any]) -> Row:
    prompt = record_text(record, "prompt")
    raw = record_text(record, "answer")
    reasoning, final = (raw.rsplit("####", 1) if "####" in raw else ("", raw))
    found = numbers_in(final)
    value = to_decimal(found[0]) if found else None
    if value is None:
        raise BadRow(f"answer {raw[-40:]!r} holds no number")
    answer = format(value.normalize(), "f")
    meta = {"solution": reasoning.strip() or None, whole_completion.REFERENCE_TEXT: final.strip()}
    return Row(prompt_id=record_id(record, NAME, prompt, answer), prompt=prompt, answer=answer, meta=meta)


@TASKS.register(NAME)
def build(cfg: Any) -> Task:
    checker = whole_completion.correctness if getattr(cfg, "grader", "number") == "math-verify" else correctness
    return configured_task(cfg, NAME, DEFAULT_TEMPLATE, ("prompt", "answer"), correctness=checker,
                           format_score=format_score, reference=reference, from_record=from_record)

"""``arithmetic``: short integer problems, the task the CPU quickstart trains on.

Prompt ``"23+41="``, answer ``"64"``, reference completion ``"64"`` (the worker appends EOS).
With the defaults (2 digits, + and -, 2 terms) prompts are at most 6 characters and answers at
most 3, all inside ``stabledrl.common.tokenizer.DEFAULT_ALPHABET``, so a ~1M-parameter character-level
diffusion model learns the task in minutes on a CPU.

correctness = 1 iff the stripped completion is exactly an integer (ASCII digits, optional '-')
equal to the answer; format = 1 iff it is an integer at all. Extra text scores 0 on both.
"""
from __future__ import annotations

import random
import re
from typing import Any, Mapping

from stabledrl.common.tasks.base import (
    MAX_NUMBER_CHARS,
    TASKS,
    BadRow,
    Row,
    Task,
    content_id,
    record_id,
    record_text,
    configured_task,
)
from stabledrl.common.tasks.expression import ExpressionError, evaluate

NAME = "arithmetic"
DEFAULT_TEMPLATE = "{prompt}"
_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)


def parse_integer(text: str) -> int | None:
    """The integer ``text`` spells (surrounding whitespace allowed), or None."""
    text = text.strip()
    if len(text) > MAX_NUMBER_CHARS or not _INTEGER.fullmatch(text):
        return None
    return int(text)


def correctness(completion: str, row: Row) -> float:
    value = parse_integer(completion)
    return float(value is not None and value == int(row.answer))


def format_score(completion: str, row: Row) -> float:
    return float(parse_integer(completion) is not None)


def reference(row: Row) -> str:
    return row.answer


def make_problem(
    rng: random.Random, digits: int, operators: list[str], terms: int, allow_negative: bool
) -> tuple[str, int]:
    """One problem text ``"a+b="`` and its integer value, by rejection sampling.

    Exact division is encouraged by making the operand left of each '/' a multiple of the one
    right of it; any problem that is still fractional (or negative when not allowed) is redrawn.
    """
    top = 10**digits - 1
    for _ in range(1000):
        ops = [rng.choice(operators) for _ in range(terms - 1)]
        operands = [rng.randint(0, top) for _ in range(terms)]
        for i in range(terms - 2, -1, -1):
            if ops[i] == "/":
                operands[i + 1] = operands[i + 1] or 1
                operands[i] = operands[i + 1] * rng.randint(0, top // operands[i + 1])
        text = "".join(f"{n}{op}" for n, op in zip(operands, ops)) + str(operands[-1])
        try:
            value, _ = evaluate(text)
        except ExpressionError:
            continue
        if value.denominator == 1 and (allow_negative or value >= 0):
            return text + "=", int(value)
    raise RuntimeError(f"no integer problem found for digits={digits}, operators={operators}, terms={terms}")


def from_record(record: Mapping[str, Any]) -> Row:
    prompt = record_text(record, "prompt")
    answer = record_text(record, "answer")
    if parse_integer(answer) is None:
        raise BadRow(f"answer {answer[:40]!r} is not an integer")
    return Row(prompt_id=record_id(record, NAME, prompt, answer), prompt=prompt, answer=answer)


@TASKS.register(NAME)
def build(cfg: Any) -> Task:
    def generate(seed: int) -> Row:
        prompt, value = make_problem(
            random.Random(seed), cfg.digits, list(cfg.operators), cfg.terms, cfg.allow_negative
        )
        return Row(prompt_id=content_id(NAME, prompt), prompt=prompt, answer=str(value))

    return configured_task(cfg, NAME, DEFAULT_TEMPLATE, ("prompt", "answer"), correctness=correctness,
                           format_score=format_score, reference=reference, from_record=from_record, generate=generate)

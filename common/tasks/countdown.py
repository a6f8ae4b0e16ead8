"""``countdown``: reach a target with the given numbers and + - * / (TinyZero; d1, arXiv 2504.12216).

The completion puts an expression in ``<answer>...</answer>`` (the last such tag counts).
correctness = 1 iff the expression parses (``stabledrl.common.tasks.expression``: no eval), uses the given
numbers by the configured rule, and its exact value equals the target. format = 1 iff the last
answer tag holds an expression that parses.

Number rule, as the released code checks it (both compare multisets of the integer literals):
- ``exactly_once``: TinyZero's ``validate_equation`` and d1's ``diffu-grpo/reward_func.py``
  require ``sorted(literals) == sorted(numbers)``: every number used, each once.
- ``at_most_once``: the StableDRL/SPG release (``dataloaders/logic_puzzles.py``) only requires the
  literals to be a sub-multiset of the numbers.
The reward here is ``correctness_weight`` x correctness + ``format_weight`` x format, which is not
the releases' scale: d1's ``compute_score`` (and TinyZero's) gives 1.0 for a right equation and 0.1
for any other answer tag, a malformed one included, where this task with ``format_weight`` 0.1 gives
1.1 and 0 (format needs an expression that parses). ``stabledrl.recipes.d1_rewards:countdown`` is
d1's scoring, for ``task.reward.custom``.

Generated puzzles combine all drawn numbers in a random order with operations whose every
intermediate result is a positive integer (the game's rule), so the reference solution is valid
under both number rules.

File records: ``numbers`` (list of ints, or a string "3,5,7"), ``target`` (int); optional
``id``, ``solution`` (an expression). Without a solution the reference completion is searched for.
"""
from __future__ import annotations

import random
from typing import Any, Mapping

from stabledrl.common.tasks.base import (
    TASKS, BadRow, Row, Task, content_id, last_answer_tag, record_id, configured_task,
)
from stabledrl.common.tasks.expression import ExpressionError, evaluate, solve_countdown, uses_numbers

NAME = "countdown"
DEFAULT_TEMPLATE = (
    "{prompt} Use + - * / and parentheses, each number {rule}, and put the equation in <answer> </answer>."
)


def question(numbers: list[int], target: int) -> str:
    return f"Using the numbers {numbers}, create an equation that equals {target}."


def make_puzzle(rng: random.Random, count: int, max_number: int, max_target: int) -> tuple[list[int], int, str]:
    """(numbers, target, solution): all numbers combined, every intermediate a positive integer."""
    for _ in range(10_000):
        numbers = [rng.randint(1, max_number) for _ in range(count)]
        items = [(n, str(n)) for n in numbers]
        while len(items) > 1:
            (a, sa), (b, sb) = items.pop(rng.randrange(len(items))), items.pop(rng.randrange(len(items)))
            a, sa, b, sb = (a, sa, b, sb) if a >= b else (b, sb, a, sa)
            choices = [(a + b, f"{sa}+{sb}"), (a * b, f"{_wrap(sa)}*{_wrap(sb)}")]
            if a > b:
                choices.append((a - b, f"{sa}-{_wrap(sb)}"))
            if b > 1 and a % b == 0:
                choices.append((a // b, f"{_wrap(sa)}/{_wrap(sb)}"))
            items.append(rng.choice(choices))
        target, solution = items[0]
        if 1 <= target <= max_target:
            return numbers, target, solution
    raise RuntimeError(f"no countdown puzzle found with max_number={max_number}, max_target={max_target}")


def _wrap(text: str) -> str:
    """Parenthesise a compound sub-expression (enough for + - * / precedence, never wrong)."""
    return text if text.isdigit() else f"({text})"


def _numbers_of(value: Any) -> list[int]:
    if isinstance(value, str):
        parts = [p for p in value.replace("[", "").replace("]", "").split(",") if p.strip()]
        value = [p.strip() for p in parts]
    if not isinstance(value, (list, tuple)) or not value:
        raise BadRow("field 'numbers' must be a non-empty list of integers")
    try:
        numbers = [int(v) for v in value]
    except (TypeError, ValueError):
        raise BadRow("field 'numbers' must be a non-empty list of integers") from None
    if any(n < 0 for n in numbers):
        raise BadRow("field 'numbers' must hold non-negative integers")
    return numbers


def from_record(record: Mapping[str, Any]) -> Row:
    if record.get("numbers") is None or record.get("target") is None:
        raise BadRow("missing field 'numbers' or 'target'", "missing_field")
    numbers = _numbers_of(record["numbers"])
    try:
        target = int(str(record["target"]).strip())
    except ValueError:
        raise BadRow(f"target {record['target']!r} is not an integer") from None
    solution = record.get("solution")
    meta = {"numbers": numbers, "target": target, "solution": str(solution) if solution else None}
    prompt = question(numbers, target)
    return Row(prompt_id=record_id(record, NAME, numbers, target), prompt=prompt, answer=str(target), meta=meta)


@TASKS.register(NAME)
def build(cfg: Any) -> Task:
    exactly_once = cfg.number_use == "exactly_once"

    def correctness(completion: str, row: Row) -> float:
        equation = last_answer_tag(completion)
        if equation is None:
            return 0.0
        try:
            value, used = evaluate(equation)
        except ExpressionError:
            return 0.0
        return float(uses_numbers(used, list(row.meta["numbers"]), exactly_once) and value == row.meta["target"])

    def format_score(completion: str, row: Row) -> float:
        equation = last_answer_tag(completion)
        if equation is None:
            return 0.0
        try:
            evaluate(equation)
        except ExpressionError:
            return 0.0
        return 1.0

    def reference(row: Row) -> str:
        solution = row.meta.get("solution") or solve_countdown(
            list(row.meta["numbers"]), row.meta["target"], exactly_once
        )
        if solution is None:
            raise ValueError(f"countdown row {row.prompt_id} has no known solution")
        return f"<answer>{solution}</answer>"

    def generate(seed: int) -> Row:
        rng = random.Random(seed)
        numbers, target, solution = make_puzzle(
            rng, rng.randint(cfg.min_numbers, cfg.max_numbers), cfg.max_number, cfg.max_target
        )
        meta = {"numbers": numbers, "target": target, "solution": solution}
        return Row(
            prompt_id=content_id(NAME, numbers, target), prompt=question(numbers, target), answer=str(target), meta=meta
        )

    template = DEFAULT_TEMPLATE.replace("{rule}", cfg.number_use.replace("_", " "))
    return configured_task(cfg, NAME, template, ("numbers", "target"), correctness=correctness,
                           format_score=format_score, reference=reference, from_record=from_record, generate=generate)

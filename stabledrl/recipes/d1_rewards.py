"""d1's GSM8K and Countdown training rewards (diffu-GRPO, arXiv 2504.12216), for ``task.reward.custom``.

    task: {name: gsm8k, reward: {custom: "stabledrl.recipes.d1_rewards:gsm8k", correctness_weight: 1.0,
                                 format_weight: 0.0}}

d1 sums five reward functions on every completion (up to 4.0 in all):

- correctness: 2.0 iff the answer text equals d1's reference string exactly;
- integer: 0.5 iff the answer text is all digits (``str.isdigit``: "-3", "1,080" and "5.0" are not);
- strict format: 0.5 iff the whole completion is ``<reasoning>\\n…\\n</reasoning>\\n<answer>\\n…\\n</answer>\\n``;
- soft format: 0.5 iff it starts with ``<reasoning>…</reasoning>``, optional whitespace, ``<answer>…</answer>``;
- XML count: 0.125 for each of ``<reasoning>\\n``, ``\\n</reasoning>\\n``, ``\\n<answer>\\n`` and
  ``\\n</answer>`` that occurs exactly once, less 0.001 per character after the closing answer tag.

The answer text is what follows the last ``<answer>`` up to the next ``</answer>`` (the rest of the
completion if none), stripped. d1's reference string is the raw text of the GSM8K answer between its
first ``####`` and the next one, stripped, taken from the source record (``row.record["answer"]``):
commas stay ("1,080"), so "1080" earns no correctness, exactly as in d1. 79 of GSM8K's 7,473 training
answers hold such commas; the project's own gsm8k checker compares numbers and would accept both.
A row with no source record (generated rows) falls back to ``row.answer``.

Two versions of the format terms exist in d1's repository, chosen by the function name:

- ``gsm8k`` (alias ``gsm8k_original``): d1's first diffu-GRPO code (commit 03f4e69): the two patterns
  match without ``re.DOTALL``, so each ``…`` must lie within one line (multi-line reasoning earns
  neither format reward);
- ``gsm8k_dotall``: d1's later reward_func.py (commit 4bab4b9), which adds ``re.DOTALL`` to both, so
  ``…`` may span lines.

``countdown``: d1's ``compute_score`` (reward_func.py): 1.0 for a right equation, 0.1 for an answer
tag whose equation uses other numbers, does not evaluate or misses the target, 0 without an answer
tag (the project's countdown task gives 1.1 and 0 there with ``format_weight`` 0.1). The equation
is evaluated exactly (``stabledrl.common.tasks.expression``), never ``eval``-ed as d1 does: a ``**``
power, a decimal point or a unary sign, which d1's eval accepts, is 0.1 here.

``tests/unit/common/test_rewards_release.py`` compares each with d1's functions run on the same completions.
"""
from __future__ import annotations

import re

from stabledrl.common.tasks.expression import ExpressionError, evaluate

_STRICT = r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$"
_SOFT = r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>"
FORMAT_PATTERNS = {
    "original": (re.compile(_STRICT), re.compile(_SOFT)),
    "dotall": (re.compile(_STRICT, re.DOTALL), re.compile(_SOFT, re.DOTALL)),
}


def answer_text(completion: str) -> str:
    return completion.split("<answer>")[-1].split("</answer>")[0].strip()


def reference_text(row) -> str:
    """d1's reference: the raw answer text after the first ``####`` (up to any next one), stripped."""
    raw = row.record.get("answer") if row.record else None
    if isinstance(raw, str) and "####" in raw:
        return raw.split("####")[1].strip()
    return row.answer


def xml_count(completion: str) -> float:
    score = 0.0
    if completion.count("<reasoning>\n") == 1:
        score += 0.125
    if completion.count("\n</reasoning>\n") == 1:
        score += 0.125
    if completion.count("\n<answer>\n") == 1:
        score += 0.125 - 0.001 * len(completion.split("\n</answer>\n")[-1])
    if completion.count("\n</answer>") == 1:
        score += 0.125 - 0.001 * (len(completion.split("\n</answer>")[-1]) - 1)
    return score


def d1_gsm8k_reward(completion: str, row, format_version: str = "original") -> float:
    """The sum of d1's five GSM8K reward terms with the given format-reward version (module docstring)."""
    strict, soft = FORMAT_PATTERNS[format_version]
    answer = answer_text(completion)
    return (2.0 * (answer == reference_text(row)) + 0.5 * answer.isdigit() + 0.5 * bool(strict.match(completion))
            + 0.5 * bool(soft.match(completion)) + xml_count(completion))


def gsm8k_original(completion: str, row) -> float:
    """d1's reward with its first format patterns (no re.DOTALL)."""
    return d1_gsm8k_reward(completion, row, "original")


def gsm8k_dotall(completion: str, row) -> float:
    """d1's reward with its later format patterns (re.DOTALL)."""
    return d1_gsm8k_reward(completion, row, "dotall")


gsm8k = gsm8k_original


def countdown(completion: str, row) -> float:
    """d1's Countdown reward (module docstring) for a row of the countdown task (``numbers``, ``target``)."""
    found = re.findall(r"<answer>(.*?)</answer>", completion, re.DOTALL)
    if not found:
        return 0.0
    equation = found[-1].strip()
    if sorted(int(n) for n in re.findall(r"\d+", equation)) != sorted(row.meta["numbers"]):
        return 0.1
    try:
        value, _ = evaluate(equation)
    except ExpressionError:
        return 0.1
    return 1.0 if abs(value - row.meta["target"]) < 1e-5 else 0.1

"""d1's GSM8K training reward (diffu-GRPO, arXiv 2504.12216), for ``task.reward.custom``.

    task: {name: gsm8k, reward: {custom: "recipes.d1_rewards:gsm8k", correctness_weight: 1.0, format_weight: 0.0}}

d1 sums five reward functions on every completion (up to 4.0 in all):

- correctness: 2.0 iff the answer text equals the reference answer as a string;
- integer: 0.5 iff the answer text is all digits;
- strict format: 0.5 iff the whole completion is ``<reasoning>\\n…\\n</reasoning>\\n<answer>\\n…\\n</answer>\\n``
  with each ``…`` on one line;
- soft format: 0.5 iff it starts with ``<reasoning>…</reasoning>``, then ``<answer>…</answer>``, each
  within a line;
- XML count: 0.125 for each of ``<reasoning>\\n``, ``\\n</reasoning>\\n``, ``\\n<answer>\\n`` and
  ``\\n</answer>`` that occurs exactly once, less 0.001 per character after the closing answer tag.

The answer text is what follows the last ``<answer>`` up to the next ``</answer>`` (the rest of the
completion if none), stripped. The reference is the number after GSM8K's ``####`` (``row.answer``).
"""
from __future__ import annotations

import re

_STRICT = re.compile(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$")
_SOFT = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>")


def answer_text(completion: str) -> str:
    return completion.split("<answer>")[-1].split("</answer>")[0].strip()


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


def gsm8k(completion: str, row) -> float:
    """The sum of d1's five GSM8K reward terms (module docstring)."""
    answer = answer_text(completion)
    return (2.0 * (answer == row.answer) + 0.5 * answer.isdigit() + 0.5 * bool(_STRICT.match(completion))
            + 0.5 * bool(_SOFT.match(completion)) + xml_count(completion))

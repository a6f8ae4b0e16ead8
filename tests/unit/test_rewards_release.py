"""Reward components that mirror a release's function, against values computed by running that
function (a scratch run outside the repository) on the same inputs."""
from __future__ import annotations

import pytest

from common.config.task import parse_task_config
from common.tasks import build_task
from common.tasks.anti_short import anti_short_boxed
from common.tasks.base import Row

SRC = {"kind": "file", "path": "unused.jsonl"}

# (completion, the StableDRL release's networks/llada_svpo.anti_short_boxed_reward on it)
ANTI_SHORT_CASES = [
    ("\\boxed{42}", 0.0),
    ("  $\\boxed{42}$. ", 0.0),
    ("The answer is \\boxed{42}", 0.0),
    ("We add 3 and 4 to get 7, so the answer is \\boxed{7}.", 0.0),
    ("x" * 150 + " \\boxed{1}", 1.0),
    ("step " * 45 + "\\boxed{12}", 1.0),
    ("a" * 199, 1.0),
    ("a" * 200 + "\\boxed{3}", 1.0),
    ("\\boxed{\\frac{1}{2}}", 0.0),
    ("\\boxed{\\frac{1}{2}} is it", 0.0),
    ("", 0.0),
    ("   ", 0.0),
    ("Answer: \\boxed{5}\n\\boxed{6}", 0.0),
    ("\\boxed{" + "9" * 190 + "}", 0.0),
    ("\\boxed{12}\u201d", 0.0),
    ("So \\boxed{7} and then some more words after it, enough words to pass the ratio maybe", 1.0),
    ("\\boxed{a\nb} c", 0.0),
    ("\\boxed{12} !?", 0.0),
    ("$" * 100 + "\\boxed{1}", 0.0),
    ("\\boxed{1}" + "." * 60, 0.0),
    ("\\boxed{1}" + "." * 60 + " x", 1.0),
]


@pytest.mark.parametrize("completion, expected", ANTI_SHORT_CASES)
def test_anti_short_boxed_is_the_releases(completion, expected):
    assert anti_short_boxed(completion) == expected


def test_anti_short_is_a_named_part_of_the_task_reward():
    row = Row(prompt_id="r", prompt="q", answer="7")
    reward = {"correctness_weight": 2.0, "format_weight": 0.0}
    plain = build_task(parse_task_config({"name": "gsm8k", "source": SRC, "reward": reward}))
    guarded = build_task(parse_task_config({"name": "gsm8k", "source": SRC,
                                            "reward": {**reward, "anti_short_weight": 1.0}}))
    short = "\\boxed{7}"
    assert plain.reward(short, row).parts == {"correctness": 1.0}
    result = guarded.reward(short, row)
    assert result.parts == {"correctness": 1.0, "anti_short": 0.0} and result.total == 2.0
    long = "Three and four make seven. " * 8 + "\\boxed{7}"
    result = guarded.reward(long, row)
    assert result.parts["anti_short"] == 1.0 and result.total == 3.0

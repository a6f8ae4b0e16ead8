"""Reward components that mirror a release's function, against values computed by running that
function (a scratch run outside the repository) on the same inputs."""
from __future__ import annotations

import pytest

from stabledrl.common.config.task import parse_task_config
from stabledrl.common.tasks import build_task
from stabledrl.common.tasks.anti_short import anti_short_boxed
from stabledrl.common.tasks.base import Row

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


# (completion, raw GSM8K answer text) and the sum of d1's five reward functions on it (correctness,
# int, strict format, soft format, XML count, with extract_hash_answer's reference), run from d1's
# diffu-grpo/reward_func.py: "original" at commit 03f4e69, "dotall" with commit 4bab4b9's format patterns
D1_CASES = [
    ("<reasoning>\nadd them\n</reasoning>\n<answer>\n5\n</answer>\n", "Two and three. #### 5"),
    ("<reasoning>\nfirst\nsecond\n</reasoning>\n<answer>\n5\n</answer>\n", "#### 5"),
    ("<reasoning>\nmulti\nline\n</reasoning>\n<answer>\n1,080\n</answer>\n", "Total is 1080.\n#### 1,080"),
    ("<reasoning>\nx\n</reasoning>\n<answer>\n1080\n</answer>\n", "Total.\n#### 1,080"),
    ("<reasoning>add</reasoning> <answer>5</answer>", "#### 5"),
    ("<reasoning>a\nb</reasoning>\n<answer>5</answer>", "#### 5"),
    ("<reasoning>\nadd\n</reasoning>\n<answer>\n6\n</answer>\ntrailing", "#### 5"),
    ("5", "#### 5"),
    ("<answer>five</answer>", "#### 5"),
    ("<answer>\n-3\n</answer>", "#### -3"),
    ("<answer>\n5.0\n</answer>", "#### 5"),
    ("<reasoning>\nr\n</reasoning>\n<answer>\n 12 \n</answer>\n\n", "#### 12"),
    ("text <reasoning>\nr\n</reasoning>\n<answer>\n12\n</answer>\n", "####  12 "),
]
D1_TOTALS = {
    "original": [3.5, 3.0, 2.5, 1.5, 3.0, 2.5, 0.984, 2.5, 0.0, 2.126, 0.126, 3.498, 3.0],
    "dotall": [4.0, 4.0, 3.5, 2.0, 3.0, 3.0, 1.484, 2.5, 0.0, 2.126, 0.126, 3.998, 3.0],
}


@pytest.mark.parametrize("version", ["original", "dotall"])
def test_d1_gsm8k_reward_is_d1s(version):
    from stabledrl.common.tasks.gsm8k import from_record
    from stabledrl.recipes import d1_rewards

    fn = {"original": d1_rewards.gsm8k, "dotall": d1_rewards.gsm8k_dotall}[version]
    for (completion, raw), want in zip(D1_CASES, D1_TOTALS[version]):
        record = {"prompt": "q", "answer": raw}
        row = from_record(record)
        row = Row(prompt_id=row.prompt_id, prompt="q", answer=row.answer, record=record)
        assert fn(completion, row) == pytest.approx(want, abs=1e-6), (completion, raw)
    # the project's own row.answer drops the comma; d1's reference keeps it
    assert from_record({"prompt": "q", "answer": "#### 1,080"}).answer == "1080"

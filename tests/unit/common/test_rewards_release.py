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


# (reference as the data holds it, completion, the StableDRL release's dataloaders/math.py reward_mixed on it:
# ±1, the release's check of Math-Verify over the whole completion); run in a scratch copy of the release
RELEASE_GSM8K = [
    ("Janet sells 16 - 3 - 4 = 9 eggs a day.\nShe makes 9 * 2 = $18.\n#### 18",
     "\\boxed{18} dollars, since 9 eggs cost 2 each", 1),
    ("#### 18", "The answer is 18.", 1),
    ("#### 18", "She makes 9 * 2 = 18 dollars. So 20", -1),
    ("#### 18", "<answer>18</answer> and then 5", -1),
    ("#### 1000", "\\boxed{1,000}", 1),
    ("#### 1000", "\\boxed{1000.00}", 1),
    ("#### 3", "$\\boxed{3}$ apples", 1),
    ("#### 3", "3", 1),
    ("#### 0.5", "\\boxed{\\frac{1}{2}}", 1),
    ("#### 70000", "The profit is \\$70,000. \\boxed{70000}", 1),
    ("#### 18", "\\boxed{18} \\boxed{20}", -1),
    ("#### 18", "x = 18", 1),
    ("#### -5", "\\boxed{-5}", 1),
    ("#### 18", "", -1),
    ("#### 5", "#### 5", 1),
    ("#### 42", "<reasoning>6*7</reasoning><answer>42</answer>", -1),
]
RELEASE_MATH = [  # the reference is MATH's worked solution, as the release reads its 'solution' column
    ("We get $x = \\frac{1}{2}$, so the answer is $\\boxed{\\frac{1}{2}}$.", "So $x=\\boxed{0.5}$", 1),
    ("The answer is $\\boxed{\\frac{1}{2}}$.", "\\boxed{\\dfrac{1}{2}}", 1),
    ("Thus $\\boxed{2\\sqrt{3}}$.", "The length is $\\boxed{\\sqrt{12}}$.", 1),
    ("Thus $\\boxed{(3, 4)}$.", "\\boxed{(3,4)}", 1),
    ("The sum is $\\boxed{10}$.", "\\boxed{10} and the product is \\boxed{21}", -1),
    ("Hence $\\boxed{x^2+2x+1}$.", "\\boxed{(x+1)^2}", 1),
    ("So the answer is $\\boxed{\\text{(C)}}$.", "\\boxed{C}", 1),
    ("The angle is $\\boxed{45^\\circ}$.", "\\boxed{45}", 1),
    ("So $\\boxed{5}$ dollars.", "The answer is 5.", 1),
    ("We find $\\boxed{12}$.", "\\boxed{12} Wait, that's wrong: \\boxed{13}", -1),
    ("Therefore $\\boxed{\\pi}$.", "\\boxed{3.14}", -1),
    ("The set is $\\boxed{\\{1,2\\}}$.", "\\boxed{\\{2, 1\\}}", 1),
    ("The answer is $\\boxed{-\\frac{3}{4}}$.", "\\boxed{-0.75}", 1),
    ("It is $\\boxed{\\frac{\\sqrt{2}}{2}}$.", "\\boxed{\\frac{1}{\\sqrt{2}}}", 1),
    ("So $\\boxed{6}$.", "\\boxed{6.0}", 1),
]


def _release_checker(name: str, grader: str):
    from stabledrl.common.tasks import gsm8k, hendrycks_math

    task = build_task(parse_task_config({"name": name, "source": SRC, "grader": grader,
                                         "reward": {"correctness_weight": 1.0, "format_weight": 0.0}}))
    read = {"gsm8k": gsm8k.from_record, "math": hendrycks_math.from_record}[name]
    return lambda reference, completion: task.reward(completion, read({"prompt": "q", "answer": reference})).total


@pytest.mark.parametrize("name, cases, default, differ", [("gsm8k", RELEASE_GSM8K, "number", 4),
                                                          ("math", RELEASE_MATH, "latex", 6)])
def test_math_verify_grader_decides_as_the_stabledrl_release(name, cases, default, differ):
    """grader: math-verify gives the release's decision on every case (the reported '\\boxed{18} dollars,
    since 9 eggs cost 2 each' among them); the project's own checker differs on some."""
    release = _release_checker(name, "math-verify")
    assert [release(ref, completion) for ref, completion, _ in cases] == [float(r > 0) for _, _, r in cases]
    own = _release_checker(name, default)
    assert sum(own(ref, completion) != float(r > 0) for ref, completion, r in cases) == differ


def test_math_verify_grader_needs_the_package(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_math_verify(name, *args, **kwargs):
        if name == "math_verify":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_math_verify)
    with pytest.raises(ValueError, match=r"task\.grader.*math-verify"):
        parse_task_config({"name": "math", "source": SRC, "grader": "math-verify"})


# MATH records (problem, level) and which the release's dataloaders/math._prepare_math_dataset keeps with
# math_max_level 4 (its default): level <= 4 (a level that is no integer reads as 5), fewer than 1500
# characters, at most 300 words
FILTER_RECORDS = [("What is 1+1?", "Level 1"), ("Hard one.", "Level 5"), ("Unknown level.", "Level ?"),
                  ("Level four.", "Level 4"), ("x" * 1499, "Level 2"), ("x" * 1500, "Level 2"),
                  (" ".join(["w"] * 300), "Level 3"), (" ".join(["w"] * 301), "Level 3"),
                  ("No level field text.", ""), ("Level 3 spelled.", "3")]
RELEASE_KEEPS = [0, 3, 4, 6, 9]


@pytest.mark.parametrize("on_bad_row", ["error", "skip"])
def test_math_training_filter_keeps_the_releases_rows(on_bad_row):
    from stabledrl.common.tasks.data import rows_from_records

    columns = {"prompt": "problem", "answer": "solution"}
    cfg = parse_task_config({"name": "math", "source": {**SRC, "columns": columns}, "max_level": 4,
                             "max_problem_chars": 1499, "max_problem_words": 300, "on_bad_row": on_bad_row})
    records = [{"problem": p, "solution": f"$\\boxed{{{i}}}$", "level": lv} for i, (p, lv) in
               enumerate(FILTER_RECORDS)]
    rows, report = rows_from_records(build_task(cfg), records, columns=columns, max_prompt_tokens=10**6,
                                     on_bad_row=on_bad_row)
    assert [int(r.answer) for r in rows] == RELEASE_KEEPS
    assert report.skipped == {"above_max_level": 3, "problem_too_long": 2}


# (completion, numbers, target) and d1's diffu-grpo/reward_func.compute_score on each (a scratch run)
D1_COUNTDOWN = [
    ("<answer>3+5*2</answer>", [3, 5, 2], 13, 1.0),
    ("<answer> (3+5)*2 </answer>", [3, 5, 2], 16, 1.0),
    ("<answer>3+5*2</answer>", [3, 5, 2], 14, 0.1),
    ("<answer>3+5</answer>", [3, 5, 2], 8, 0.1),
    ("<answer>3+5*2+2</answer>", [3, 5, 2], 15, 0.1),
    ("no tags at all 3+5*2", [3, 5, 2], 13, 0.0),
    ("<answer>3 plus 5 times 2</answer>", [3, 5, 2], 13, 0.1),
    ("<answer>(3+5)*2)</answer>", [3, 5, 2], 16, 0.1),
    ("<answer>9/(5-2)+3</answer>", [9, 5, 2, 3], 6, 1.0),
    ("<answer>1</answer><answer>3+5*2</answer>", [3, 5, 2], 13, 1.0),
    ("<answer>\n3+5*2\n</answer>", [3, 5, 2], 13, 1.0),
    ("<answer>3/(5-5)+2</answer>", [3, 5, 5, 2], 2, 0.1),
    ("<answer>100/7*7</answer>", [100, 7, 7], 100, 1.0),
    ("<answer></answer>", [3, 5, 2], 13, 0.1),
]


def test_d1_countdown_reward_is_d1s_and_the_task_reward_is_not():
    """d1's scale is 1.0 / 0.1 / 0; the countdown task with format_weight 0.1 gives 1.1 for a right
    equation and 0 for a malformed one (what its docstring now says)."""
    from stabledrl.recipes import d1_rewards

    task = build_task(parse_task_config({"name": "countdown", "reward": {"format_weight": 0.1}}))
    for completion, numbers, target, want in D1_COUNTDOWN:
        row = Row(prompt_id="c", prompt="q", answer=str(target), meta={"numbers": numbers, "target": target})
        assert d1_rewards.countdown(completion, row) == want, completion
    row = Row(prompt_id="c", prompt="q", answer="13", meta={"numbers": [3, 5, 2], "target": 13})
    assert task.reward("<answer>3+5*2</answer>", row).total == pytest.approx(1.1)
    assert task.reward("<answer>3 plus 5 times 2</answer>", row).total == 0.0

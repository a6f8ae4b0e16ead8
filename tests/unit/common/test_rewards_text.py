"""gsm8k (final number) and math (\\boxed{} + LaTeX equivalence) rewards, adversarial formats included."""
import pytest

from stabledrl.common.config.task import parse_task_config
from stabledrl.common.tasks import build_task
from stabledrl.common.tasks.gsm8k import from_record as gsm8k_row
from stabledrl.common.tasks.hendrycks_math import find_box, from_record as math_row
from stabledrl.common.tasks.latex import equivalent

SRC = {"kind": "file", "path": "unused.jsonl"}
GSM = build_task(parse_task_config({"name": "gsm8k", "source": SRC}))
MATH = build_task(parse_task_config({"name": "math", "source": SRC}))
MATH_FIRST = build_task(parse_task_config({"name": "math", "source": SRC, "box": "first"}))
HUGE = "9" * 5000


# ---------------------------------------------------------------- gsm8k
ROW72 = gsm8k_row({"prompt": "How many clips?", "answer": "48 in April, 24 in May.\n48+24=<<48+24=72>>72\n#### 72"})


def test_gsm8k_record_splits_reasoning_and_final_number():
    assert ROW72.answer == "72" and ROW72.meta["solution"].endswith(">>72")
    assert gsm8k_row({"prompt": "q", "answer": "$1,000.50"}).answer == "1000.5"
    assert GSM.reward(GSM.reference_completion(ROW72), ROW72).parts == {"correctness": 1.0, "format": 1.0}


@pytest.mark.parametrize("text,correct,formatted", [
    ("#### 72", 1, 1),
    ("She sold 48 + 24 = 72 clips.\n#### 72", 1, 1),
    ("#### 72 clips, not 5", 1, 1),  # first number after the marker
    ("#### 10\nwait\n#### 72", 1, 1),  # last marker
    ("<answer>72</answer>", 1, 1),
    ("<answer>The total is 72.</answer>", 1, 1),
    ("The answer is 72.", 1, 0),  # last number, unmarked
    ("The answer is $72.00", 1, 0),
    ("72.0", 1, 0),
    ("I think 72, no wait, 73", 0, 0),
    ("#### 73", 0, 1),
    ("#### seventy-two", 0, 0),
    ("#### 72 \n then 5", 1, 1),
    ("<answer>72", 1, 0),  # unclosed tag: last number of the text
])
def test_gsm8k_reward(text, correct, formatted):
    assert GSM.reward(text, ROW72).parts == {"correctness": correct, "format": formatted}


@pytest.mark.parametrize("answer,text", [
    ("1234", "#### 1,234"), ("-5", "#### -5"), ("-5", "#### \u22125"), ("0.5", "#### .5 is not it; #### 0.50"),
    ("1000000", "The total is 1,000,000 dollars"), ("25", "#### 25%"),
])
def test_gsm8k_number_normalisation(answer, text):
    row = gsm8k_row({"prompt": "q", "answer": answer})
    assert GSM.reward(text, row).parts["correctness"] == 1.0


@pytest.mark.parametrize("text", ["", "   ", HUGE, "#### " + HUGE, "#### ٧٢", "#### ７２", "####", "😀" * 100, "1e2"])
def test_gsm8k_adversarial_is_wrong_and_never_raises(text):
    assert GSM.reward(text, ROW72).parts["correctness"] == 0.0


# ---------------------------------------------------------------- math: boxes
@pytest.mark.parametrize("text,last,first", [
    (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}", r"\frac{1}{2}"),
    (r"\boxed{1} then \boxed{2}", "2", "1"),
    (r"\boxed{1} then \boxed{2", "1", "1"),  # an unbalanced box is ignored
    (r"\boxed{12", None, None),
    (r"\boxed 5$ done", "5", "5"),
    (r"\boxed{\{1,2\}}", r"\{1,2\}", r"\{1,2\}"),
    (r"\fbox{3}", "3", "3"),
    (r"\boxed{a_{b_{c}}}", "a_{b_{c}}", "a_{b_{c}}"),
    (r"\boxedx{3}", None, None),
    ("no box at all", None, None),
    ("", None, None),
])
def test_find_box(text, last, first):
    assert find_box(text, "last") == last
    assert find_box(text, "first") == first


# ---------------------------------------------------------------- math: equivalence
@pytest.mark.parametrize("a,b", [
    (r"\dfrac{1}{2}", r"\frac{1}{2}"), (r"\frac12", r"\frac{1}{2}"), ("0.5", r"\frac{1}{2}"), ("1/2", "0.5"),
    (".5", "0.50"), ("2.50", "2.5"), ("3.0", "3"), ("1,000", "1000"), (r"-\frac{3}{4}", r"\frac{-3}{4}"),
    (r"\left( 1, 2 \right)", "(1,2)"), (r"\left[\frac12, 3\right]", "[0.5,3]"),
    (r"5\text{ cm}", "5"), ("5 cm", "5"), (r"10\mbox{ inches}^2", "10"), (r"\text{Monday}", "Monday"),
    ("x = 3", "3"), (r"90^\circ", "90"), (r"90^{\circ}", "90"), (r"50\%", "50"), (r"\$5", "5"),
    (r"\sqrt2", r"\sqrt{2}"), (r"\frac{\sqrt{3}}{2}", r"\dfrac{\sqrt3}{2}"), ("3.", "3"), (r"\text{(B)}", "(B)"),
    (r"\tfrac{2}{4}", r"\frac{1}{2}"), ("\u22122", "-2"),
])
def test_equivalent_answers(a, b):
    assert equivalent(a, b) and equivalent(b, a)


@pytest.mark.parametrize("a,b", [
    (r"\frac{1}{3}", "0.333"), ("(1,2)", "[1,2]"), ("2", "3"), ("", "2"), ("x+1", "x+2"), ("(1,2)", "(1,2,3)"),
    (r"\frac{1}{0}", r"\frac{1}{0}x"), (HUGE, HUGE + "1"), ("1/0", "0"), ("12", "1,2"),
])
def test_inequivalent_answers(a, b):
    assert not equivalent(a, b)


def test_math_reward_and_box_choice():
    row = math_row({"prompt": "Compute 1/2.", "answer": r"\frac{1}{2}"})
    assert MATH.reward(r"Thus \boxed{\dfrac{1}{2}}.", row).parts == {"correctness": 1.0, "format": 1.0}
    assert MATH.reward(r"\boxed{3} or \boxed{0.5}", row).parts["correctness"] == 1.0
    assert MATH_FIRST.reward(r"\boxed{3} or \boxed{0.5}", row).parts["correctness"] == 0.0
    assert MATH.reward("the answer is 1/2", row).parts == {"correctness": 0.0, "format": 0.0}
    assert MATH.reward(r"\boxed{\frac{1}{2}", row).parts == {"correctness": 0.0, "format": 0.0}


def test_math_record_takes_the_last_box_of_a_solution():
    row = math_row({"prompt": "p", "answer": r"First \boxed{1}, finally $\boxed{\frac{3}{4}}$."})
    assert row.answer == r"\frac{3}{4}" and row.meta["solution"].startswith("First")
    assert MATH.reward(MATH.reference_completion(row), row).parts["correctness"] == 1.0
    plain = math_row({"prompt": "p", "answer": "7"})
    assert MATH.reference_completion(plain) == r"The final answer is \boxed{7}."
    assert MATH.reward(MATH.reference_completion(plain), plain).total == pytest.approx(1.1)


@pytest.mark.parametrize(
    "text", ["", HUGE, r"\boxed{" + HUGE + "}", r"\boxed{" * 500, "}" * 500, "\\", "😀" * 100, r"\boxed{}"]
)
def test_math_adversarial_is_wrong_and_never_raises(text):
    assert MATH.reward(text, math_row({"prompt": "p", "answer": "2"})).parts["correctness"] == 0.0


def test_adversarial_inputs_cost_linear_time():
    """Many unclosed tags / boxes / list items once took seconds (quadratic scans); now milliseconds."""
    import time

    row_g, row_m = ROW72, math_row({"prompt": "p", "answer": "(1,2)"})
    texts = ["<answer>" * 3000, r"\boxed{" * 3000, "1," * 10000, "(" + "1," * 10000 + ")", "{" * 20000]
    start = time.perf_counter()
    for text in texts:
        GSM.reward(text, row_g)
        MATH.reward(text, row_m)
        equivalent(text, text + "1")
    assert time.perf_counter() - start < 2.0

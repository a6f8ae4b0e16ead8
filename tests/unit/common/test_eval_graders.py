"""d1's graders (common/tasks/graders.py, common/tasks/latex.py::math_is_equiv) on hand-made
completions, one per reading rule where a grader could part from d1's ``parse_and_get_acc.py``.

The expected decisions are figures obtained by running d1's own parser functions (dllm-reasoning/d1,
``eval/parse_and_get_acc.py``) on exactly these texts; no code of d1 is used here."""
from __future__ import annotations

import builtins

import pytest

from stabledrl.common.tasks import graders
from stabledrl.common.tasks.base import Row
from stabledrl.common.tasks.graders import (
    NO_BOX,
    GraderUnavailable,
    as_d1_text,
    countdown_expression,
    d1_box,
    grade_countdown,
    grade_gsm8k,
    grade_math,
    grade_math_with,
    grade_sudoku,
    gsm8k_answer,
    gsm8k_decision,
    gsm8k_reference,
    sudoku_answer,
)
from stabledrl.common.tasks.latex import math_is_equiv

PUZZLE, SOLUTION = "3102200002100320", "3142243142131324"  # 8 empty cells
SUDOKU = Row("s", "Solve ...", SOLUTION, meta={"puzzle": PUZZLE, "solution": SOLUTION})
COUNTDOWN = Row("c", "Numbers: [49, 55, 53]\nTarget: 51", "51", meta={"numbers": [49, 55, 53], "target": 51})


def math_row(answer: str) -> Row:
    return Row("m", "What is ...?", answer)


# (completion, reference as d1 reads it, the value d1 reads, d1's decision)
GSM8K_CASES = [
    ("so \\boxed{18}.", 18.0, 18.0, 1),
    ("\\boxed{-18}", 18.0, -18.0, 0),  # a sign in the answer is kept
    ("\\boxed{-10}", None, -10.0, 0),  # a negative reference reads as nothing: never right
    ("\\boxed{1,000}", 1000.0, 1.0, 0),  # the first digit group of a comma-grouped number
    ("\\boxed{1,000}", 1.0, 1.0, 1),
    ("<answer>1,080</answer>", 80.0, 80.0, 1),  # in a tag: the last number
    ("<answer>1,080</answer>", 1080.0, 80.0, 0),
    ("\\boxed{1e3}", 1000.0, 1000.0, 1),  # the whole content as a Python float
    ("\\boxed{1_000}", 1000.0, 1000.0, 1),
    ("\\boxed{...} \\boxed{ } \\boxed{18 apples}", 18.0, 18.0, 1),  # placeholders and blanks skipped
    ("\\boxed{x} \\boxed{$18.00}", 18.0, 18.0, 1),  # a box without a number is passed over
    ("\\boxed{17} and \\boxed{18}", 18.0, 17.0, 0),  # the first box with a number, not the last
    ("\\boxed{\\frac{1}{2}}", 0.5, 1.0, 0),  # the box ends at its first }
    ("\\boxed{\n18}", 18.0, None, 0),  # a box across a line break is not read
    ("<answer>\nIt is 3 + 15 = 18\n</answer>", 18.0, 18.0, 1),
    ("<answer>18</answer><answer>7</answer>", 18.0, 18.0, 1),  # the first tag
    ("The answer is 18.", 18.0, None, 0),  # no box, no tag: nothing
    ("<answer></answer>", 18.0, None, 0),
    ("<answer>18.</answer>", 18.0, 18.0, 1),
    ("\\boxed{$18$}", 18.0, 18.0, 1),
    ("<answer>-5</answer>", 5.0, -5.0, 0),
]


@pytest.mark.parametrize("text,reference,value,right", GSM8K_CASES)
def test_gsm8k_decides_as_d1(text, reference, value, right):
    assert gsm8k_answer(text) == value
    assert gsm8k_decision(text, reference).correct == right


def test_gsm8k_reference_as_d1_reads_it():
    assert gsm8k_reference("... so 1,080 in all.\n#### 1,080") == 1080.0
    assert gsm8k_reference("#### $18") == 18.0
    assert gsm8k_reference("#### -10") is None  # the two negative GSM8K test answers
    row = Row("g", "q", "-10")
    assert grade_gsm8k("\\boxed{-10}", row).correct == 0.0  # d1 never scores them
    assert grade_gsm8k("\\boxed{1080}", Row("g", "q", "1080")).correct == 1.0


# (completion, reference, d1's decision)
MATH_CASES = [
    ("\\boxed{\\frac{1}{8}}", "\\frac{1}{8}", 1),
    ("\\boxed{\\frac{3}{24}}", "\\frac{1}{8}", 0),  # fractions are not reduced
    ("\\boxed{12 cm}", "12", 0),  # a unit written plainly stays
    ("\\boxed{12\\text{ cm}}", "12", 1),  # ... one after "\text{ " is cut
    ("\\boxed{east}", "\\text{east}", 0),  # \text{} is not stripped
    ("\\boxed{\\text{east}}", "\\text{east}", 1),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1),  # exactly 0.5 becomes \frac{1}{2}
    ("\\boxed{0.50}", "\\frac{1}{2}", 0),  # ... no other decimal
    ("\\boxed{1/2}", "\\frac{1}{2}", 1),
    ("\\boxed{x/2}", "\\frac{x}{2}", 0),  # a / between non-integers: the raw strings compared
    ("\\boxed{x/2}", "x/2", 1),
    ("\\boxed{1,000}", "1000", 0),  # commas stay
    ("\\boxed{\\dfrac12}", "\\frac{1}{2}", 1),
    ("\\boxed{x = 5}", "5", 1),  # a left side of at most two characters (spaces counted) is dropped
    ("\\boxed{xy = 5}", "5", 0),
    ("\\boxed{xyz = 5}", "5", 0),
    ("\\boxed{90^\\circ}", "90", 1),
    ("\\boxed{50\\%}", "50", 1),
    ("\\boxed{\\$5}", "5", 1),
    ("\\boxed{.5}", "0.5", 1),
    ("\\boxed{\\sqrt3}", "\\sqrt{3}", 1),
    ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1),
    ("first \\boxed{4} then \\boxed{3}", "4", 0),  # the last box
    ("\\boxed{3} then \\boxed{4", "4", 0),  # the last box never closes, no tag: nothing
    ("<answer>4</answer> \\boxed{4", "4", 1),  # ... with a tag: its content
    ("<answer>5</answer>", "5", 0),  # no box: the whole text is compared
    ("5", "5", 1),
    ("\\boxed 5$ and", "5", 1),  # the braceless box, up to $
    ("\\fbox{5}", "5", 0),  # an \fbox is read with its wrapper
    ("\\boxed{}", "5", 0),
    ("\\boxed{} <answer>5</answer>", "5", 1),  # an empty box: the tag
    ("\\boxed{5\\text{ m}\\text{ s}}", "5", 0),  # two "\text{ ": the raw strings compared
    ("\\boxed{2\\sqrt}", "2\\sqrt", 1),  # a trailing \sqrt: the raw strings compared
    ("\\boxed{\\frac12}<|eot_id|><|endoftext|>", "\\frac{1}{2}", 1),
    ("\\boxed{10^{10}}", "10^{10}", 1),
    ("\\boxed{5.}", "5", 0),
]


@pytest.mark.parametrize("text,reference,right", MATH_CASES)
def test_math_decides_as_d1(text, reference, right):
    assert grade_math(text, math_row(reference)).correct == right


def test_math_is_equiv_is_mathss_string_normalisation():
    assert math_is_equiv("\\tfrac{1}{2}", "\\frac12")
    assert not math_is_equiv("\\frac{2}{4}", "\\frac{1}{2}")
    assert math_is_equiv(None, None) and not math_is_equiv("1", None)


def test_d1_box():
    assert d1_box("\\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert d1_box("\\boxed{1} then \\boxed{\\frac{1}{2}") is None  # the last box never closes
    assert d1_box("no box here") is NO_BOX
    assert d1_box("\\boxed 5+3$ and more") == "5+3"
    assert d1_box("\\fbox{7}") == "\\fbox{7}"


def test_other_math_graders_are_named_choices():
    latex = grade_math_with("latex")
    assert latex("\\boxed{\\frac{3}{24}}", math_row("\\frac{1}{8}")).correct == 1.0  # where d1 says 0
    assert latex("\\boxed{east}", math_row("\\text{east}")).correct == 1.0
    assert grade_math_with("d1")("\\boxed{\\frac{3}{24}}", math_row("\\frac{1}{8}")).correct == 0.0
    with pytest.raises(ValueError, match="unknown MATH grader"):
        grade_math_with("sympy")


def test_math_verify_grader_is_symbolic():
    pytest.importorskip("math_verify")
    mv = grade_math_with("math-verify")
    assert mv("\\boxed{\\sqrt{8}}", math_row("2\\sqrt{2}")).correct == 1.0
    assert mv("\\boxed{3}", math_row("4")).correct == 0.0
    assert graders.grader_versions(["math-verify"])["math-verify"] != "not installed"


def test_a_missing_math_verify_is_an_error_naming_the_package(monkeypatch):
    real_import = builtins.__import__

    def no_math_verify(name, *args, **kwargs):
        if name == "math_verify":
            raise ImportError("not installed")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr("builtins.__import__", no_math_verify)
    with pytest.raises(GraderUnavailable, match="pip install 'math-verify"):
        grade_math_with("math-verify")


COUNTDOWN_CASES = [  # numbers [49, 55, 53], target 51; d1's decision
    ("<answer>\\boxed{55 - 53 + 49}</answer>", 1),
    ("\\boxed{(55 - 53) \\times 49 / 49 + 49}", 0),  # 49 used twice
    ("\\boxed{55 - 4}", 0),
    ("\\boxed{49 + 55 - 53 = 51}", 1),  # "= target" dropped
    ("I think 49 + 55 - 53 = 51 works", 1),  # no box: an equation anywhere
    ("<answer>49+55-53</answer> \\boxed{49+", 1),  # an unclosed box: the answer tag
    ("\\boxed{-53 + 55 + 49}", 1),  # a unary sign is accepted
    ("\\boxed{49 + 55 - 53.0}", 0),  # 53.0 holds the integers 53 and 0
    ("\\boxed{(49 + 55) - 53}<|eot_id|>", 1),
    ("\\boxed{49 55 53}", 0),
    ("\\boxed{(49)(55)-53}", 0),  # not arithmetic: no value
    ("\\boxed{49 + 55 // 1 - 53}", 0),
    ("no box 49 + 55 - 53", 0),  # no box, no "=": the whole text, which is not arithmetic
    ("\\fbox{49 + 55 - 53}", 0),  # \fbox kept whole
    ("\\boxed{49 ** 55 - 53}", 0),
    ("\\boxed{(55 - 53) ** 49}", 0),
]


@pytest.mark.parametrize("text,right", COUNTDOWN_CASES)
def test_countdown_decides_as_d1(text, right):
    assert grade_countdown(text, COUNTDOWN).correct == right


def test_countdown_values_are_pythons():
    assert grade_countdown("\\boxed{(1 + 2) ** 3}", Row("c", "", "27", meta={"numbers": [1, 2, 3], "target": 27})
                           ).correct == 1.0
    assert grade_countdown("\\boxed{9 ** 9 ** 9}", Row("c", "", "1", meta={"numbers": [9, 9, 9], "target": 1})
                           ).correct == 0.0  # a huge power is refused quickly, as it could never match
    assert countdown_expression("\\boxed{2 \\times 3 \\cdot 4 \\div 6}") == "2 * 3 * 4 / 6"


SUDOKU_CASES = [  # (completion, the grid d1 reads, right cells of 8)
    (f"<reasoning>r</reasoning>\n<answer>\n{SOLUTION}\n</answer>", SOLUTION, 8),
    ("<answer>\n```\n3142 2431\n4213 1324\n```\n</answer>", SOLUTION, 8),
    ("<answer>\n314224314213<|eot_id|>", "3142243142130000", 6),  # a tag closed by the turn end
    ("<answer>\n314224314213", "", 0),  # a tag that never closes and no turn end: nothing
    (f"<answer></answer>\n{SOLUTION}", SOLUTION, 8),
    (f"the grid {SOLUTION} is solved", SOLUTION, 8),
    (f"<answer>{SOLUTION}99</answer>", SOLUTION, 8),
    ("no grid", "", 0),
    (f"<answer>{SOLUTION}</answer><|eot_id|><|endoftext|>", SOLUTION, 8),
    ("<answer>1111111111111111</answer>", "1111111111111111", 2),
    (f"</answer> {SOLUTION}<|eot_id|>", SOLUTION, 8),
]


@pytest.mark.parametrize("text,grid,right", SUDOKU_CASES)
def test_sudoku_decides_as_d1(text, grid, right):
    assert sudoku_answer(text) == grid
    grade = grade_sudoku(text, SUDOKU)
    assert (grade.correct, grade.total) == (right, 8.0)


def test_a_cleaned_completion_reads_as_a_turn_that_ended():
    assert grade_sudoku(as_d1_text("<answer>\n314224314213"), SUDOKU).correct == 6.0
    assert grade_math(as_d1_text("5"), math_row("5")).correct == 0.0  # d1 never sees a bare "5"

"""d1's graders (common/tasks/graders.py): what each reads as the answer, and when it is right.

The completions are written here to hit each reading rule; the rules themselves are d1's evaluation
parsers (GSM8K, MATH500, Countdown, Sudoku), with MATH compared symbolically where math-verify is
installed and by string normalisation where it is not."""
from __future__ import annotations

import builtins
import logging

import pytest

from common.tasks import graders
from common.tasks.base import Row
from common.tasks.graders import (
    NO_BOX,
    countdown_expression,
    d1_box,
    grade_countdown,
    grade_gsm8k,
    grade_math,
    grade_sudoku,
    gsm8k_answer,
    math_equal,
    math_grader,
    sudoku_answer,
)

GSM = Row("g", "Tom has 3 apples...", "18")
PUZZLE, SOLUTION = "3102200002100320", "3142243142131324"  # 8 empty cells
SUDOKU = Row("s", "Solve ...", SOLUTION, meta={"puzzle": PUZZLE, "solution": SOLUTION})
COUNTDOWN = Row("c", "Numbers: [49, 55, 53]\nTarget: 51", "51", meta={"numbers": [49, 55, 53], "target": 51})


def math_row(answer: str) -> Row:
    return Row("m", "What is ...?", answer)


@pytest.mark.parametrize("text,value", [
    ("so \\boxed{18}.", 18.0),
    ("<answer>\\boxed{...}</answer> then \\boxed{ } and \\boxed{18 apples}", 18.0),  # placeholders and blanks skipped
    ("\\boxed{x} \\boxed{$18.00}", 18.0),  # a box without a number is passed over; the first number of the next
    ("\\boxed{17} ... \\boxed{18}", 17.0),  # the first box that holds a number wins
    ("<answer>\nIt is 3 + 15 = 18\n</answer>", 18.0),  # in a tag: the last number
    ("<answer>18</answer><answer>7</answer>", 18.0),  # the first tag
    ("\\boxed{1,000}", 1.0),  # d1 reads the first digit group of a comma-grouped number
    ("The answer is 18.", None),  # no box, no tag: nothing read
    ("<answer></answer>", None),
])
def test_gsm8k_reads_the_first_numeric_box_else_the_answer_tag(text, value):
    assert gsm8k_answer(text) == value
    assert grade_gsm8k(text, GSM).correct == float(value == 18.0)
    assert grade_gsm8k(text, GSM).total == 1.0


def test_d1_box_is_the_last_box_with_matched_braces():
    assert d1_box("\\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert d1_box("\\boxed{1} then \\boxed{\\frac{1}{2}") is None  # the last box never closes
    assert d1_box("no box here") is NO_BOX
    assert d1_box("\\boxed 5+3$ and more") == "5+3"  # d1's braceless form, up to $
    assert d1_box("\\fbox{7}") == "7"


@pytest.mark.parametrize("answer,predicted", [
    ("\\frac{1}{2}", "0.5"), ("2\\sqrt{2}", "\\sqrt{8}"), ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("(1,2)", "(1, 2)"), ("10", "10\\%"),
])
def test_math_accepts_symbolically_equal_answers(answer, predicted):
    pytest.importorskip("math_verify")
    assert math_grader() == "math-verify"
    assert grade_math(f"<reasoning>...</reasoning><answer>\\boxed{{{predicted}}}</answer>", math_row(answer)).correct == 1.0


def test_math_refuses_different_answers_and_reads_d1s_box():
    assert grade_math("\\boxed{3}", math_row("4")).correct == 0.0
    assert grade_math("first \\boxed{4} then \\boxed{3}", math_row("4")).correct == 0.0  # the last box counts
    unclosed = grade_math("<answer>\\frac{1}{2}</answer> and \\boxed{\\frac{1}{2}", math_row("\\frac12"))
    assert unclosed.correct == 1.0 and unclosed.answer == "\\frac{1}{2}"  # an unclosed box: the answer tag
    assert grade_math("<answer>5</answer>", math_row("5")).correct == 0.0  # no box: d1 compares the whole text
    assert grade_math(" 5 ", math_row("5")).correct == 1.0  # ... which only a bare answer passes


def test_without_math_verify_math_is_graded_by_normalisation_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(graders, "_math_verify", None)
    monkeypatch.setattr(graders, "_math_verify_checked", False)
    real_import = builtins.__import__

    def no_math_verify(name, *args, **kwargs):
        if name == "math_verify":
            raise ImportError("not installed")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr("builtins.__import__", no_math_verify)
    with caplog.at_level(logging.WARNING):
        assert math_grader() == "normalised strings"
    assert "math-verify is not installed" in caplog.text
    assert math_equal("0.5", "\\frac{1}{2}")  # numbers still compare exactly
    assert not math_equal("\\sqrt{8}", "2\\sqrt{2}")  # symbolic identities need math-verify


@pytest.mark.parametrize("text,right", [
    ("<answer>\\boxed{55 - 53 + 49}</answer>", True),
    ("\\boxed{(55 - 53) \\times 49 / 49 + 49}", False),  # 49 used twice
    ("\\boxed{55 - 4}", False),  # numbers not the given ones
    ("\\boxed{49 + 55 - 53 = 51}", True),  # "= target" dropped
    ("\\boxed{49 + 55 \\div 55}", False),  # 55 twice, 53 missing
    ("I think 49 + 55 - 53 = 51 works", True),  # no box: d1 reads an equation anywhere in the text
    ("<answer>49+55-53</answer> \\boxed{49+", True),  # an unclosed box: the answer tag
    ("\\boxed{-49 + 55 + 53 - 8}", False),
])
def test_countdown_needs_each_number_once_and_the_exact_target(text, right):
    assert grade_countdown(text, COUNTDOWN).correct == float(right)


def test_countdown_expression_reading():
    assert countdown_expression("\\boxed{2 \\times 3 \\cdot 4 \\div 6}") == "2 * 3 * 4 / 6"
    assert countdown_expression("\\boxed{49+55-53 = 51}") == "49+55-53"


@pytest.mark.parametrize("text,grid", [
    (f"<reasoning>r</reasoning>\n<answer>\n{SOLUTION}\n</answer>", SOLUTION),
    ("<answer>\n```\n3142 2431\n4213 1324\n```\n</answer>", SOLUTION),  # a fenced block, spaces dropped
    (f"<answer>\n{SOLUTION[:12]}", SOLUTION[:12] + "0000"),  # a tag that never closes: to the end, padded
    (f"<answer></answer>\n{SOLUTION}", SOLUTION),  # an empty tag: what follows it
    (f"the grid {SOLUTION} is solved", SOLUTION),  # any 16-digit run
    (f"<answer>{SOLUTION}99</answer>", SOLUTION),  # cut to 16
    ("no grid", ""),
])
def test_sudoku_readings(text, grid):
    assert sudoku_answer(text) == grid


def test_sudoku_counts_the_right_empty_cells():
    assert grade_sudoku(f"<answer>{SOLUTION}</answer>", SUDOKU) == graders.Grade(8.0, 8.0, SOLUTION)
    wrong_two = SOLUTION[:2] + "1" + SOLUTION[3:5] + "2" + SOLUTION[6:]  # cells 2 and 5 are empty in the puzzle
    assert grade_sudoku(f"<answer>{wrong_two}</answer>", SUDOKU).correct == 6.0
    wrong_clue = "4" + SOLUTION[1:]  # cell 0 is a clue: not counted
    assert grade_sudoku(f"<answer>{wrong_clue}</answer>", SUDOKU).correct == 8.0
    assert grade_sudoku("nothing", SUDOKU) == graders.Grade(0.0, 8.0, None)

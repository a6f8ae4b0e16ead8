"""Rewards of arithmetic, countdown and sudoku4 on right, wrong, malformed and adversarial output."""
import pytest

from stabledrl.common.config.task import parse_task_config
from stabledrl.common.tasks import Row, build_task
from stabledrl.common.tasks.countdown import from_record as countdown_row
from stabledrl.common.tasks.expression import ExpressionError, evaluate
from stabledrl.common.tasks.sudoku import all_grids, from_record as sudoku_row, solutions

HUGE = "9" * 5000
ADVERSARIAL = ["", " ", "\n\n", HUGE, "٦٤", "６４", "\x00", "<answer>", "</answer><answer>", "{" * 300, "😀" * 50]


def task(name, **kw):
    return build_task(parse_task_config({"name": name, **kw}))


# ---------------------------------------------------------------- arithmetic
ARITH = Row("a", "23+41=", "64")


@pytest.mark.parametrize("text,correct,formatted", [
    ("64", 1, 1), (" 64\n", 1, 1), ("064", 1, 1),
    ("65", 0, 1), ("-64", 0, 1),
    ("64abc", 0, 0), ("64=64", 0, 0), ("6 4", 0, 0), ("sixty-four", 0, 0), ("+64", 0, 0),
])
def test_arithmetic_reward(text, correct, formatted):
    r = task("arithmetic").reward(text, ARITH)
    assert r.parts == {"correctness": correct, "format": formatted}
    assert r.total == pytest.approx(correct + 0.1 * formatted)


@pytest.mark.parametrize("text", ADVERSARIAL)
def test_arithmetic_adversarial_scores_zero(text):
    assert task("arithmetic").reward(text, ARITH).total == 0.0


def test_reward_weights_combine_linearly():
    t = task("arithmetic", reward={"correctness_weight": 2.0, "format_weight": 0.5})
    assert t.reward("64", ARITH).total == 2.5 and t.reward("65", ARITH).total == 0.5
    t0 = task("arithmetic", reward={"format_weight": 0.0})
    assert t0.reward("65", ARITH).parts == {"correctness": 0.0}


def test_arithmetic_negative_answers():
    row = Row("n", "3-9=", "-6")
    assert task("arithmetic", allow_negative=True).reward("-6", row).parts["correctness"] == 1.0


# ---------------------------------------------------------------- countdown
CD = countdown_row({"numbers": [2, 3, 5, 7], "target": 22})


@pytest.mark.parametrize("text,exactly,at_most,formatted", [
    ("<answer>(7-3)*5+2</answer>", 1, 1, 1),
    ("<reasoning>20 and 2</reasoning>\n<answer> ( 7 - 3 ) * 5 + 2 </answer>", 1, 1, 1),
    ("<answer>1+1</answer> no, <answer>(7-3)*5+2</answer>", 1, 1, 1),  # the last tag counts
    ("<answer>(7-3)*5+2</answer> <answer>1+1</answer>", 0, 0, 1),
    ("<answer>5*3+7</answer>", 0, 1, 1),  # leaves 2 unused
    ("<answer>5*5-3</answer>", 0, 0, 1),  # reuses 5
    ("<answer>(7-3)*5+2+2-2</answer>", 0, 0, 1),  # reuses 2
    ("<answer>2+3+5+7</answer>", 0, 0, 1),  # 17
    ("<answer>22</answer>", 0, 0, 1),
    ("<answer>7/(5-5)+2+3</answer>", 0, 0, 0),  # division by zero
    ("<answer>(7-3)*5+2 = 22</answer>", 0, 0, 0),
    ("<answer>-2+(7-3)*5+2+2</answer>", 0, 0, 0),  # unary minus
    ("<answer>2**3+5+7+2</answer>", 0, 0, 0),  # power
    ("<answer>5(7-3)+2</answer>", 0, 0, 0),  # implicit product
    ("<answer>__import__('os').system('true')</answer>", 0, 0, 0),
    ("<answer>(７-3)*5+2</answer>", 0, 0, 0),  # full-width digit
    ("<answer>(7−3)×5+2</answer>", 0, 0, 0),
    ("(7-3)*5+2", 0, 0, 0),  # no tag
    ("<answer>(7-3)*5+2", 0, 0, 0),  # unclosed
    ("<answer>" + "9" * 5000 + "</answer>", 0, 0, 0),
    ("<answer>" + "(" * 150 + "2" + ")" * 150 + "</answer>", 0, 0, 0),  # too deep / too long
])
def test_countdown_reward(text, exactly, at_most, formatted):
    assert task("countdown").reward(text, CD).parts == {"correctness": exactly, "format": formatted}
    assert task("countdown", number_use="at_most_once").reward(text, CD).parts["correctness"] == at_most


def test_countdown_exact_fractions():
    row = countdown_row({"numbers": [3, 3, 8, 8], "target": 24})
    assert task("countdown").reward("<answer>8/(3-8/3)</answer>", row).parts["correctness"] == 1.0


@pytest.mark.parametrize("text", ADVERSARIAL)
def test_countdown_adversarial_scores_zero(text):
    assert task("countdown").reward(text, CD).total == 0.0


def test_safe_evaluator_is_exact_and_rejects_code():
    assert evaluate("(1/3)*3") == (1, [1, 3, 3])
    for bad in ["1e3", "1.5+1", "a+1", "1_000", "(1", "2**2", "[1]", "1 if 1 else 2", "-1"]:
        with pytest.raises(ExpressionError):
            evaluate(bad)


def test_countdown_reference_solves_file_rows_without_solution():
    for number_use in ("exactly_once", "at_most_once"):
        t = task("countdown", number_use=number_use)
        ref = t.reference_completion(CD)
        assert t.reward(ref, CD).parts["correctness"] == 1.0
    with pytest.raises(ValueError):
        task("countdown").reference_completion(countdown_row({"numbers": [1, 1], "target": 97}))


# ---------------------------------------------------------------- sudoku4
SOLUTION = "1234341221434321"
PUZZLE = "1004300221004001"  # 8 empty cells


def test_the_fixture_puzzle_has_a_unique_solution():
    assert solutions(PUZZLE, limit=5) == [SOLUTION]


def sudoku_parts(text, scoring="cells"):
    return task("sudoku4", scoring=scoring).reward(text, sudoku_row({"puzzle": PUZZLE})).parts


@pytest.mark.parametrize("text", [
    f"<answer>{SOLUTION}</answer>",
    "<answer>\n1234\n3412\n2143\n4321\n</answer>",
    "<answer>1 2 3 4 | 3 4 1 2 | 2 1 4 3 | 4 3 2 1</answer>",
    f"<answer>0000000000000000</answer> <answer>{SOLUTION}</answer>",
])
def test_sudoku_right_answers(text):
    for scoring in ("cells", "valid"):
        assert sudoku_parts(text, scoring) == {"correctness": 1.0, "format": 1.0}


def test_sudoku_partial_credit_counts_empty_cells_only():
    empty = [i for i, c in enumerate(PUZZLE) if c == "0"]
    wrong = list(SOLUTION)
    for i in empty[:3]:
        wrong[i] = "4" if wrong[i] != "4" else "1"
    assert sudoku_parts(f"<answer>{''.join(wrong)}</answer>")["correctness"] == pytest.approx(5 / 8)
    assert sudoku_parts(f"<answer>{''.join(wrong)}</answer>", "valid")["correctness"] == 0.0
    clue_changed = "2" + SOLUTION[1:]  # d1 ignores clue cells; a valid-solution check does not
    assert sudoku_parts(f"<answer>{clue_changed}</answer>")["correctness"] == 1.0
    assert sudoku_parts(f"<answer>{clue_changed}</answer>", "valid")["correctness"] == 0.0


def test_sudoku_short_and_long_answers():
    short = sudoku_parts(f"<answer>{SOLUTION[:8]}</answer>")  # padded with 0 (d1)
    assert short["correctness"] == pytest.approx(sum(PUZZLE[i] == "0" for i in range(8)) / 8)
    assert short["format"] == 0.0
    assert sudoku_parts(f"<answer>{SOLUTION}1</answer>") == {"correctness": 1.0, "format": 0.0}  # truncated
    assert sudoku_parts(f"<answer>{SOLUTION}1</answer>", "valid")["correctness"] == 0.0


@pytest.mark.parametrize("text", ADVERSARIAL + [SOLUTION, f"<answer>{'１２３４' * 4}</answer>"])
def test_sudoku_adversarial_scores_zero(text):
    assert task("sudoku4").reward(text, sudoku_row({"puzzle": PUZZLE})).total == 0.0


def test_valid_scoring_equals_full_cell_credit_on_unique_puzzles():
    row = sudoku_row({"puzzle": PUZZLE})
    cells, valid = task("sudoku4"), task("sudoku4", scoring="valid")
    for grid in all_grids():
        text = f"<answer>{grid}</answer>"
        assert valid.reward(text, row).parts["correctness"] == float(
            cells.reward(text, row).parts["correctness"] == 1.0
        )


def test_valid_scoring_accepts_any_solution_of_an_ambiguous_puzzle():
    puzzle = "1000000000000000"
    row = sudoku_row({"puzzle": puzzle, "solution": SOLUTION})
    other = next(g for g in solutions(puzzle, limit=2) if g != SOLUTION)
    assert task("sudoku4", scoring="valid").reward(f"<answer>{other}</answer>", row).parts["correctness"] == 1.0
    assert task("sudoku4").reward(f"<answer>{other}</answer>", row).parts["correctness"] < 1.0

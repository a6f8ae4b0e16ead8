"""The graders of d1's evaluation (arXiv 2504.12216), which SPG and StableDRL report with.

Each grader maps (completion, row) to a ``Grade``: ``correct`` out of ``total`` units and the
answer it read. A benchmark's accuracy is Σ correct / Σ total: the share of right answers (one unit
per prompt) for GSM8K, MATH500 and Countdown, and for Sudoku the share of the puzzles' empty cells
filled right (d1 counts cells over the whole set, not solved puzzles). The reading rules are d1's,
so that a completion d1 scores right scores right here:

- **gsm8k**: the first ``\\boxed{...}`` (up to its first ``}``) that holds a number (the whole
  content, else its first number); else the first ``<answer>...</answer>``'s content (whole, else
  its last number). Right iff that value equals the reference number. Numbers are read as d1 reads
  them: ``-?digits[.digits]``, so ``1,000`` reads as 1.
- **math** and **countdown** read d1's box: after the last ``\\boxed `` (with a space) up to ``$``,
  else the last ``\\boxed{...}`` with its braces matched (``d1_box``).
- **math**: that box's content; a box that never closes or is empty: the first answer tag's
  content. Compared with the reference by ``math_equal``: d1 uses string normalisation (MATH's
  ``is_equiv``), the StableDRL release Math-Verify; here an answer is right when the normalised
  strings agree (``common.tasks.latex``) or, where the ``math-verify`` package is installed, when
  Math-Verify finds the two symbolically equal (``\\frac{1}{2}`` = 0.5, ``\\sqrt{8}`` = ``2\\sqrt{2}``).
  ``math_grader()`` names the one in use; without the package the grader says so once and MATH is
  graded by normalisation alone (a lower bound). With no box at all d1 compares the whole
  completion, which only a bare answer passes; so does this grader (by normalisation).
- **countdown**: the box's content (a box that never closes: the first answer tag's content, else
  the whole completion; no box: the whole completion); ``\\times`` / ``\\cdot`` / ``\\div`` become
  ``* /``; where it holds "expression = number" the first such expression is kept. Right iff the
  integers in it are exactly the given numbers (each once) and its exact value is the target.
  Unary signs are refused (``common.tasks.expression``), which d1's ``eval`` would accept.
- **sudoku4**: the first of d1's readings that finds something: digits in a fenced block after
  ``<answer>``; the answer tag's content (up to ``</answer>`` or the end); what follows
  ``</answer>``; 16 digits before ``</answer>``; any 16-digit run. Whitespace is dropped and the
  result padded with 0 / cut to 16; ``correct`` counts the puzzle's empty cells that match the
  solution, ``total`` is the number of empty cells.

d1 decodes with the special tokens kept and reads up to ``<|eot_id|>``; completions here end at
the first EOS with special tokens removed, so "the end of the text" stands where d1 reads a turn end.
"""
from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from common.tasks.base import Row
from common.tasks.expression import ExpressionError, evaluate, uses_numbers
from common.tasks.hendrycks_math import find_box
from common.tasks.latex import equivalent

log = logging.getLogger(__name__)
_D1_NUMBER = re.compile(r"-?\d+\.?\d*")
_FIRST_BOXES = re.compile(r"\\boxed{(.*?)}")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_EQUATION = re.compile(r"([0-9+\-*/() ]+)=[0-9. ]+")
_SUDOKU_READINGS = (
    re.compile(r"<answer>.*?```\s*([\d\s]+)```", re.DOTALL),
    re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.DOTALL),
    re.compile(r"</answer>\s*(.*?)\Z", re.DOTALL),
    re.compile(r".*?(\d{16})\s*</answer>", re.DOTALL),
    re.compile(r"\b(\d{16})\b"),
)


@dataclass(frozen=True)
class Grade:
    correct: float  # right units (0 or 1; Sudoku: right cells)
    total: float  # units graded (1; Sudoku: the puzzle's empty cells)
    answer: Optional[str]  # what was read as the answer (None: nothing)


Grader = Callable[[str, Row], Grade]


def _float(text: str) -> Optional[float]:
    try:
        return float(text)
    except ValueError:
        return None


class _NoBox:
    def __repr__(self) -> str:
        return "NO_BOX"


NO_BOX = _NoBox()


def d1_box(text: str) -> "str | None | _NoBox":
    """The box d1 reads: after the last ``\\boxed `` (a space, no braces) up to ``$``; else the last
    ``\\boxed`` (or ``\\fbox``) with its braces matched. None when that box never closes, NO_BOX
    when there is none."""
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    start = start if start >= 0 else text.rfind("\\fbox")
    if start < 0:
        return NO_BOX
    return find_box(text[start:], "first")


def _first_tag(text: str) -> Optional[str]:
    tag = _ANSWER_TAG.search(text)
    return tag.group(1).strip() if tag else None


def gsm8k_answer(completion: str) -> Optional[float]:
    """d1's reading of a GSM8K completion (module docstring), or None."""
    for content in _FIRST_BOXES.findall(completion):
        content = content.strip()
        if not content or set(content) == {"."}:
            continue
        value = _float(content)
        if value is None:
            found = _D1_NUMBER.findall(content)
            value = _float(found[0]) if found else None
        if value is not None:
            return value
    tag = _ANSWER_TAG.search(completion)
    content = tag.group(1).strip() if tag else ""
    if not content:
        return None
    value = _float(content)
    if value is None:
        found = _D1_NUMBER.findall(content)
        value = _float(found[-1]) if found else None
    return value


def grade_gsm8k(completion: str, row: Row) -> Grade:
    value = gsm8k_answer(completion)
    return Grade(float(value is not None and value == float(row.answer)), 1.0, None if value is None else f"{value:g}")


# ---- MATH ---------------------------------------------------------------------------------------
_math_verify: Optional[tuple[Callable, Callable]] = None
_math_verify_checked = False


def _load_math_verify() -> Optional[tuple[Callable, Callable]]:
    global _math_verify, _math_verify_checked
    if not _math_verify_checked:
        _math_verify_checked = True
        try:
            from math_verify import parse, verify

            _math_verify = (parse, verify)
        except ImportError:
            log.warning("math-verify is not installed: MATH answers are compared by string normalisation only, "
                        "which misses symbolic equalities (pip install math-verify)")
    return _math_verify


def math_grader() -> str:
    """Which comparison MATH answers get here: "math-verify" (symbolic) or "normalised strings"."""
    return "math-verify" if _load_math_verify() is not None else "normalised strings"


def math_equal(predicted: str, reference: str) -> bool:
    """Normalised strings agree, or Math-Verify finds the boxed expressions equal (where installed)."""
    if equivalent(predicted, reference):
        return True
    loaded = _load_math_verify()
    if loaded is None:
        return False
    parse, verify = loaded
    # its time limits use SIGALRM, which only the main thread may set
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold = parse(f"\\boxed{{{reference}}}", parsing_timeout=limit)
        guess = parse(f"\\boxed{{{predicted}}}", parsing_timeout=limit)
        return bool(gold and guess and verify(gold, guess, timeout_seconds=limit))
    except Exception:  # a parse or comparison that failed or timed out: not shown equal
        return False


def grade_math(completion: str, row: Row) -> Grade:
    boxed = d1_box(completion)
    if boxed is NO_BOX:  # d1 compares the whole completion, which matches only a bare answer
        return Grade(float(equivalent(completion, row.answer)), 1.0, None)
    answer = boxed or _first_tag(completion)
    return Grade(float(bool(answer) and math_equal(answer, row.answer)), 1.0, answer or None)


# ---- Countdown ----------------------------------------------------------------------------------
def countdown_expression(completion: str) -> str:
    """d1's reading of a Countdown completion: the expression it will evaluate (module docstring)."""
    boxed = d1_box(completion)
    if boxed is NO_BOX:
        text = completion
    else:
        text = boxed if boxed is not None else (_first_tag(completion) or completion)
    text = text.replace("\\div", "/").replace("\\times", "*").replace("\\cdot", "*")
    equation = _EQUATION.search(text)
    return equation.group(1).strip() if equation else text


def grade_countdown(completion: str, row: Row) -> Grade:
    expression = countdown_expression(completion)
    used = [int(n) for n in re.findall(r"\d+", expression)]
    right = False
    if sorted(used) == sorted(row.meta["numbers"]):
        try:
            value, literals = evaluate(expression.strip())
            right = uses_numbers(literals, list(row.meta["numbers"]), exactly_once=True) and value == row.meta["target"]
        except ExpressionError:
            right = False
    return Grade(float(right), 1.0, expression)


# ---- Sudoku -------------------------------------------------------------------------------------
def sudoku_answer(completion: str) -> str:
    """d1's reading of a Sudoku completion: 16 characters (padded with 0), or "" if none."""
    for reading in _SUDOKU_READINGS:
        found = reading.search(completion)
        if found and found.group(1).strip():
            grid = re.sub(r"\s", "", found.group(1))
            return grid[:16].ljust(16, "0")
    return ""


def grade_sudoku(completion: str, row: Row) -> Grade:
    puzzle, solution = row.meta["puzzle"], row.meta["solution"]
    empty = [i for i, cell in enumerate(puzzle) if cell == "0"]
    grid = sudoku_answer(completion)
    right = sum(grid[i] == solution[i] for i in empty) if grid else 0
    return Grade(float(right), float(len(empty)), grid or None)


GRADERS: dict[str, Grader] = {"gsm8k": grade_gsm8k, "math": grade_math, "countdown": grade_countdown,
                              "sudoku4": grade_sudoku}

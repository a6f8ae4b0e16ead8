"""The graders of d1's evaluation (arXiv 2504.12216), which SPG's release evaluates with too.

Each grader maps (completion, row) to a ``Grade``: ``correct`` out of ``total`` units and the
answer it read. A benchmark's accuracy is Σ correct / Σ total: the share of right answers (one unit
per prompt) for GSM8K, MATH500 and Countdown, and for Sudoku the share of the puzzles' empty cells
filled right (d1 counts cells over the whole set, not solved puzzles).

The ``d1`` graders (``GRADERS``) decide every completion as d1's ``parse_and_get_acc.py`` decides
it, quirks included; ``stabledrl eval --regrade-d1`` checks that on d1's published generations.
They read the text d1 reads: the whole generated window decoded with the special tokens kept
(``<|eot_id|>``, ``<|endoftext|>`` padding); a completion cleaned to its first EOS is graded with a
``<|eot_id|>`` appended (``as_d1_text``), which is what d1 sees after a turn that ended. The rules:

- **gsm8k**: the first ``\\boxed{...}`` on one line (up to its first ``}``) whose content is not
  blank or dots and reads as a number: the whole content as a Python float (``1e3``, ``1_000`` and
  ``inf`` count), else its first ``-?digits[.digits]``; else the first ``<answer>...</answer>``'s
  content (whole, else its last such number). Right iff it equals the reference as d1 reads it:
  the number after ``####`` matching ``[digits,]+[.digits]`` with commas dropped, so a negative
  reference (two GSM8K test rows: -10, -3) reads as nothing and no answer is ever right there.
  ``\\boxed{1,000}`` reads as 1; ``\\boxed{-5}`` as -5.
- **math500**: the box (``d1_box``): after the last ``\\boxed `` (a space) up to ``$``; else the
  last ``\\boxed`` with braces matched, its content (a ``\\fbox{...}`` or ``\\boxedX{...}`` is kept
  whole, wrapper and all); a box that never closes or is empty: the first answer tag's content; no
  box and no tag: the whole completion. Compared with MATH's ``is_equiv``
  (``stabledrl.common.tasks.latex.math_is_equiv``): string equality after MATH's normalisation, which does
  not reduce fractions (``\\frac{3}{24}`` is not ``\\frac{1}{8}``), strip ``\\text{east}`` or a unit
  written ``12 cm``, drop thousands commas or compare decimals (``0.50`` is not ``\\frac{1}{2}``,
  ``0.5`` is); where the normalisation fails (a ``/`` between non-integers, a second ``\\text{ ``, a
  trailing ``\\sqrt``) the raw strings are compared.
- **countdown**: the box as for MATH (a box that never closes: the first answer tag's content,
  else the whole completion); ``\\div``, ``\\times``, ``\\cdot`` -> ``/ * *``; the first
  "expression = number" keeps its expression. Right iff the integers in it are the given numbers
  (as multisets) and, if it holds only digits, ``+-*/().`` and spaces, its Python value (floats,
  ``**`` and ``//`` and unary signs included) is within 1e-5 of the target.
- **sudoku**: the first of d1's readings that finds something: digits in a fenced block after
  ``<answer>``; the answer tag's content up to ``</answer>``, ``<|eot_id|>`` or ``<|endoftext|>``;
  what follows ``</answer>`` up to those or the end; 16 digits before ``</answer>``; any 16-digit
  run. Whitespace is dropped, the result padded with 0 / cut to 16; ``correct`` counts the empty
  cells that match the solution, ``total`` the empty cells.

Other MATH graders are separate, named choices (``MATH_GRADERS``), reported in their own rows of
the table, never mixed into d1's number: ``latex`` (``stabledrl.common.tasks.latex.equivalent``: exact
numbers, fractions reduced, ``\\text{}`` and units stripped, tuples) and ``math-verify``
(Math-Verify's symbolic comparison; ``math-verify`` is a dependency, so ``GraderUnavailable`` only
in an environment that lacks it).
"""
from __future__ import annotations

import ast
import math
import operator
import re
import threading
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from stabledrl.common.config.protocol import MATH_VERIFY_MISSING
from stabledrl.common.tasks.base import Row
from stabledrl.common.tasks.latex import equivalent, math_is_equiv

_NUMBER = re.compile(r"-?\d+\.?\d*")
_GSM_BOXES = re.compile(r"\\boxed{(.*?)}")
_DOTS = re.compile(r"\.+")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_GSM_REFERENCE = re.compile(r"####\s*\$?([\d,]+(?:\.\d+)?)")
_EQUATION = re.compile(r"([0-9+\-*/() ]+)=[0-9. ]+")
_ARITHMETIC = re.compile(r"[\d+\-*/().\s]+")
_SUDOKU_READINGS = (
    re.compile(r"<answer>.*?```\s*([\d\s]+)```", re.DOTALL),
    re.compile(r"<answer>(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|</answer>)", re.DOTALL),
    re.compile(r"</answer>\s*(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|$)", re.DOTALL),
    re.compile(r".*?(\d{16})\s*</answer>", re.DOTALL),
    re.compile(r"\b(\d{16})\b", re.DOTALL),
)
TURN_END = "<|eot_id|>"


@dataclass(frozen=True)
class Grade:
    correct: float  # right units (0 or 1; Sudoku: right cells)
    total: float  # units graded (1; Sudoku: the puzzle's empty cells)
    answer: Optional[str]  # what was read as the answer (None: nothing)


Grader = Callable[[str, Row], Grade]


class GraderUnavailable(ValueError):
    """A grader that was asked for but cannot run here (its package is missing)."""


def as_d1_text(completion: str) -> str:
    """A completion cleaned to its first EOS (special tokens removed), as d1 reads one whose turn
    ended: followed by ``<|eot_id|>``."""
    return completion + TURN_END


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
    """The box d1 reads (module docstring): its content; None when the last box never closes;
    NO_BOX when there is none (d1 then takes the whole text)."""
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return NO_BOX
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                box = text[start : i + 1]
                return box[len("\\boxed{") : -1] if box.startswith("\\boxed{") else box
    return None


def _first_tag(text: str) -> Optional[str]:
    tag = _ANSWER_TAG.search(text)
    return tag.group(1).strip() if tag else None


# ---- GSM8K --------------------------------------------------------------------------------------
def _number_in(text: str, which: int) -> Optional[float]:
    value = _float(text)
    if value is None:
        found = _NUMBER.findall(text)
        value = _float(found[which]) if found else None
    return value


def gsm8k_answer(completion: str) -> Optional[float]:
    """d1's reading of a GSM8K completion (module docstring), or None."""
    for content in _GSM_BOXES.findall(completion):
        content = content.strip()
        if not content or _DOTS.fullmatch(content):
            continue
        value = _number_in(content, 0)
        if value is not None:
            return value
    content = _first_tag(completion)
    return _number_in(content, -1) if content else None


def gsm8k_reference(solution: str) -> Optional[float]:
    """d1's reading of a GSM8K reference (``... #### 1,080``): None for a negative number."""
    found = _GSM_REFERENCE.search(solution)
    return float(found.group(1).replace(",", "")) if found else None


def gsm8k_decision(completion: str, reference: Optional[float]) -> Grade:
    value = gsm8k_answer(completion)
    right = value is not None and value == reference
    return Grade(float(right), 1.0, None if value is None else f"{value:g}")


def grade_gsm8k(completion: str, row: Row) -> Grade:
    return gsm8k_decision(completion, gsm8k_reference(f"#### {row.answer}"))


# ---- MATH ---------------------------------------------------------------------------------------
def math_answer(completion: str) -> Optional[str]:
    """d1's reading of a MATH completion (module docstring); None when nothing can be compared."""
    boxed = d1_box(completion)
    answer = completion if boxed is NO_BOX else boxed
    if not answer:
        answer = _first_tag(completion) if _ANSWER_TAG.search(completion) else answer
    return answer


def grade_math(completion: str, row: Row) -> Grade:
    answer = math_answer(completion)
    return Grade(float(answer is not None and math_is_equiv(answer, row.answer)), 1.0, answer)


def _latex_equal(predicted: str, reference: str) -> bool:
    return equivalent(predicted, reference)


def _math_verify_equal(predicted: str, reference: str) -> bool:
    parse, verify = _math_verify()
    # its time limits use SIGALRM, which only the main thread may set
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold = parse(f"\\boxed{{{reference}}}", parsing_timeout=limit)
        guess = parse(f"\\boxed{{{predicted}}}", parsing_timeout=limit)
        return bool(gold and guess and verify(gold, guess, timeout_seconds=limit))
    except Exception:  # a parse or comparison that failed or timed out: not shown equal
        return False


def _math_verify() -> tuple[Callable, Callable]:
    try:
        from math_verify import parse, verify
    except ImportError:
        raise GraderUnavailable(MATH_VERIFY_MISSING) from None
    return parse, verify


# name -> (comparison of the read answer with the reference, what it is, the packages it uses)
MATH_GRADERS: dict[str, tuple[Callable[[str, str], bool], str, tuple[str, ...]]] = {
    "d1": (math_is_equiv, "MATH's is_equiv (string normalisation), as d1", ()),
    "latex": (_latex_equal, "the project's LaTeX equivalence (exact numbers, units and \\text{} stripped)", ()),
    "math-verify": (_math_verify_equal, "Math-Verify's symbolic equivalence", ("math-verify", "sympy")),
}


def check_math_grader(name: str) -> None:
    """Fail now (GraderUnavailable, naming what to install) if MATH grader ``name`` cannot run."""
    if name not in MATH_GRADERS:
        raise ValueError(f"unknown MATH grader {name!r}; choose from {sorted(MATH_GRADERS)}")
    if name == "math-verify":
        _math_verify()


def grade_math_with(name: str) -> Grader:
    """A MATH grader that reads the answer as d1 does and compares it with ``MATH_GRADERS[name]``."""
    check_math_grader(name)
    equal = MATH_GRADERS[name][0]

    def grade(completion: str, row: Row) -> Grade:
        answer = math_answer(completion)
        return Grade(float(answer is not None and bool(answer) and equal(answer, row.answer)), 1.0, answer)

    return grade


def protocol_graders(math_graders: Sequence[str] = ()) -> dict[str, str]:
    """Which grader decides each row of a d1 table (the results record it)."""
    d1 = "d1's parse_and_get_acc.py reading (stabledrl.common.tasks.graders)"
    out = {"gsm8k": d1, "math500": f"{d1}; {MATH_GRADERS['d1'][1]}", "countdown": d1, "sudoku": d1}
    for name in math_graders:
        out[f"math500[{name}]"] = f"d1's reading; {MATH_GRADERS[name][1]}"
    return out


def grader_versions(names: Sequence[str] = ()) -> dict[str, str]:
    """The versions of what produced the numbers: stabledrl and the packages of MATH graders ``names``."""
    from importlib import metadata

    out = {}
    for package in ("stabledrl",) + tuple(p for n in names for p in MATH_GRADERS[n][2]):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out


# ---- Countdown ----------------------------------------------------------------------------------
def countdown_expression(completion: str) -> str:
    """d1's reading of a Countdown completion: the expression it will evaluate (module docstring)."""
    boxed = d1_box(completion)
    if boxed is NO_BOX:
        text = completion
    elif boxed is None:
        text = _first_tag(completion) if _ANSWER_TAG.search(completion) else completion
    else:
        text = boxed
    text = text.replace("\\div", "/").replace("\\times", "*").replace("\\cdot", "*")
    equation = _EQUATION.search(text)
    return equation.group(1).strip() if equation else text


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.Mod: operator.mod}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_POWER_BITS = 1 << 16


class _NoValue(Exception):
    pass


def _value(node: ast.AST) -> "int | float | complex":
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 \
                and right * math.log2(abs(left)) > _MAX_POWER_BITS:
            raise _NoValue  # an integer far beyond any target: never within 1e-5 of it
        return _BINARY[type(node.op)](left, right)
    raise _NoValue


def countdown_value(expression: str) -> "float | int | complex":
    """The value d1 gives an expression: Python's arithmetic on it, or inf where that fails (or
    where the text holds anything but digits, ``+-*/().`` and whitespace). Nothing is executed:
    the expression is walked with ``ast``."""
    if not _ARITHMETIC.fullmatch(expression):
        return math.inf
    try:
        return _value(ast.parse(expression.strip(), mode="eval").body)
    except (_NoValue, SyntaxError, ValueError, ArithmeticError, RecursionError, MemoryError, TypeError):
        return math.inf


def countdown_decision(completion: str, numbers: Sequence[int], target: Optional[float]) -> Grade:
    expression = countdown_expression(completion)
    right = False
    if sorted(int(n) for n in re.findall(r"\d+", expression)) == sorted(numbers):
        right = target is not None and abs(countdown_value(expression) - target) < 1e-5
    return Grade(float(right), 1.0, expression)


def grade_countdown(completion: str, row: Row) -> Grade:
    return countdown_decision(completion, list(row.meta["numbers"]), row.meta["target"])


# ---- Sudoku -------------------------------------------------------------------------------------
def sudoku_answer(completion: str) -> str:
    """d1's reading of a Sudoku completion: 16 characters (padded with 0), or "" if none."""
    for reading in _SUDOKU_READINGS:
        found = reading.search(completion)
        if found and found.group(1).strip():
            grid = re.sub(r"\s", "", found.group(1))
            return grid[:16].ljust(16, "0")
    return ""


def sudoku_decision(completion: str, puzzle: str, solution: str) -> Grade:
    empty = [i for i, cell in enumerate(puzzle) if cell == "0"]
    grid = sudoku_answer(completion)
    right = sum(grid[i] == solution[i] for i in empty) if grid else 0
    return Grade(float(right), float(len(empty)), grid or None)


def grade_sudoku(completion: str, row: Row) -> Grade:
    return sudoku_decision(completion, row.meta["puzzle"], row.meta["solution"])


GRADERS: dict[str, Grader] = {"gsm8k": grade_gsm8k, "math": grade_math, "countdown": grade_countdown,
                              "sudoku4": grade_sudoku}

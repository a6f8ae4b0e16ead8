"""``sudoku4``: 4x4 Sudoku as 16 digits row by row, ``0`` = empty (d1's format, arXiv 2504.12216).

The completion writes the solved grid in ``<answer>...</answer>`` (the last tag counts; its
ASCII digits are read, separators ignored). Two scorings:
- ``cells`` (d1's ``validate_sudoku_solution``): digits padded with 0 / truncated to 16; reward
  = fraction of the puzzle's empty cells equal to the reference solution (partial credit).
- ``valid``: 1 iff exactly 16 digits form a valid grid (rows, columns, 2x2 boxes each a
  permutation of 1..4) that keeps every clue; any valid solution counts.
For a puzzle with a unique solution, ``valid`` = 1 exactly when ``cells`` = 1.
format = 1 iff the last answer tag holds exactly 16 digits, all in 1..4.

File records: ``puzzle`` (16 characters 0-4; an integer is zero-padded, as d1's loader does);
optional ``solution`` (checked against the puzzle; searched for when absent), ``id``.
"""
from __future__ import annotations

import random
import re
from typing import Any, Mapping, Optional

import numpy as np

from stabledrl.common.tasks.base import (
    TASKS, BadRow, Row, Task, content_id, last_answer_tag, record_id, configured_task,
)

NAME = "sudoku4"
DEFAULT_TEMPLATE = "{prompt} Write the 16 digits of the solved grid, row by row, in <answer> </answer>."
UNITS = (
    [[4 * r + c for c in range(4)] for r in range(4)]
    + [[4 * r + c for r in range(4)] for c in range(4)]
    + [[4 * (br + r) + bc + c for r in range(2) for c in range(2)] for br in (0, 2) for bc in (0, 2)]
)
_PEERS = [sorted({j for unit in UNITS if i in unit for j in unit} - {i}) for i in range(16)]
_NON_DIGIT = re.compile(r"[^0-9]", re.ASCII)


def is_valid_solution(grid: str) -> bool:
    return len(grid) == 16 and all(sorted(grid[i] for i in unit) == list("1234") for unit in UNITS)


def consistent(grid: str, puzzle: str) -> bool:
    return len(grid) == 16 and all(p == "0" or p == g for p, g in zip(puzzle, grid))


def solutions(puzzle: str, limit: int = 2, rng: Optional[random.Random] = None) -> list[str]:
    """Up to ``limit`` solutions of ``puzzle`` by backtracking (candidate order shuffled by ``rng``)."""
    cells = list(puzzle)
    found: list[str] = []

    def fill(i: int) -> None:
        if len(found) >= limit:
            return
        while i < 16 and cells[i] != "0":
            i += 1
        if i == 16:
            found.append("".join(cells))
            return
        candidates = [d for d in "1234" if all(cells[j] != d for j in _PEERS[i])]
        if rng is not None:
            rng.shuffle(candidates)
        for d in candidates:
            cells[i] = d
            fill(i + 1)
        cells[i] = "0"

    if all(p == "0" or all(puzzle[j] != p for j in _PEERS[i]) for i, p in enumerate(puzzle)):
        fill(0)
    return found


def all_grids() -> list[str]:
    """The 288 valid 4x4 grids (computed once)."""
    global _ALL_GRIDS, _DIGIT_MASKS
    if _ALL_GRIDS is None:
        _ALL_GRIDS = solutions("0" * 16, limit=1000)
        _DIGIT_MASKS = np.array([[sum(1 << i for i in range(16) if g[i] == d) for d in "1234"] for g in _ALL_GRIDS])
    return _ALL_GRIDS


_ALL_GRIDS: Optional[list[str]] = None
_DIGIT_MASKS = np.zeros((0, 4), dtype=np.int64)  # [288, 4]: per grid and digit, the bitmask of its cells


def make_puzzle(rng: random.Random, empty_cells: int, unique: bool) -> tuple[str, str]:
    """(puzzle, solution): a uniformly drawn valid grid with ``empty_cells`` cells cleared.

    With ``unique``, a cell is cleared only if the solution stays the only grid that agrees with
    the remaining clues: grid g agrees with clue set C iff diff(g, solution) & C == 0 (bitmasks
    over the 16 cells). An order that gets stuck before ``empty_cells`` is redrawn.
    """
    grids = all_grids()
    for _ in range(1000):
        k = rng.randrange(len(grids))
        agree = np.bitwise_or.reduce(_DIGIT_MASKS & _DIGIT_MASKS[k], axis=1)  # [288] cells where g equals the solution
        diffs = 0xFFFF & ~agree
        diffs = diffs[diffs != 0]  # [287]
        clues, cleared = 0xFFFF, 0
        order = list(range(16))
        rng.shuffle(order)
        for i in order:
            if cleared == empty_cells:
                break
            trial = clues & ~(1 << i)
            if unique and bool(((diffs & trial) == 0).any()):
                continue
            clues, cleared = trial, cleared + 1
        if cleared == empty_cells:
            return "".join(grids[k][i] if clues >> i & 1 else "0" for i in range(16)), grids[k]
    raise RuntimeError(f"no 4x4 puzzle with {empty_cells} empty cells found (unique={unique})")


def answer_digits(completion: str) -> Optional[str]:
    content = last_answer_tag(completion)
    return None if content is None else _NON_DIGIT.sub("", content)


def score_cells(digits: Optional[str], row: Row) -> float:
    if not digits:
        return 0.0
    grid = digits[:16].ljust(16, "0")
    puzzle, solution = row.meta["puzzle"], row.meta["solution"]
    empty = [i for i in range(16) if puzzle[i] == "0"]
    return sum(grid[i] == solution[i] for i in empty) / len(empty) if empty else 0.0


def score_valid(digits: Optional[str], row: Row) -> float:
    return float(digits is not None and is_valid_solution(digits) and consistent(digits, row.meta["puzzle"]))


def format_score(completion: str, row: Row) -> float:
    digits = answer_digits(completion)
    return float(digits is not None and len(digits) == 16 and set(digits) <= set("1234"))


def reference(row: Row) -> str:
    return f"<answer>{row.meta['solution']}</answer>"


def question(puzzle: str) -> str:
    return f"Solve this 4x4 Sudoku puzzle: {puzzle}. 0 marks an empty cell."


def from_record(record: Mapping[str, Any]) -> Row:
    puzzle = record.get("puzzle")
    if puzzle is None:
        raise BadRow("missing field 'puzzle'", "missing_field")
    puzzle = str(puzzle).strip().zfill(16) if isinstance(puzzle, int) else str(puzzle).strip()
    if not re.fullmatch(r"[0-4]{16}", puzzle, re.ASCII):
        raise BadRow(f"puzzle {puzzle[:40]!r} is not 16 digits 0-4")
    solution = record.get("solution")
    if solution is not None:
        solution = str(solution).strip().zfill(16)
        if not (is_valid_solution(solution) and consistent(solution, puzzle)):
            raise BadRow("solution is not a valid grid consistent with the puzzle")
    else:
        found = solutions(puzzle, limit=1)
        if not found:
            raise BadRow("puzzle has no solution")
        solution = found[0]
    meta = {"puzzle": puzzle, "solution": solution}
    return Row(prompt_id=record_id(record, NAME, puzzle), prompt=question(puzzle), answer=solution, meta=meta)


@TASKS.register(NAME)
def build(cfg: Any) -> Task:
    scorer = score_cells if cfg.scoring == "cells" else score_valid

    def correctness(completion: str, row: Row) -> float:
        return scorer(answer_digits(completion), row)

    def generate(seed: int) -> Row:
        puzzle, solution = make_puzzle(random.Random(seed), cfg.empty_cells, cfg.unique)
        meta = {"puzzle": puzzle, "solution": solution}
        return Row(prompt_id=content_id(NAME, puzzle), prompt=question(puzzle), answer=solution, meta=meta)

    return configured_task(cfg, NAME, DEFAULT_TEMPLATE, ("puzzle",), correctness=correctness,
                           format_score=format_score, reference=reference, from_record=from_record, generate=generate)

"""Exact, safe evaluation of + - * / expressions over integer literals, and a Countdown solver.

Nothing is ``eval``-ed. The text must consist of ASCII digits, ``+ - * /``, parentheses and
spaces; it is parsed with ``ast`` and only ``BinOp`` nodes over non-negative integer literals
are walked. Arithmetic is exact (``fractions.Fraction``), so ``(1/3)*3`` equals 1 and no float
tolerance is needed. There is no power operator, so values stay small for short inputs;
unary signs, calls, names and implicit multiplication are rejected.
"""
from __future__ import annotations

import ast
import re
from fractions import Fraction
from typing import Optional

MAX_EXPRESSION_CHARS = 200
_ALLOWED_TEXT = re.compile(r"[0-9+\-*/() \t]+", re.ASCII)
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class ExpressionError(ValueError):
    """Text that is not an allowed arithmetic expression (or divides by zero)."""


def evaluate(text: str) -> tuple[Fraction, list[int]]:
    """Value of ``text`` and the integer literals it uses, in order of appearance."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"longer than {MAX_EXPRESSION_CHARS} characters")
    if not _ALLOWED_TEXT.fullmatch(text):
        raise ExpressionError("only digits, + - * /, parentheses and spaces are allowed")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ExpressionError(f"not an expression: {e.__class__.__name__}") from None
    literals: list[int] = []
    return _walk(tree.body, literals), literals


def _walk(node: ast.AST, literals: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        literals.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left = _walk(node.left, literals)
        right = _walk(node.right, literals)
        op = _OPS[type(node.op)]
        if op == "+":
            return left + right
        if op == "-":
            return left - right
        if op == "*":
            return left * right
        if right == 0:
            raise ExpressionError("division by zero")
        return left / right
    raise ExpressionError(f"{type(node).__name__} is not allowed")


def uses_numbers(used: list[int], given: list[int], exactly_once: bool) -> bool:
    """Multiset rule: ``used`` equals ``given`` (exactly once) or is contained in it (at most once)."""
    remaining: dict[int, int] = {}
    for n in given:
        remaining[n] = remaining.get(n, 0) + 1
    for n in used:
        if remaining.get(n, 0) == 0:
            return False
        remaining[n] -= 1
    return not exactly_once or not any(remaining.values())


def solve_countdown(numbers: list[int], target: int, exactly_once: bool = True, budget: int = 200_000) -> Optional[str]:
    """An expression reaching ``target`` from ``numbers`` (each used once, or at most once), or None.

    Depth-first over multisets: replace any two items by one of their combinations; states already
    seen are skipped. ``budget`` bounds the states visited (None is returned when it runs out).
    """
    goal = Fraction(target)
    seen: set[tuple[Fraction, ...]] = set()
    visits = 0

    def search(items: list[tuple[Fraction, str]]) -> Optional[str]:
        nonlocal visits
        if not exactly_once:
            for value, text in items:
                if value == goal:
                    return text
        if len(items) == 1:
            return items[0][1] if items[0][0] == goal else None
        key = tuple(sorted(v for v, _ in items))
        if key in seen or visits >= budget:
            return None
        seen.add(key)
        visits += 1
        for i in range(len(items)):
            for j in range(len(items)):
                if i == j:
                    continue
                (a, sa), (b, sb) = items[i], items[j]
                rest = [items[k] for k in range(len(items)) if k not in (i, j)]
                for value, text in _combinations(a, sa, b, sb, ordered=i < j):
                    found = search(rest + [(value, text)])
                    if found is not None:
                        return found
        return None

    found = search([(Fraction(n), str(n)) for n in numbers])
    if found is None:
        return None
    return found[1:-1] if found.startswith("(") and _outer_parens(found) else found


def _combinations(a: Fraction, sa: str, b: Fraction, sb: str, ordered: bool):
    if ordered:  # commutative operators once per unordered pair
        yield a + b, f"({sa}+{sb})"
        yield a * b, f"({sa}*{sb})"
    yield a - b, f"({sa}-{sb})"
    if b != 0:
        yield a / b, f"({sa}/{sb})"


def _outer_parens(text: str) -> bool:
    """True when the first '(' closes at the last character (so the pair can be dropped)."""
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return i == len(text) - 1
    return False

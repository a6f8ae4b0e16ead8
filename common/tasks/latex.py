"""Equivalence of short LaTeX answers after normalisation, without a computer-algebra system.

The normalisation follows the spirit of the MATH benchmark's ``is_equiv`` (Hendrycks et al.,
arXiv 2103.03874) and adds exact numeric comparison:
- layout: spaces, ``\\left``/``\\right``, ``\\!``, ``\\,``, ``\\;``, ``\\quad``, ``\\displaystyle``, ``$``;
- ``\\dfrac``/``\\tfrac`` -> ``\\frac``; ``\\frac12`` -> ``\\frac{1}{2}``; ``\\sqrt2`` -> ``\\sqrt{2}``;
- ``\\text{..}``, ``\\mathrm{..}``, ``\\mbox{..}``, ``\\textbf{..}`` -> their content, and a trailing
  unit after a value is dropped (``5\\text{ cm}``, ``5 cm``); degrees and percent signs dropped;
- a short left-hand side is dropped (``x=5`` -> ``5``); a trailing period is dropped;
- numbers compare as exact fractions: ``0.5`` = ``\\frac{1}{2}`` = ``1/2`` = ``.50``;
  ``1,000`` = ``1000``; ``2.50`` = ``2.5``;
- tuples and intervals with the same brackets compare element by element.
Symbolic identities (``\\frac{\\sqrt2}{2}`` vs ``\\frac{1}{\\sqrt2}``) are not recognised.
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Optional

from stabledrl.common.tasks.base import MAX_NUMBER_CHARS

_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_TRAILING_UNIT = re.compile(r"^(.+?)\s*\\(?:text|mathrm|mbox)\s*\{\s*[A-Za-z][A-Za-z ]*\}(?:\^\{?[0-9]\}?)?$")
_PLAIN_UNIT = re.compile(r"^(-?[0-9][0-9.,]*)\s+[A-Za-z]+(?:\^\{?[0-9]\}?)?$", re.ASCII)
_SPACING = re.compile(r"\\(?:[,;:! ]|q?quad|displaystyle|left|right)(?![A-Za-z])")
_SHORT_LHS = re.compile(r"[A-Za-z](?:_\{?[A-Za-z0-9]\}?)?|\\[A-Za-z]+")
_NUM = r"-?[0-9]+(?:\.[0-9]+)?"
_DECIMAL = re.compile(_NUM, re.ASCII)
_FRAC = re.compile(rf"(-?)\\frac\{{({_NUM})\}}\{{({_NUM})\}}", re.ASCII)
_SLASH = re.compile(rf"({_NUM})/({_NUM})", re.ASCII)
_BRACKETS = {"(": ")", "[": "]", "\\{": "\\}"}
MAX_TUPLE_PARTS = 32  # longer lists compare as plain strings (keeps adversarial input linear)


def normalize(answer: str) -> str:
    s = answer.strip().replace("\n", " ").replace("\u2212", "-")
    s = s.replace("\\$", "").replace("$", "")
    for pattern in (_TRAILING_UNIT, _PLAIN_UNIT):
        m = pattern.match(s.strip())
        if m:
            s = m.group(1)
    s = _WRAPPERS.sub(r"\1", s)
    s = _SPACING.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for degree in ("^{\\circ}", "^\\circ", "\u00b0", "\\%", "%"):
        s = s.replace(degree, "")
    s = s.replace(" ", "").rstrip(".")
    if s.count("=") == 1:
        lhs, rhs = s.split("=")
        if _SHORT_LHS.fullmatch(lhs) and rhs:
            s = rhs
    s = re.sub(r"\\sqrt([0-9A-Za-z])", r"\\sqrt{\1}", s)
    s = re.sub(r"\\frac([0-9A-Za-z])([0-9A-Za-z])", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac([0-9A-Za-z])\{", r"\\frac{\1}{", s)
    s = re.sub(r"(?<![0-9])\.([0-9])", r"0.\1", s)
    if re.fullmatch(r"-?[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?", s):
        s = s.replace(",", "")
    return s


def to_number(s: str) -> Optional[Fraction]:
    """The exact value of a normalised integer, decimal or simple fraction, or None."""
    if len(s) > 2 * MAX_NUMBER_CHARS:
        return None
    try:
        if _DECIMAL.fullmatch(s):
            return Fraction(s)
        m = _FRAC.fullmatch(s)
        if m:
            value = Fraction(m.group(2)) / Fraction(m.group(3))
            return -value if m.group(1) else value
        m = _SLASH.fullmatch(s)
        if m:
            return Fraction(m.group(1)) / Fraction(m.group(2))
    except (ZeroDivisionError, ValueError):
        return None
    return None


def _split_top_level(s: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        depth += ch in "({["
        depth -= ch in ")}]"
        if ch == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    return parts + [s[start:]]


def _as_tuple(s: str) -> Optional[tuple[str, list[str]]]:
    for left, right in _BRACKETS.items():
        if s.startswith(left) and s.endswith(right):
            inner = s[len(left) : len(s) - len(right)]
            parts = _split_top_level(inner)
            if 1 < len(parts) <= MAX_TUPLE_PARTS:
                return left, parts
    parts = _split_top_level(s)
    return ("", parts) if 1 < len(parts) <= MAX_TUPLE_PARTS else None


def equivalent(predicted: Optional[str], reference: str, _depth: int = 0) -> bool:
    if predicted is None:
        return False
    a, b = normalize(predicted), normalize(reference)
    if not a or not b:
        return False
    if a == b:
        return True
    na, nb = to_number(a), to_number(b)
    if na is not None and nb is not None:
        return na == nb
    ta, tb = _as_tuple(a), _as_tuple(b)
    if ta and tb and _depth < 4 and ta[0] == tb[0] and len(ta[1]) == len(tb[1]):
        return all(equivalent(x, y, _depth + 1) for x, y in zip(ta[1], tb[1]))
    return False


# ---- MATH's own string normalisation, as d1 grades with it --------------------------------------
class _Unreadable(Exception):
    """A string MATH's normalisation fails on; MATH's ``is_equiv`` then compares the raw strings."""


def _braced_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``; a ``\\frac`` followed by
    one character leaves the whole string as it was; one followed by nothing fails."""
    pieces = s.split("\\frac")
    out = pieces[0]
    for piece in pieces[1:]:
        out += "\\frac"
        if not piece:
            raise _Unreadable(s)
        if piece[0] == "{":
            out += piece
        elif len(piece) < 2:
            return s
        elif piece[1] != "{":
            out += "{" + piece[0] + "}{" + piece[1] + "}" + piece[2:]
        else:
            out += "{" + piece[0] + "}" + piece[1:]
    return out


def _braced_sqrts(s: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}`` (one character); a ``\\sqrt`` at the very end fails."""
    pieces = s.split("\\sqrt")
    out = pieces[0]
    for piece in pieces[1:]:
        if not piece:
            raise _Unreadable(s)
        out += "\\sqrt" + (piece if piece[0] == "{" else "{" + piece[0] + "}" + piece[1:])
    return out


def _slash_fraction(s: str) -> str:
    """``a/b`` with a and b integers written plainly -> ``\\frac{a}{b}``. A single ``/`` between
    anything else fails (MATH's code reads both sides as integers unguarded)."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        raise _Unreadable(s) from None
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def math_strip(s: str) -> str:
    """MATH's ``strip_string`` (Hendrycks et al.), the normalisation d1 compares with; raises
    ``_Unreadable`` where that code raises. Steps, in order: newlines and ``\\!`` removed; ``\\\\``
    -> ``\\``; ``tfrac``/``dfrac`` -> ``frac``; ``\\left``/``\\right`` and degree marks removed;
    ``\\$`` removed; a unit after ``\\text{ `` (with a space) cut off (two such: fails); ``\\%`` and
    ``%`` after a backslash removed; ``" ."``/``"{."`` and a leading ``.`` get a 0; ``x = 5`` with a
    left side of at most two characters -> ``5``; ``\\sqrt3`` -> ``\\sqrt{3}``; spaces removed;
    ``\\frac12`` -> ``\\frac{1}{2}``; exactly ``0.5`` -> ``\\frac{1}{2}``; ``1/2`` -> ``\\frac{1}{2}``.
    Nothing else: ``\\text{east}`` stays, ``12 cm`` is ``12cm``, ``\\frac{3}{24}`` is not ``\\frac{1}{8}``,
    ``1,000`` is not ``1000``, ``0.50`` is not ``\\frac{1}{2}``."""
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:
        parts = s.split("\\text{ ")
        if len(parts) != 2:
            raise _Unreadable(s)
        s = parts[0]
    s = s.replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _braced_sqrts(s).replace(" ", "")
    s = _braced_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_fraction(s)


def math_is_equiv(predicted: Optional[str], reference: Optional[str]) -> bool:
    """MATH's ``is_equiv`` on two strings, as d1 grades MATH500: equal after ``math_strip``; where
    that fails on either, equal as raw strings. Two Nones are equal (MATH's code says so too)."""
    if predicted is None or reference is None:
        return predicted is None and reference is None
    try:
        return math_strip(predicted) == math_strip(reference)
    except _Unreadable:
        return predicted == reference

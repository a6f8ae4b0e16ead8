"""``math``: competition problems with a ``\\boxed{}`` answer (Hendrycks et al., arXiv 2103.03874).

The answer of a completion is the content of its last ``\\boxed{...}`` / ``\\fbox{...}`` (or the
first, by config), read with brace matching: nested braces are kept, ``\\{`` / ``\\}`` are
literal, and a box whose braces never close is ignored. ``\\boxed 5`` (no braces) is read up to
the next space or ``$``. correctness = 1 iff that answer is equivalent to the reference after
normalisation (``stabledrl.common.tasks.latex``); format = 1 iff a complete box exists.
``grader: math-verify`` decides correctness as the StableDRL release does instead: Math-Verify over
the whole completion against the record's whole answer text, a worked solution included
(``stabledrl.common.tasks.whole_completion``).

The release's training-set filter (``max_level``, ``max_problem_chars``, ``max_problem_words``)
drops a record before it becomes a row, counted under its reason whatever ``on_bad_row`` says: a
level read as the release reads it (the last word of the ``level`` column as an integer, 5 when
that fails), the problem's length in characters and in whitespace-separated words.

File records: ``prompt`` (the problem), ``answer`` (the final answer, or a worked solution with a
``\\boxed{}``: its last box is the answer and the text is the reference reasoning); optional
``solution`` (a worked solution), ``id``.
"""
from __future__ import annotations

import re
from typing import Any, Iterator, Mapping, Optional

from stabledrl.common.config.task import MATH_TEMPLATE
from stabledrl.common.tasks import whole_completion
from stabledrl.common.tasks.base import TASKS, BadRow, Filtered, Row, Task, record_id, record_text, configured_task
from stabledrl.common.tasks.latex import equivalent

NAME = "math"
DEFAULT_TEMPLATE = MATH_TEMPLATE  # explicit in the config (task.template), so a dry run shows it
_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def boxes(text: str) -> Iterator[str]:
    """Contents of every complete box in ``text``, in order of where each box starts."""
    closing = _matching_braces(text)
    for m in _BOX.finditer(text):
        j = m.end()
        while j < len(text) and text[j] == " ":
            j += 1
        if j < len(text) and text[j] == "{":
            if j in closing:
                yield text[j + 1 : closing[j]]
        elif j > m.end():
            bare = re.match(r"[^\s$]+", text[j:])
            if bare:
                yield bare.group(0)


def _matching_braces(text: str) -> dict[int, int]:
    """Index of each '{' -> index of the '}' closing it, in one pass; a group that never closes is
    absent. Escaped characters (``\\{``, ``\\}``, ``\\\\``) never open or close a group."""
    closing: dict[int, int] = {}
    stack: list[int] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            closing[stack.pop()] = i
        i += 1
    return closing


def find_box(text: str, which: str = "last") -> Optional[str]:
    found = list(boxes(text))
    if not found:
        return None
    return found[-1] if which == "last" else found[0]


def from_record(record: Mapping[str, Any]) -> Row:
    prompt = record_text(record, "prompt")
    raw = record_text(record, "answer")
    solution = record.get("solution")
    solution = str(solution).strip() if solution is not None and str(solution).strip() else None
    if find_box(raw) is not None:
        solution, raw = solution or raw, find_box(raw)
    answer = raw.strip()
    if not answer:
        raise BadRow("answer box is empty")
    if solution is not None and not (find_box(solution) and equivalent(find_box(solution), answer)):
        solution = None  # a solution whose box disagrees is not a usable reference
    meta = {"solution": solution, whole_completion.REFERENCE_TEXT: str(record.get("answer"))}
    return Row(prompt_id=record_id(record, NAME, prompt, answer), prompt=prompt, answer=answer, meta=meta)


def release_level(level: Any) -> int:
    """A MATH record's level as the StableDRL release reads it: the last word of "Level 3" as an
    integer, 5 when there is none or it is no integer."""
    try:
        return int(str(level).split()[-1])
    except (ValueError, IndexError):
        return 5


def filtered(cfg: Any, record: Mapping[str, Any]) -> Optional[Filtered]:
    """Why the training-set filter drops ``record`` (None: it stays)."""
    problem = str(record.get("prompt") or "")
    if cfg.max_level is not None and release_level(record.get("level")) > cfg.max_level:
        return Filtered(f"level {record.get('level')!r} is above max_level={cfg.max_level}", "above_max_level")
    if cfg.max_problem_chars is not None and len(problem) > cfg.max_problem_chars:
        return Filtered(f"problem has {len(problem)} characters, more than max_problem_chars="
                        f"{cfg.max_problem_chars}", "problem_too_long")
    if cfg.max_problem_words is not None and len(problem.split()) > cfg.max_problem_words:
        return Filtered(f"problem has {len(problem.split())} words, more than max_problem_words="
                        f"{cfg.max_problem_words}", "problem_too_long")
    return None


def reference(row: Row) -> str:
    return row.meta.get("solution") or f"The final answer is \\boxed{{{row.answer}}}."


@TASKS.register(NAME)
def build(cfg: Any) -> Task:
    def correctness(completion: str, row: Row) -> float:
        predicted = find_box(completion, cfg.box)
        return float(predicted is not None and equivalent(predicted, row.answer))

    def read(record: Mapping[str, Any]) -> Row:
        dropped = filtered(cfg, record)
        if dropped is not None:
            raise dropped
        return from_record(record)

    def format_score(completion: str, row: Row) -> float:
        return float(find_box(completion) is not None)

    checker = whole_completion.correctness if getattr(cfg, "grader", "latex") == "math-verify" else correctness
    return configured_task(cfg, NAME, DEFAULT_TEMPLATE, ("prompt", "answer"), correctness=checker,
                           format_score=format_score, reference=reference, from_record=read)

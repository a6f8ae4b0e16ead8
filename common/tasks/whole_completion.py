"""The StableDRL release's correctness check: Math-Verify over the whole completion.

The release (its ``dataloaders/math.py``: ``_math_verify_equal``, which ``reward_mixed``,
``reward_gsm8k`` and ``reward_MATH`` call) parses the reference text and the *whole* completion with
Math-Verify's default extraction (LaTeX with ``\\boxed{}`` first, then plain expressions) and calls
``verify(reference, completion, timeout_seconds=5)``; an error counts as wrong. The reference text
is GSM8K's answer after its last ``####``, stripped, and MATH's whole worked solution (Math-Verify
reads its boxed answer). So ``\\boxed{18} dollars, since 9 eggs cost 2 each`` is right for 18, where
the gsm8k checker's last-number rule reads 2; tests/unit/common/test_rewards_release.py holds the
release's decisions on hand cases.

Math-Verify's time limits use SIGALRM, which only the main thread may set: elsewhere (a reward
called from a worker's thread) the check runs without one, as the evaluation graders do.
"""
from __future__ import annotations

import threading

from stabledrl.common.tasks.base import Row

TIMEOUT_S = 5  # the release's timeout_seconds (and Math-Verify's default parsing_timeout)
REFERENCE_TEXT = "reference_text"  # the Row.meta key of the text the release parses as the reference


def math_verify_correct(completion: str, reference_text: str) -> bool:
    """The release's decision: Math-Verify's verify(parse(reference), parse(completion))."""
    from math_verify import parse, verify

    limit = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        gold = parse(str(reference_text), parsing_timeout=limit)
        answer = parse(str(completion), parsing_timeout=limit)
        return bool(verify(gold, answer, timeout_seconds=limit))
    except Exception:  # noqa: BLE001 - the release counts any failure of parsing or comparing as wrong
        return False


def correctness(completion: str, row: Row) -> float:
    """1.0 when the release's check accepts ``completion`` for ``row``'s reference text, else 0.0."""
    return float(math_verify_correct(completion, row.meta.get(REFERENCE_TEXT) or row.answer))

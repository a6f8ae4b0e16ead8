"""The StableDRL release's length guard for boxed answers, a named reward component.

The release adds a second term to its ±1 Math-Verify reward: 1.0 for every completion except a
*short, mostly boxed* one, which gets 0.0: it discourages answering with little more than
``\\boxed{42}``. Set ``task.reward.anti_short_weight: 1.0`` to add it (the StableDRL recipes do); each
step then logs its mean as ``rollout/reward/anti_short``.

The rule, on the completion with its outer whitespace stripped (n = its non-whitespace characters):

- short: n < ``min_chars`` (200);
- mostly boxed: the text is a lone ``\\boxed{...}`` (no ``}`` inside it), optionally wrapped in ``$`` and
  whitespace and followed by closing punctuation (``. ? ! ' "`` and curly quotes), or fewer than
  ``non_boxed_ratio`` (0.85) of the n characters lie outside the ``\\boxed{...}`` spans. A span ends at
  its first ``}``, so ``\\boxed{\\frac{1}{2}}`` leaves ``}`` outside it; the ratio divides by n + 1e-6,
  so an empty completion counts as mostly boxed.

The term is 0.0 when short and mostly boxed, else 1.0. ``tests/unit/common/test_rewards_release.py``
compares it with the release's function on hand-made completions.
"""
from __future__ import annotations

import re

_WS = re.compile(r"\s+")
_LONE_BOXED = re.compile(r"[\s$]*\\boxed\{[^}]*\}[\s$]*[.?!'\"\u201c\u201d\u2019]*\s*")
_BOXED_SPAN = re.compile(r"\\boxed\{.*?\}", re.DOTALL)


def _visible(text: str) -> int:
    return len(_WS.sub("", text))


def anti_short_boxed(completion: str, min_chars: int = 200, non_boxed_ratio: float = 0.85) -> float:
    """1.0, or 0.0 for a completion that is short and mostly a boxed answer (module docstring)."""
    text = completion.strip()
    n = _visible(text)
    if n >= min_chars:
        return 1.0
    if _LONE_BOXED.fullmatch(text):
        return 0.0
    outside = _visible(_BOXED_SPAN.sub("", text))
    return 0.0 if outside / (n + 1e-6) < non_boxed_ratio else 1.0

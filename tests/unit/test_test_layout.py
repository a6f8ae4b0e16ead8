"""The suite's own layout: pytest imports test modules by their basename (no packages under tests/),
so two test files of one name in different folders stop the whole run at collection."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_name():
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)
    assert not [n for n, c in names.items() if c > 1], {n: sorted(str(p.relative_to(TESTS)) for p in
                                                        TESTS.rglob(n)) for n, c in names.items() if c > 1}

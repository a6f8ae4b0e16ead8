"""bench_full_attention's graph_pool part: the prompt lengths it reads from a dataset and the pool
miss rate it computes (an LRU over prompt widths rounded up to the bucket)."""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_full_attention import lru_miss_rate, prompt_lengths  # noqa: E402


def test_lengths_are_the_estimated_tokens_plus_the_template(tmp_path):
    rows = [{"question": "a" * 8}, {"question": "b" * 9}, {"prompt": "é" * 2}]  # 8, 9 and 4 bytes
    plain = tmp_path / "q.jsonl"
    plain.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    packed = tmp_path / "q.jsonl.gz"
    with gzip.open(packed, "wt") as f:
        f.write(plain.read_text())
    for path in (plain, packed):
        lengths, source = prompt_lengths(str(path), 10, prompt=16)
        assert lengths == [12, 13, 11] and "10 template tokens" in source


def test_a_row_without_a_prompt_is_named(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"answer": "4"}) + "\n")
    with pytest.raises(ValueError, match="without a 'question' or 'prompt'"):
        prompt_lengths(str(path), 0, prompt=16)


def test_the_synthetic_spread_spans_several_widths():
    lengths, source = prompt_lengths(None, 0, prompt=16)
    assert min(lengths) >= 8 and max(lengths) <= 64 and "synthetic" in source
    assert len({-(-n // 32) for n in lengths}) == 2


def test_miss_rate_of_an_lru_over_rounded_widths():
    assert lru_miss_rate([40, 50, 60], 2, capacity=1, bucket=32, requests=100) == pytest.approx(0.01)  # one width
    spread = list(range(1, 32 * 4 + 1))  # four widths, drawn at random
    rates = [lru_miss_rate(spread, 1, capacity=c, bucket=32, requests=4000) for c in (1, 2, 3, 4)]
    assert rates[0] == pytest.approx(0.75, abs=0.03)  # a width differs from the last one 3 times in 4
    assert rates[0] > rates[1] > rates[2] > rates[3] and rates[3] == pytest.approx(4 / 4000)

"""MetricsLogger: one JSON line per call (numbers only), TensorBoard events alongside, fresh or appended."""
from __future__ import annotations

import math

import torch

from stabledrl.common.metrics import MetricsLogger, read_metrics


def test_jsonl_records_numbers_and_tensorboard_writes_events(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=True) as log:
        written = log.log(1, {"train/loss": torch.tensor(0.5), "rollout/reward_mean": 1, "note": "text", "x": None})
        log.log(2, {"train/loss": float("nan")})
    assert written == {"train/loss": 0.5, "rollout/reward_mean": 1.0}
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["train/loss"] == 0.5 and "note" not in records[0]
    assert math.isnan(records[1]["train/loss"])
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_a_new_run_starts_the_file_afresh_and_a_resumed_one_appends(tmp_path):
    for append, expected in ((False, [3]), (True, [3, 4])):
        with MetricsLogger(tmp_path, tensorboard=False, append=append) as log:
            log.log(3 if not append else 4, {"a": 1.0})
        assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == expected

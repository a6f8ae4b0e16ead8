"""The behaviour comparison of two runs (tests/helpers/same_metrics.py) sees every non-timing
difference and only those."""
from __future__ import annotations

import json

import same_metrics


def write(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_clocks_and_memory_are_left_out_and_every_other_key_is_compared(tmp_path):
    before = [{"step": 0, "eval/pass@1": 0.5, "eval/time_s": 1.0, "time": 10.0},
              {"step": 1, "train/loss": 0.25, "time/step": 0.4, "perf/samples_per_s": 9.0,
               "learner/peak_rss_gb/rank0": 0.6, "rollout/generate_s": 0.1, "train/nan": float("nan")}]
    after = [{**before[0], "eval/time_s": 2.0, "time": 11.0},
             {**before[1], "time/step": 0.5, "perf/samples_per_s": 8.0, "learner/peak_rss_gb/rank0": 0.7,
              "rollout/generate_s": 0.2, "train/nan": float("nan")}]
    a, b = write(tmp_path / "a.jsonl", before), write(tmp_path / "b.jsonl", after)
    assert same_metrics.main([str(a), str(b)]) == 0
    changed = [before[0], {**after[1], "train/loss": 0.26, "train/new": 1.0}]
    c = write(tmp_path / "c.jsonl", changed)
    assert same_metrics.differences(same_metrics.read(a), same_metrics.read(c)) == [
        "line 2 (step 1): train/new only after", "line 2 (step 1): train/loss 0.25 -> 0.26"]
    assert same_metrics.main([str(a), str(write(tmp_path / "d.jsonl", before[:1]))]) == 1
    assert same_metrics.main([str(a), str(c), "--ignore", "train/", "--ignore", "x"]) == 0  # a family left out
    assert same_metrics.main([str(a), str(c), "--ignore", "train/loss"]) == 1  # train/new still differs

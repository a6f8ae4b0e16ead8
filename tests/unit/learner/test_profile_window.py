"""The learner's profiled step records a short window (its first forwards), not the whole step:
the profiler's slowdown must not eat a job's time budget."""
from __future__ import annotations

import json
import time

import torch

from stabledrl.learner.profile import profiled_step


class Slow(torch.nn.Module):
    """A forward that sleeps ``delays[i]`` seconds on its i-th call."""

    def __init__(self, delays: list[float]) -> None:
        super().__init__()
        self.delays, self.calls = delays, 0
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        time.sleep(self.delays[self.calls])
        self.calls += 1
        return self.linear(x)


def _run(tmp_path, monkeypatch, forwards: str | None, delays: list[float]) -> dict:
    monkeypatch.setenv("STABLEDRL_PROFILE_STEP", "2")
    monkeypatch.setenv("STABLEDRL_PROFILE_DIR", str(tmp_path))
    if forwards is not None:
        monkeypatch.setenv("STABLEDRL_PROFILE_FORWARDS", forwards)
    model = Slow(delays)
    with profiled_step(2, 0, model):
        for _ in delays:
            model(torch.ones(2, 4)).sum().backward()
    return json.loads((tmp_path / "learner_rank0_step2.json").read_text())


def test_the_window_ends_at_the_next_forward_and_the_rest_runs_unprofiled(tmp_path, monkeypatch):
    out = _run(tmp_path, monkeypatch, None, [0.0, 0.3, 0.3])
    assert out["window"] == "first 1 forward(s)" and out["forwards_profiled"] == 1 and out["forwards_in_step"] == 3
    assert out["wall_s"] < 0.25  # the two slow forwards after the window are not in it
    assert out["top_host_ops"]  # the first forward's and backward's ops were recorded


def test_zero_forwards_records_the_whole_step(tmp_path, monkeypatch):
    out = _run(tmp_path, monkeypatch, "0", [0.0, 0.2])
    assert out["window"] == "whole step" and out["forwards_in_step"] == 2 and out["wall_s"] >= 0.2


def test_other_steps_and_ranks_are_not_profiled(tmp_path, monkeypatch):
    monkeypatch.setenv("STABLEDRL_PROFILE_STEP", "2")
    monkeypatch.setenv("STABLEDRL_PROFILE_DIR", str(tmp_path))
    model = Slow([0.0, 0.0])
    with profiled_step(3, 0, model), profiled_step(2, 1, model):
        model(torch.ones(1, 4))
    assert not list(tmp_path.iterdir()) and not model._forward_pre_hooks

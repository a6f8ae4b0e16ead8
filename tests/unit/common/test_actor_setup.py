"""What every actor process sets up, and the GPU memory a colocated actor hands back after its turn."""
from __future__ import annotations

import torch

from stabledrl.common.actor_setup import hand_back_gpu_memory


def test_a_colocated_actor_empties_its_allocators_cache_and_a_lone_one_keeps_it(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    hand_back_gpu_memory(shared=False)
    assert calls == []  # an actor alone on its GPU keeps its cached blocks for its next step
    hand_back_gpu_memory(shared=True)
    assert calls == ["empty_cache"]


def test_on_the_cpu_there_is_nothing_to_hand_back(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: (_ for _ in ()).throw(AssertionError("called")))
    hand_back_gpu_memory(shared=True)

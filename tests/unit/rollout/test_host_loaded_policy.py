"""A rollout worker whose pushes bind its parameters to views of its learner rank's on their GPU
(``weights.ipc: view``) loads its policy on the host (rollout/worker.py ``load_device``), so the GPU
never holds a copy of the worker's own; its engine (rollout/engine.py ``place``) moves to the GPU
what the first push did not bind right after that push, and the whole policy before any other push,
stage, generation or score, so nothing is received into, or runs on, the host by mistake. A worker
on its own device moves nothing.

This machine has no GPU: the engine is told ``cuda:0`` and every move there is recorded instead of
made (the tensor stays on the host). The moves made for real, the views kept where the push bound
them and the GPU memory left at set-up are tests/gpu/test_colocated_views_gpu.py's."""
from __future__ import annotations

import itertools

import pytest
import torch

from stabledrl.common.config.estimator import BlockRandomConfig
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.transport import WeightPushConfig
from stabledrl.common.transport.base import ParameterLoader, WeightHandle
from stabledrl.common.transport.views import ViewPush, segment_name
from stabledrl.common.types import Sample, collate_samples
from stabledrl.rollout.engine import TorchRolloutEngine
from stabledrl.rollout.worker import load_device

GPU, HOST = torch.device("cuda", 0), torch.device("cpu")
VIEW = WeightPushConfig(backend="ipc", ipc="view")


@pytest.fixture
def moves(monkeypatch) -> list[int]:
    """The storage address of every tensor moved to a GPU from now on; the move is not made."""
    moved: list[int] = []
    to = torch.Tensor.to

    def recorded(self, *args, **kwargs):
        if args and isinstance(args[0], torch.device) and args[0].type == "cuda":
            moved.append(self.data_ptr())
            return self
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", recorded)
    return moved


def held(policy) -> list[int]:
    """The storage addresses of every parameter and buffer of ``policy``."""
    return sorted(t.data_ptr() for t in itertools.chain(policy.parameters(), policy.buffers()))


class Binding(ViewPush):
    """A view push as the engine sees it: every parameter counted as bound where it lies (no view on
    a GPU can be made here), with what had moved when it ran."""

    def __init__(self, moved: list[int]) -> None:
        super().__init__(VIEW)
        self.moved, self.moved_before = moved, []

    def receive(self, handle, load) -> int:
        self.moved_before.append(len(self.moved))
        for name, param in load.params.items():
            load.check(name, tuple(param.shape))
        return handle.version


class Copying:
    """Any other push (object store, broadcast, the copying ipc): every parameter copied in, with
    what had moved when it ran."""

    def __init__(self, named: list[tuple[str, torch.Tensor]], moved: list[int]) -> None:
        self.named, self.moved, self.moved_before = named, moved, []

    def receive(self, handle, load) -> int:
        self.moved_before.append(len(self.moved))
        load(self.named)
        return handle.version


def test_a_worker_that_views_on_a_gpu_loads_its_policy_on_the_host():
    assert load_device(GPU, view_weights=True) == HOST
    assert load_device(GPU, view_weights=False) == GPU  # any other push copies into the policy there
    assert load_device(HOST, view_weights=True) == HOST  # a CPU worker loads where it runs anyway


def test_the_first_view_push_binds_the_host_copy_and_the_rest_follows_after_it(moves):
    policy = build_tiny_policy("llada")
    engine = TorchRolloutEngine(policy, device=GPU)
    assert engine.on_host and engine.device == GPU
    push = Binding(moves)
    assert engine.update_weights(push, WeightHandle(1, "ipc")) == 1
    assert push.moved_before == [0], "nothing went to the GPU before the push bound the parameters there"
    assert sorted(moves) == held(policy), "then what it left on the host (here all of it), once each"
    assert not engine.on_host
    engine.update_weights(push, WeightHandle(2, "ipc"))
    assert len(moves) == len(held(policy)), "a later push moves nothing"


@pytest.mark.parametrize("staged", [False, True], ids=["received", "staged"])
def test_any_other_push_moves_the_whole_policy_before_it_receives(moves, staged):
    policy = build_tiny_policy("llada")
    engine = TorchRolloutEngine(policy, device=GPU)
    push = Copying([(n, torch.zeros_like(p)) for n, p in policy.named_parameters()], moves)
    if staged:
        engine.stage_weights(push, WeightHandle(1, "nccl"), keep_order=False, timeout_s=10)
    assert engine.update_weights(push, WeightHandle(1, "nccl")) == 1
    assert push.moved_before == [len(held(policy))] and sorted(moves) == held(policy)
    assert not engine.on_host and all(not p.any() for p in policy.parameters())


def generation(engine: TorchRolloutEngine) -> None:
    out = engine.generate([torch.arange(4, 9)], torch.tensor([0]), SamplerConfig(gen_length=4, block_length=4, steps=2))
    assert out.completion_ids.shape == (1, 4)


def score(engine: TorchRolloutEngine) -> None:
    sample = Sample(sample_id="p/0", prompt_id="p", index=0, prompt_ids=torch.arange(4, 9),
                    completion_ids=torch.arange(9, 13), completion_length=4, reward=0.0)
    batch = collate_samples([sample], engine.pad_token_id)
    assert engine.score(batch, torch.tensor([0]), BlockRandomConfig(block_length=4, num_draws=1)) is not None


@pytest.mark.parametrize("request_", [generation, score], ids=["generate", "score"])
def test_a_request_before_any_push_moves_the_whole_policy_first(moves, request_):
    policy = build_tiny_policy("llada")
    engine = TorchRolloutEngine(policy, device=GPU)
    request_(engine)
    assert sorted(moves) == held(policy) and not engine.on_host


def test_a_worker_on_its_own_device_moves_nothing_and_binds_as_before(moves):
    learner, worker = build_tiny_policy("llada", seed=0), build_tiny_policy("llada", seed=1)
    engine = TorchRolloutEngine(worker, device=HOST)
    assert not engine.on_host
    sender, receiver = ViewPush(VIEW), ViewPush(VIEW)
    try:
        parts = [(n, tuple(p.shape), p.detach()) for n, p in learner.named_parameters()]
        engine.update_weights(receiver, sender.send_views(parts, 1))
        learned = dict(learner.named_parameters())
        for name, p in worker.named_parameters():
            assert segment_name(p) == segment_name(learned[name]) is not None, name  # a view, not a copy
            assert p.storage_offset() == learned[name].storage_offset(), name
    finally:
        receiver.close()
        sender.close()
    assert moves == []


def test_a_view_is_checked_against_the_engines_device_not_where_the_host_copy_lies():
    policy = build_tiny_policy("llada")
    name, param = next(iter(policy.named_parameters()))
    with pytest.raises(ValueError, match=r"on cpu on the learner, torch.float32 on cuda:0 in this worker's model"):
        ParameterLoader(policy, device=GPU).bind(name, param.detach().clone())

"""The same-device push without a copy (``weights.ipc: view``, common/transport/views.py) on the CPU:
the rank's parameters lie in flat buffers as DeepSpeed keeps them, the worker's parameters become
views of those buffers (the same shared-memory segments, nothing copied, its own storage freed),
a step the rank takes in place is what the worker reads next, a push of the same storages binds
nothing again, and a worker that reads while its rank trains fails naming both. ZeRO-3 over several
ranks gathers every parameter into each rank's buffer, which the worker views. (CUDA IPC runs the
same code: tests/gpu/test_ipc_views_gpu.py.)"""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from stabledrl.common.transport import WeightPushConfig, setup_weight_push
from stabledrl.common.transport.base import ParameterLoader
from stabledrl.common.transport.views import ViewPush, segment_name

VIEW = WeightPushConfig(backend="ipc", ipc="view")


def model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.LayerNorm(7), nn.Linear(7, 3, bias=False))


def flatten_like_zero(m: nn.Module) -> list[torch.Tensor]:
    """The module's parameters moved into two flat buffers and pointed at slices of them, as
    DeepSpeed ZeRO-1/2 keeps its bf16 groups (matrices, then the rest), padded between them."""
    groups = [[p for p in m.parameters() if p.dim() >= 2], [p for p in m.parameters() if p.dim() < 2]]
    flats = []
    for params in groups:
        flat = torch.zeros(sum(p.numel() + 3 for p in params))
        offset = 0
        for p in params:
            flat[offset: offset + p.numel()].copy_(p.detach().reshape(-1))
            p.data = flat[offset: offset + p.numel()].view(p.shape)
            offset += p.numel() + 3
        flats.append(flat)
    return flats


def parts(m: nn.Module):
    return [(name, tuple(p.shape), p.detach().reshape(-1)) for name, p in m.named_parameters()]


def receive(receiver: ViewPush, handle, worker: nn.Module) -> None:
    loader = ParameterLoader(worker)
    assert receiver.receive(handle, loader) == handle.version
    loader.finish()


def test_the_workers_parameters_become_views_of_the_ranks_buffers():
    learner, worker = model(0), model(1)
    flats = flatten_like_zero(learner)
    sender, receiver = setup_weight_push(VIEW), ViewPush(VIEW)
    assert isinstance(sender, ViewPush)
    own = weakref.ref(worker[0].weight.data.untyped_storage())
    try:
        handle = sender.send_views(parts(learner), 1)
        assert len(handle.ref["blocks"]) == 1 + 2, "the header and the two flat buffers, each exported once"
        receive(receiver, handle, worker)
        learned = dict(learner.named_parameters())
        for name, p in worker.named_parameters():
            assert torch.equal(p, learned[name]), name
            # the same shared-memory segment and the same place in it: one copy of the weights
            assert segment_name(p) == segment_name(learned[name]) is not None, name
            assert p.storage_offset() == learned[name].storage_offset(), name
        assert {segment_name(f) for f in flats} == {segment_name(p) for p in worker.parameters()}
        gc.collect()
        assert own() is None, "the worker's own copy was freed"

        with torch.no_grad():  # the rank's optimizer step writes its buffers in place
            for f in flats:
                f.mul_(-2.0)
        where = [p.data_ptr() for p in worker.parameters()]
        handle = sender.send_views(parts(learner), 2)
        receive(receiver, handle, worker)
        assert [p.data_ptr() for p in worker.parameters()] == where, "nothing bound again"
        assert all(torch.equal(p, learned[n]) for n, p in worker.named_parameters())
        out = worker(torch.ones(2, 5))
        assert torch.equal(out, learner(torch.ones(2, 5)))
    finally:
        receiver.close()
        sender.close()


def test_a_worker_that_reads_while_its_rank_trains_fails():
    learner, worker = model(0), model(1)
    flatten_like_zero(learner)
    sender, receiver = ViewPush(VIEW), ViewPush(VIEW)
    try:
        receive(receiver, sender.send_views(parts(learner), 3), worker)
        receiver.check_turn(3, "before")  # its turn: the rank holds version 3
        sender.begin_update()
        with pytest.raises(RuntimeError, match="changing its parameters before this worker read version 3"):
            receiver.check_turn(3, "before")
        receive(receiver, sender.send_views(parts(learner), 4), worker)
        receiver.check_turn(4, "after")
        with pytest.raises(RuntimeError, match="holds version 4"):
            receiver.check_turn(3, "after")
        handle = sender.send_views(parts(learner), 5)
        sender.begin_update()  # a push read after its rank began the next step: nothing is bound
        with pytest.raises(RuntimeError, match="changing its parameters before this worker read version 5"):
            receiver.receive(handle, ParameterLoader(worker))
    finally:
        receiver.close()
        sender.close()


def test_a_worker_of_another_dtype_or_a_copy_is_refused():
    learner, worker = model(0), model(1).to(torch.bfloat16)
    flatten_like_zero(learner)
    sender, receiver = ViewPush(VIEW), ViewPush(VIEW)
    try:
        handle = sender.send_views(parts(learner), 1)
        with pytest.raises(ValueError, match="set model.dtype to the learner's parameter dtype"):
            receiver.receive(handle, ParameterLoader(worker))
        with pytest.raises(TypeError, match="not a model"):
            receiver.receive(handle, ParameterLoader({n: p.detach().float() for n, p in worker.named_parameters()}))
        with pytest.raises(RuntimeError, match="cannot bind views"):
            receiver.receive(handle, lambda named: None)
    finally:
        receiver.close()
        sender.close()


def _gather_rank(rank: int, sources: int) -> None:
    """ZeRO-3 rank ``rank`` of ``sources`` (spawned, gloo): its partitions all-gathered into its buffer,
    which a worker's model then views, whole, at two versions."""
    from tests.unit.common.test_sharded_push import full_weights, partitions

    sender = setup_weight_push(VIEW, rank=rank, sources=sources)
    receiver = ViewPush(VIEW)
    worker = {n: nn.Parameter(torch.zeros_like(t), requires_grad=False) for n, t in full_weights(0)}
    for version in (1, 2):
        handle = sender.send_views(iter(partitions(full_weights(version), rank, sources, flat=True)), version)
        assert len(handle.ref["blocks"]) == 1, "one buffer: the header and every parameter gathered"
        loader = ParameterLoader(worker)
        assert receiver.receive(handle, loader) == version
        loader.finish()
        mapped = receiver.map_blocks(handle.ref["blocks"])[0]
        for name, t in full_weights(version):
            assert torch.equal(worker[name], t), (version, name)
            # a view of the rank's buffer as this process maps it: no copy of its own
            assert mapped.data_ptr() <= worker[name].data_ptr() < mapped.data_ptr() + mapped.numel(), name
    receiver.close()
    sender.close()


def test_zero3_ranks_gather_each_parameter_into_the_buffer_the_worker_views():
    from spawned_ranks import run_ranks

    assert run_ranks(_gather_rank, 2) == {0: None, 1: None}

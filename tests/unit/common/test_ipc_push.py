"""The same-device weight push (common/transport/ipc.py) on the CPU, where each block of the buffer
is a POSIX shared-memory block: what a worker loads equals what its learner rank sent, the buffer
is kept across pushes of one layout and grown block by block for another, each tensor is copied
as it arrives, and a buffer that holds another version than
the handle names is refused, not loaded. (CUDA IPC runs the same code with a device buffer:
tests/gpu/test_ipc_push_gpu.py.)"""
from __future__ import annotations

import pytest
import torch

from stabledrl.common.transport import WeightPushConfig, setup_weight_push
from stabledrl.common.transport.ipc import ALIGN, IpcPush
from stabledrl.common.transport.base import ParameterLoader


def weights(seed: int, extra: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {"embed.weight": torch.randn(7, 5, generator=g), "layer.bias": torch.randn(3, generator=g),
           "head.weight": torch.randn(5, 7, generator=g).to(torch.bfloat16)}
    if extra:
        out["extra.weight"] = torch.randn(4, 4, generator=g)
    return out


def receiver_model(like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(v) for k, v in like.items()}


def load(receiver: IpcPush, handle, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    model = receiver_model(like)
    loader = ParameterLoader(model)
    assert receiver.receive(handle, loader) == handle.version
    loader.finish()
    return model


def keys(handle) -> list[str]:
    return [block["key"] for block in handle.ref["blocks"]]


def test_a_worker_loads_exactly_what_its_rank_sent_and_the_buffer_is_kept():
    sender = setup_weight_push(WeightPushConfig(backend="ipc"))
    receiver = IpcPush(WeightPushConfig(backend="ipc"))
    assert isinstance(sender, IpcPush)
    try:
        for version, seed in ((1, 0), (2, 1)):
            sent = weights(seed)
            handle = sender.send(iter(sent.items()), version)
            model = load(receiver, handle, sent)
            assert all(torch.equal(model[k], sent[k]) for k in sent)
            if version == 1:
                first, blocks = keys(handle), list(sender.blocks)
        assert keys(handle) == first and all(a is b for a, b in zip(sender.blocks, blocks, strict=True))
        assert all(offset % ALIGN == 0 for *_, offset in sender.layout)

        grown = weights(2, extra=True)  # another layout: placed in the same buffer, the worker loads it all
        handle = sender.send(iter(grown.items()), 3)
        model = load(receiver, handle, grown)
        assert all(torch.equal(model[k], grown[k]) for k in grown)
    finally:
        receiver.close()
        sender.close()


def test_each_tensor_is_copied_as_it_arrives():
    """A push's tensors are valid only until the next one (ZeRO-3 gathers reuse their buckets):
    the first push, which lays the buffer out, copies each before asking for the next, as later
    pushes do."""
    sent = weights(4)

    def one_scratch_tensor():
        scratch = torch.empty(64)
        for name, t in sent.items():
            view = scratch.view(torch.uint8)[: t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            view.copy_(t)
            yield name, view
            scratch.fill_(float("nan"))  # the source's memory is reused for the next tensor

    sender = IpcPush(WeightPushConfig(backend="ipc"), block_bytes=512)
    receiver = IpcPush(WeightPushConfig(backend="ipc"))
    try:
        for version in (1, 2):
            model = load(receiver, sender.send(one_scratch_tensor(), version), sent)
            assert all(torch.equal(model[k], sent[k]) for k in sent), version
    finally:
        receiver.close()
        sender.close()


def test_blocks_are_filled_first_fit_and_trailing_empty_ones_freed():
    """The buffer grows a block at a time as a push arrives (a tensor larger than a block gets
    one of its own size); a push of fewer tensors frees the blocks left empty at the end, and the
    worker drops its mapping of them."""
    sender = IpcPush(WeightPushConfig(backend="ipc"), block_bytes=512)
    receiver = IpcPush(WeightPushConfig(backend="ipc"))
    g = torch.Generator().manual_seed(5)
    sizes = {"a": 30, "b": 10, "c": 100, "d": 20, "e": 300}  # float32: 120 B, 40 B, 400 B, 80 B, 1200 B
    full = {name: torch.randn(n, generator=g) for name, n in sizes.items()}
    try:
        handle = sender.send(iter(full.items()), 1)
        placed = {name: (block, offset) for name, _, _, block, offset in sender.layout}
        # block 0: header (256) + a (256); b does not fit (512 full): block 1 takes b (256) + d;
        # c (512 aligned) needs a block of its own; e (1280) a block of its own size
        assert placed == {"a": (0, 256), "b": (1, 0), "c": (2, 0), "d": (1, 256), "e": (3, 0)}
        assert [b.numel() for b in sender.blocks] == [512, 512, 512, 1280]
        model = load(receiver, handle, full)
        assert all(torch.equal(model[k], full[k]) for k in full)
        assert len(receiver._mapped) == 4

        fewer = {k: full[k] * 2 for k in ("a", "b", "c")}  # d and e are not pushed: block 3 is left empty
        handle = sender.send(iter(fewer.items()), 2)
        assert len(sender.blocks) == 3 and len(handle.ref["blocks"]) == 3
        model = load(receiver, handle, fewer)
        assert all(torch.equal(model[k], fewer[k]) for k in fewer)
        assert set(receiver._mapped) == set(keys(handle))
    finally:
        receiver.close()
        sender.close()


def test_one_push_comes_from_one_device():
    sender = IpcPush(WeightPushConfig(backend="ipc"))
    try:
        with pytest.raises(ValueError, match="b is on meta, the push's earlier tensors on cpu"):
            sender.send(iter([("a", torch.ones(3)), ("b", torch.ones(3, device="meta"))]), 1)
    finally:
        sender.close()


def test_a_buffer_holding_another_version_is_refused_before_anything_is_loaded():
    sender, receiver = IpcPush(WeightPushConfig(backend="ipc")), IpcPush(WeightPushConfig(backend="ipc"))
    try:
        old = sender.send(iter(weights(0).items()), 4)
        sender.send(iter(weights(1).items()), 5)  # the rank pushed again before the worker read version 4
        model = receiver_model(weights(0))
        with pytest.raises(RuntimeError, match="holds version 5 before this worker read version 4"):
            receiver.receive(old, ParameterLoader(model))
        assert all(not v.any() for v in model.values())
    finally:
        receiver.close()
        sender.close()


def test_a_wire_dtype_is_applied_on_the_sending_side():
    sender, receiver = IpcPush(WeightPushConfig(backend="ipc", dtype="bf16")), IpcPush(WeightPushConfig(backend="ipc"))
    try:
        sent = weights(3)
        handle = sender.send(iter(sent.items()), 1)
        assert {dtype for _, _, dtype, *_ in sender.layout} == {torch.bfloat16}
        got = {}
        receiver.receive(handle, lambda named: got.update({k: v.clone() for k, v in named}))
        assert all(torch.equal(got[k], sent[k].to(torch.bfloat16)) for k in sent)
    finally:
        receiver.close()
        sender.close()


def _partition_rank(rank: int, sources: int, versions) -> None:
    """Learner rank ``rank`` of ``sources`` (a spawned process, gloo): sends every version's ZeRO-3
    partitions through ``send_shards``, then reads its own buffer back as its worker would."""
    from tests.unit.common.test_sharded_push import full_weights, partitions

    sender = setup_weight_push(WeightPushConfig(backend="ipc"), rank=rank, sources=sources)
    receiver = IpcPush(WeightPushConfig(backend="ipc"))
    seen = []
    for version in versions:
        handle = sender.send_shards(iter(partitions(full_weights(version), rank, sources, flat=True)), version)
        seen.append(keys(handle))
        model = {n: torch.zeros_like(t) for n, t in full_weights(0)}
        loader = ParameterLoader(model)
        assert receiver.receive(handle, loader) == version
        loader.finish()
        for name, t in full_weights(version):
            assert torch.equal(model[name], t), (version, name)
    assert len(seen[0]) == 1 and seen[0] == seen[-1], "one layout: one block, kept"
    receiver.close()
    sender.close()


@pytest.mark.parametrize("sources", [2, 3])
def test_zero3_ranks_fill_every_buffer_with_one_all_gather_and_the_worker_puts_parameters_together(sources):
    """ZeRO-3 partitions (element counts not divisible by the ranks, padding that must never reach
    a worker, three dtypes in several rounds): every rank's buffer holds every partition, and the
    worker beside each rank loads exactly the full weights, at every version."""
    from spawned_ranks import run_ranks

    assert run_ranks(_partition_rank, sources, (1, 2)) == {r: None for r in range(sources)}


def test_a_plan_larger_than_the_buffer_is_refused_before_anything_is_loaded():
    from stabledrl.common.transport.shards import encode_plan, plan_rounds
    from stabledrl.common.transport.base import WeightHandle

    sender, receiver = IpcPush(WeightPushConfig(backend="ipc")), IpcPush(WeightPushConfig(backend="ipc"))
    try:
        sent = weights(0)
        handle = sender.send(iter(sent.items()), 1)
        plan = encode_plan(plan_rounds([("big.weight", (65536, 8192), torch.float32)], 2, 1 << 62), 2)
        model = receiver_model(sent)
        with pytest.raises(ValueError, match="the plan needs"):
            receiver.receive(WeightHandle(1, "ipc", {"blocks": handle.ref["blocks"], "plan": plan}),
                             ParameterLoader(model, partial=True))
        assert all(not t.any() for t in model.values())
    finally:
        receiver.close()
        sender.close()

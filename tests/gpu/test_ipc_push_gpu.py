"""The same-device weight push (common/transport/ipc.py) on CUDA: a second process maps the
sender's device buffer (one block, or two) through CUDA IPC and loads exactly what was sent,
across two pushes of one layout (one mapping, the buffer rewritten in place); a handle of a version the buffer no longer
holds is refused. With 2 GPUs: two ZeRO-3 ranks fill both buffers through one NCCL all-gather
(``send_shards``) and the worker on each GPU loads the full weights.

    python -m pytest -q tests/gpu/test_ipc_push_gpu.py     # on the GPU machine
"""
from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from stabledrl.common.transport import WeightPushConfig
from stabledrl.common.transport.ipc import IpcPush

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return {"a.weight": torch.randn(1024, 512, device="cuda", generator=g, dtype=torch.bfloat16),
            "b.bias": torch.randn(77, device="cuda", generator=g)}


def receiver(handles, results) -> None:
    """Another process: load each handle into fresh tensors and report a checksum of each."""
    end = IpcPush(WeightPushConfig(backend="ipc"))
    while True:
        handle = handles.get()
        if handle is None:
            break
        try:
            got: dict[str, torch.Tensor] = {}
            end.receive(handle, lambda named, into=got: into.update({k: v.clone() for k, v in named}))
            results.put({k: float(v.double().sum()) for k, v in got.items()})
        except RuntimeError as e:
            results.put(str(e))
    end.close()


@pytest.mark.parametrize("block_bytes", [None, 4096], ids=["one_block", "two_blocks"])
def test_a_second_process_loads_the_buffer_through_cuda_ipc(block_bytes):
    ctx = mp.get_context("spawn")
    handles, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=receiver, args=(handles, results))
    proc.start()
    sender = IpcPush(WeightPushConfig(backend="ipc"), **({"block_bytes": block_bytes} if block_bytes else {}))
    try:
        for version, seed in ((1, 0), (2, 1)):
            sent = weights(seed)
            handle = sender.send(iter(sent.items()), version)
            blocks = handle.ref["blocks"]
            assert all(b["kind"] == "cuda" for b in blocks) and all(b.is_cuda for b in sender.blocks)
            assert len(blocks) == (2 if block_bytes else 1)  # 4096: a.weight (1 MiB) a block, b.bias the next
            handles.put(handle)
            got = results.get(timeout=120)
            assert got == {k: float(v.double().sum()) for k, v in sent.items()}
        stale = handle
        sender.send(iter(weights(2).items()), 3)
        handles.put(stale)  # version 2's handle, the buffer now holds 3
        assert "holds version 3" in results.get(timeout=120)
    finally:
        handles.put(None)
        proc.join(timeout=60)
        sender.close()


def partition_rank(rank: int, port: int, handles, acks, listener=None) -> None:
    """Learner rank ``rank`` of 2 on cuda:rank (NCCL): its ZeRO-3 partitions of two versions, sent
    with ``send_shards``; each handle goes to the receiver on the same GPU, and the next push
    waits for its receipt (rank and worker take turns)."""
    import torch.distributed as dist

    from ports import join_group
    from tests.unit.common.test_sharded_push import full_weights, partitions

    torch.cuda.set_device(rank)
    join_group("nccl", rank, 2, port, listener)
    sender = IpcPush(WeightPushConfig(backend="ipc"), rank=rank, sources=2)
    for version in (1, 2):
        parts = [(n, s, p.cuda()) for n, s, p in partitions(full_weights(version), rank, 2, flat=True)]
        handles[rank].put(sender.send_shards(iter(parts), version))
        acks[rank].get(timeout=120)
        dist.barrier()  # both workers have read this version before either buffer is rewritten
    handles[rank].put(None)
    sender.close()
    dist.destroy_process_group()


def partition_receiver(rank: int, handles, acks, results) -> None:
    """The worker on cuda:rank: loads each version and reports which weights differ from the full
    ones (names only: tensors sent back through a queue would outlive this process's fd sharer)."""
    from tests.unit.common.test_sharded_push import full_weights

    torch.cuda.set_device(rank)
    end = IpcPush(WeightPushConfig(backend="ipc"))
    while (handle := handles[rank].get()) is not None:
        got: dict[str, torch.Tensor] = {}
        end.receive(handle, lambda named, into=got: into.update({k: v.cpu().clone() for k, v in named}))
        expected = dict(full_weights(handle.version))
        wrong = sorted(set(expected) ^ set(got))
        wrong += [n for n in expected if n in got and not torch.equal(got[n], expected[n])]
        results.put((rank, handle.version, wrong))
        acks[rank].put(handle.version)
    end.close()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_zero3_ranks_fill_both_buffers_through_nccl_and_each_worker_loads_the_full_weights():
    from ports import rendezvous

    ctx = mp.get_context("spawn")
    handles, acks, results = [ctx.Queue(), ctx.Queue()], [ctx.Queue(), ctx.Queue()], ctx.Queue()
    listener, port = rendezvous()
    procs = [ctx.Process(target=partition_rank, args=(r, port, handles, acks) + ((listener,) if r == 0 else ()))
             for r in range(2)]
    procs += [ctx.Process(target=partition_receiver, args=(r, handles, acks, results)) for r in range(2)]
    for p in procs:
        p.start()
    listener.close()  # rank 0 holds its own copy
    try:
        seen = set()
        for _ in range(4):  # 2 receivers x 2 versions
            rank, version, wrong = results.get(timeout=180)
            assert wrong == [], (rank, version, wrong)
            seen.add((rank, version))
        assert seen == {(0, 1), (0, 2), (1, 1), (1, 2)}
    finally:
        for p in procs:
            p.join(timeout=60)

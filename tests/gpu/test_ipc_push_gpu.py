"""The same-device weight push (common/transport/ipc.py) on CUDA: a second process maps the
sender's device buffer through CUDA IPC and loads exactly what was sent, across two pushes of one
layout (one mapping, the buffer rewritten in place); a handle of a version the buffer no longer
holds is refused.

    python -m pytest -q tests/gpu/test_ipc_push_gpu.py     # on the GPU machine
"""
from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from common.transport import WeightPushConfig
from common.transport.ipc import IpcPush

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


def test_a_second_process_loads_the_buffer_through_cuda_ipc():
    ctx = mp.get_context("spawn")
    handles, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=receiver, args=(handles, results))
    proc.start()
    sender = IpcPush(WeightPushConfig(backend="ipc"))
    try:
        for version, seed in ((1, 0), (2, 1)):
            sent = weights(seed)
            handle = sender.send(iter(sent.items()), version)
            assert handle.ref["buffer"]["kind"] == "cuda" and sender.buffer.is_cuda
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

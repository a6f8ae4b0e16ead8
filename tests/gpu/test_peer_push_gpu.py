"""The pull push (``weights.backend: peer``, common/transport/peer.py) across two GPUs, each process
seeing only its own GPU (``CUDA_VISIBLE_DEVICES``, as Ray sets it for every actor): the receiver maps
the sender's device memory through CUDA IPC and loads exactly what was sent, gathered (from the
sender's buffer) and as the partitions of 2 sources (read where they lie in the sources' own
storage), over two versions (the mappings kept); and as a worker takes them, into its staging copy.

With one GPU every end runs on it (the same code, the copies then within the device).

    python -m pytest -q tests/gpu/test_peer_push_gpu.py     # on a machine with 2 GPUs
"""
from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def end(rank: int, world: int, sources: int, port: int, results, staged: bool = False, listener=None) -> None:
    """One end on the one GPU its process sees: a source (rank < max(sources, 1)) or the receiver
    (``staged``: into a worker's staging copy, copied whole per source span and applied after).
    Rank 0 hosts the push's store on ``listener``, the port the test bound for it."""
    import torch

    from stabledrl.common.transport import WeightHandle, WeightPushConfig, setup_weight_push
    from stabledrl.common.transport.staging import StagedWeights
    from stabledrl.common.transport.store import adopt_listener
    from tests.unit.common.test_sharded_push import full_weights, holder, partitions

    try:
        if listener is not None:
            adopt_listener(listener, "127.0.0.1")
        push = setup_weight_push(WeightPushConfig(backend="peer", timeout_s=120), rank=rank, world_size=world,
                                 master_addr="127.0.0.1", master_port=port, sources=sources)
        for version in (1, 2):
            if rank >= max(sources, 1) and staged:
                module = holder(full_weights(0)).cuda()
                copy = StagedWeights(module)
                copy.receive(push, WeightHandle(version, "peer"), keep_order=False, timeout_s=120)
                assert copy.mirrors and not copy.tensors, (len(copy.mirrors), len(copy.tensors))
                copy.apply()
                got = {n: p.detach().cpu() for n, p in module.named_parameters()}
                wrong = [n for n, t in full_weights(version) if not torch.equal(got.get(n, torch.empty(0)), t)]
                results.put(("received", version, wrong, str(torch.cuda.get_device_properties(0).uuid)))
            elif rank >= max(sources, 1):
                got: dict[str, torch.Tensor] = {}
                push.receive(WeightHandle(version, "peer"),
                             lambda named, into=got: into.update({k: v.cpu().clone() for k, v in named}))
                wrong = [n for n, t in full_weights(version) if not torch.equal(got.get(n, torch.empty(0)), t)]
                results.put(("received", version, wrong, str(torch.cuda.get_device_properties(0).uuid)))
            elif sources:  # partitions back to back in one device buffer per dtype, as DeepSpeed keeps them: read
                full = full_weights(version)  # where they lie, each at its offset in that buffer's storage
                with torch.device("cuda"):
                    parts = partitions(full, rank, sources, flat=True)
                assert len({p.untyped_storage().data_ptr() for _, _, p in parts}) < len(parts)
                push.send_shards(iter(parts), version)
                results.put(("sent", version, rank, str(torch.cuda.get_device_properties(0).uuid)))
            else:
                push.send(iter([(n, t.cuda()) for n, t in full_weights(version)]), version)
                results.put(("sent", version, rank, str(torch.cuda.get_device_properties(0).uuid)))
        push.close()
    except BaseException as e:  # noqa: BLE001 - reported to the test
        results.put(("error", repr(e)))


@pytest.mark.parametrize("sources,staged", [(0, False), (2, False), (2, True)])
def test_a_worker_on_another_gpu_pulls_the_ranks_weights(sources, staged):
    from ports import rendezvous

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    (listener, port), first = rendezvous(), max(sources, 1)
    # sources on GPU 0 (both, when 2: the pull reads two buffers of one GPU), the receiver on GPU 1, each
    # process seeing its GPU alone from its start (a spawned child takes the environment it starts with)
    procs = [ctx.Process(target=end, args=(r, first + 1, sources, port, results, staged,
                                           listener if r == 0 else None)) for r in range(first + 1)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        for r, p in enumerate(procs):
            os.environ["CUDA_VISIBLE_DEVICES"] = "1" if r == first and GPUS > 1 else "0"
            p.start()
        listener.close()  # rank 0 holds its own copy
    finally:
        if visible is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
    try:
        got = [results.get(timeout=240) for _ in range(2 * (first + 1))]
    finally:
        for p in procs:
            p.join(timeout=60)
    assert not [g for g in got if g[0] == "error"], got
    received = [g for g in got if g[0] == "received"]
    assert [(v, wrong) for _, v, wrong, _ in received] == [(1, []), (2, [])]
    sent_on = {g[3] for g in got if g[0] == "sent"}
    assert (received[0][3] not in sent_on) == (GPUS > 1)  # the receiver's GPU is not the senders' (one GPU: theirs)

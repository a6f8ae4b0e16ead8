"""The learner's process group: one torch.distributed group over the learner ranks.

Each learner rank is one process (a Ray actor holding one GPU, or a CPU actor in tests). Rank 0
picks the rendezvous address (its node IP and a port it already listens on, bound to that IP
only: common/transport/store.py); the caller (the coordinator) hands that pair to every rank, and
all ranks call ``init_learner_group`` concurrently::

    addr, port = ray.get(rank0.rendezvous_address.remote())
    ray.get([r.init_group.remote(addr, port, rank, world) for rank, r in enumerate(ranks)])

NCCL on CUDA, gloo on CPU. Each actor sees one GPU (Ray sets CUDA_VISIBLE_DEVICES), so its local
device is always ``cuda:0``. The group is never destroyed explicitly: ``destroy_process_group`` at
exit aborted a few percent of CPU runs; process exit releases it.
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from stabledrl.common.transport.store import open_store, reserve_address


def node_ip() -> str:
    """This node's IP as other nodes of the Ray cluster see it (loopback outside Ray)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:  # pragma: no cover - ray is a dependency
        pass
    return "127.0.0.1"


def reserve_port(host: str = "127.0.0.1") -> int:
    """A port this process holds listening on ``host`` until a store it opens there adopts it
    (common/transport/store.py): rank 0 in this process, the other ranks anywhere."""
    return reserve_address(host)[1]


def rendezvous_address() -> tuple[str, int]:
    """What rank 0 hands the caller: (node IP, a port held open on that IP for the store)."""
    return reserve_address(node_ip())


def resolve_backend(backend: str = "auto") -> str:
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise RuntimeError("backend 'nccl' needs CUDA, and this process sees no CUDA device")
    return backend


def local_device() -> torch.device:
    """cuda:<LOCAL_RANK> (0 when Ray gives the actor one GPU) or cpu."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def init_learner_group(
    master_addr: str,
    master_port: int,
    rank: int,
    world_size: int,
    *,
    backend: str = "auto",
    timeout_s: float = 1800.0,
) -> str:
    """Join the learner group as ``rank`` of ``world_size``; returns the backend used.

    Also initialises ``deepspeed.comm`` over the same group (DeepSpeed wraps an existing default
    group instead of creating its own). Fails with the address and the missing size when the
    group does not form within ``timeout_s``.
    """
    backend = resolve_backend(backend)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR=master_addr, MASTER_PORT=str(master_port)
    )
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("LOCAL_SIZE", "1")
    device = local_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _quiet_deepspeed()
    timeout = timedelta(seconds=timeout_s)
    try:  # the store is explicit: rank 0's listens on master_addr only (common/transport/store.py)
        store = open_store(master_addr, master_port, is_master=rank == 0, timeout=timeout, world_size=world_size,
                           wait_for_workers=False)
        dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    except Exception as e:  # torch raises RuntimeError / DistStoreError depending on the release
        raise RuntimeError(
            f"learner group did not form: rank {rank} of {world_size} waited {timeout_s:.0f} s at "
            f"tcp://{master_addr}:{master_port} for the other ranks ({e})"
        ) from e
    import deepspeed

    deepspeed.init_distributed(
        dist_backend=backend, auto_mpi_discovery=False, verbose=False, timeout=timedelta(seconds=timeout_s)
    )
    return backend


def _quiet_deepspeed() -> None:
    """Skip DeepSpeed's shared-memory comm op on CPU (a 28 s C++ build we do not need) and keep
    its INFO logging out of the run's output."""
    import logging

    import deepspeed
    import deepspeed.ops

    if not torch.cuda.is_available():
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)

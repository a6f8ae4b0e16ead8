"""Weight transport between the learner and the rollout workers (runs inside both kinds of actor).

``base``: the interface (config, handle, ``WeightPush``, ``ParameterLoader``); ``object_store``,
``broadcast``, ``ipc`` and ``peer``: the transports; ``setup_weight_push`` (here) builds this
process's end of one of them from a resolved config.
"""
from __future__ import annotations

from typing import Optional, Sequence

from stabledrl.common.transport.base import ParameterLoader, WeightHandle, WeightPush, WeightPushConfig
from stabledrl.common.transport.broadcast import BroadcastPush
from stabledrl.common.transport.object_store import ObjectStorePush
from stabledrl.common.transport.ipc import IpcPush
from stabledrl.common.transport.peer import PeerPush
from stabledrl.common.transport.views import ViewPush


def setup_weight_push(
    cfg: WeightPushConfig,
    *,
    rank: int = 0,
    world_size: int = 1,
    master_addr: Optional[str] = None,
    master_port: Optional[int] = None,
    peer_names: Optional[Sequence[str]] = None,
    sources: int = 0,
) -> WeightPush:
    """Build this process's end of the push. ``cfg.backend`` must be resolved (``plan_push``: common/transport/plan.py).
    Object store: no arguments needed. ipc (a worker beside its learner rank, common/transport/ipc.py;
    ``weights.ipc: view``, common/transport/views.py): none either, or ``rank`` and ``sources`` for a
    learner rank that sends its ZeRO-3 partitions.
    Broadcast and peer: ``rank`` 0 is learner rank 0, ranks 1..world_size-1
    the rollout workers; (master_addr, master_port) is a free address on learner rank 0's node,
    where rank 0 hosts the group's TCPStore; ``peer_names`` (rank 0 only) names receivers 1.. in errors.
    ``sources`` S >= 1: the sharded push (common/transport/shards.py): ranks 0..S-1 are the learner ranks that send
    their partitions (``send_shards``), the receivers ranks S..world_size-1."""
    if cfg.backend == "auto":
        raise ValueError("weights.backend 'auto' must be resolved against the cluster first (plan_push)")
    if cfg.backend == "object_store":
        return ObjectStorePush(cfg)
    if cfg.backend == "ipc" and cfg.ipc == "view":  # the worker views its rank's parameters (views.py)
        return ViewPush(cfg, rank=rank, sources=sources)
    if cfg.backend == "ipc":  # copy (an unresolved auto too: only the job's config knows whether views can be)
        return IpcPush(cfg, rank=rank, sources=sources)
    if master_addr is None or master_port is None:
        raise ValueError(f"the {cfg.backend} weight push needs master_addr and master_port (learner rank 0's node)")
    if cfg.backend == "peer":  # every worker pulls from the learner ranks' memory (common/transport/peer.py)
        return PeerPush(cfg, rank, world_size, master_addr, master_port, peer_names, sources)
    return BroadcastPush(cfg, cfg.backend, rank, world_size, master_addr, master_port, peer_names, sources)


__all__ = ["ParameterLoader", "WeightHandle", "WeightPush", "WeightPushConfig", "setup_weight_push"]

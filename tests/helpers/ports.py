"""Rendezvous for tests whose ranks run in processes of their own: the test binds the port (the OS
picks it, and from then on it is listening: no other process can take it) and hands the socket to
rank 0, which hosts the store on it (common/transport/store.py ``adopt_listener``). A port chosen
free and bound later by rank 0 was taken in between on a machine busy with other jobs."""
from __future__ import annotations

import socket
from datetime import timedelta
from typing import Optional

HOST = "127.0.0.1"


def rendezvous() -> tuple[socket.socket, int]:
    """(the listening socket to hand to rank 0, its port for every rank)."""
    from stabledrl.common.transport.store import listening_socket

    sock = listening_socket(HOST)
    return sock, int(sock.getsockname()[1])


def join_group(backend: str, rank: int, world: int, port: int, listener: Optional[socket.socket] = None,
               timeout_s: float = 120.0) -> None:
    """torch.distributed's default group over the store at ``port``; rank 0 passes ``listener``."""
    import torch.distributed as dist

    from stabledrl.common.transport.store import adopt_listener, open_store

    if listener is not None:
        adopt_listener(listener, HOST)
    store = open_store(HOST, port, is_master=rank == 0, timeout=timedelta(seconds=timeout_s), world_size=world)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))

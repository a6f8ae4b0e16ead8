"""The port of a store is bound where the OS picks it, then published: no other process can take it
between the choice and the store's start. Finding: on a machine busy with other jobs a fresh
clone's `make test` failed the push benchmark with "could not reach the store of learner rank 0 ...
[Errno 98] Address already in use": its ports were chosen free, closed, and bound again later.
Here other sockets hold ports busy and take the published one the moment they can, while pushes
set up over it (gloo, two ranks as two threads of this process)."""
from __future__ import annotations

import errno
import socket

import pytest
import torch

from stabledrl.common.transport import WeightHandle, WeightPushConfig
from stabledrl.learner.group import reserve_port
from thread_push import sending_thread

torch.set_num_threads(1)


def take(port: int) -> socket.socket:
    """A socket of another job bound to ``port`` (OSError when the port is held)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


def push_once(port: int, version: int) -> dict[str, torch.Tensor]:
    """One push of two tensors from rank 0 (a thread) to rank 1 over the store at ``port``."""
    cfg = WeightPushConfig(backend="gloo", timeout_s=60)
    source = [("a", torch.arange(6.0) * version), ("b", torch.ones(3, 2) + version)]
    received: dict[str, torch.Tensor] = {}
    with sending_thread(cfg, port, source, (version,)) as push:
        push.receive(WeightHandle(version, "gloo"), lambda items: received.update({n: t.clone() for n, t in items}))
    assert all(torch.equal(received[n], t) for n, t in source)
    return received


def test_pushes_set_up_while_other_sockets_hold_ports_and_grab_the_published_one():
    busy = [socket.create_server(("127.0.0.1", 0)) for _ in range(200)]  # other jobs' listeners
    try:
        for version in range(1, 4):
            port = reserve_port()
            for host in ("127.0.0.1", "0.0.0.0"):  # taken at once, before the store starts: refused
                with pytest.raises(OSError) as taken:
                    busy.append(take(port) if host == "127.0.0.1" else socket.create_server((host, port)))
                assert taken.value.errno == errno.EADDRINUSE
            assert len(push_once(port, version)) == 2
    finally:
        for sock in busy:
            sock.close()

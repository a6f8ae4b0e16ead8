"""The runtime's small helpers that need no cluster: how an actor's error becomes one line of a
job's message, and how a loop that hears nothing tells a gone Ray head from a quiet one."""
from __future__ import annotations

import socket

from coordinator.actors import first_line
from coordinator.runtime import gcs_alive


def test_an_error_becomes_its_first_line_cut_between_words():
    error = RuntimeError("learner rank 0 of 2: the step at version 3 failed; a collective that ends after "
                         "learner.dist_timeout_s = 120 s means another rank stalled or died (RuntimeError: gloo)\n"
                         "Traceback (most recent call last):\n  File ...")
    assert first_line(error) == str(error).splitlines()[0]
    cut = first_line(error, limit=90)
    assert cut.endswith(" …") and len(cut) <= 92 and "=." not in cut and not cut[:-2].endswith("=")
    assert str(error).startswith(cut[:-2])
    assert first_line(RuntimeError("")) == "RuntimeError"


def test_the_gcs_probe_tells_a_listening_head_from_a_gone_one():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    address = f"127.0.0.1:{server.getsockname()[1]}"
    assert gcs_alive(address)
    server.close()
    assert not gcs_alive(address)

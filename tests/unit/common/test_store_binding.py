"""The learner group's and the weight push's TCPStores listen on the ranks' address only, and what
comes through them is parsed as data: a two-rank learner group plus a broadcast push, with the
listening sockets of both processes read from ``ss -ltnp`` while they are up."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import shutil
import subprocess

import pytest
import torch

from stabledrl.common.transport.store import decode_meta, encode_meta, open_store, reserve_address

WILDCARD = re.compile(r"^(0\.0\.0\.0|\*|\[::\]|::):\d+$")


def listeners(pids: set[int]) -> list[str]:
    """'address:port' of every TCP socket listening in one of ``pids`` (ss -ltnp)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            found.append(line.split()[3])
    return found


def member(rank: int, addresses, up, done) -> None:
    """Rank ``rank`` of a 2-rank learner group (gloo) and of a 2-member broadcast push."""
    os.environ["OMP_NUM_THREADS"] = "1"
    from stabledrl.common.transport import WeightHandle, WeightPushConfig, setup_weight_push
    from stabledrl.learner.group import init_learner_group, rendezvous_address

    if rank == 0:
        group, push = rendezvous_address(), rendezvous_address()
        for _ in range(2):
            addresses.put((group, push))
    (host, port), (push_host, push_port) = addresses.get() if rank else (group, push)
    init_learner_group(host, port, rank, 2, backend="gloo", timeout_s=60)
    channel = setup_weight_push(WeightPushConfig(backend="gloo", timeout_s=60), rank=rank, world_size=2,
                                master_addr=push_host, master_port=push_port)
    weights = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)}
    if rank == 0:
        channel.send(iter(weights.items()), 1)
    else:
        got = {}
        channel.receive(WeightHandle(1, "gloo"), lambda pairs: got.update({n: t.clone() for n, t in pairs}))
        assert all(torch.equal(got[n], t) for n, t in weights.items())
    up.put(rank)
    done.wait(120)


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_no_store_or_group_listens_on_every_interface():
    ctx = mp.get_context("spawn")
    addresses, up, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=member, args=(r, addresses, up, done), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        assert sorted(up.get(timeout=240) for _ in procs) == [0, 1], "the group or the push failed"
        found = listeners({p.pid for p in procs})
        print("listening:", found)
        assert len(found) >= 2, found  # the two stores at least
        assert not [a for a in found if WILDCARD.match(a)], f"listening on every interface: {found}"
    finally:
        done.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0]


def test_a_store_master_listens_only_where_it_was_reserved():
    from datetime import timedelta

    host, port = reserve_address("127.0.0.1")
    store = open_store(host, port, is_master=True, timeout=timedelta(seconds=10))
    client = open_store(host, port, is_master=False, timeout=timedelta(seconds=10))
    client.set("k", b"v")
    assert store.get("k") == b"v"
    if shutil.which("ss"):
        assert listeners({os.getpid()}) == [f"127.0.0.1:{port}"]


def test_metadata_is_parsed_strictly():
    entries = [("layer.w", torch.bfloat16, (2, 3), 0), ("layer.b", torch.float32, (3,), 16)]
    assert decode_meta(encode_meta(entries, 28), "bucket 0") == (entries, 28)
    assert decode_meta(encode_meta(None), "end") is None
    bad = {
        "is not JSON": b"\x80\x04\x95 a pickle",
        "must be": json.dumps({"entries": []}).encode(),
        "malformed entry": json.dumps([[["w", "object", [1], 0]], 8]).encode(),  # no tensor dtype
        "does not fit": json.dumps([[["w", "float32", [100], 0]], 8]).encode(),  # outside the bucket
        "at offset 2": json.dumps([[["w", "float32", [1], 2]], 8]).encode(),  # misaligned
    }
    for words, data in bad.items():
        with pytest.raises(ValueError, match=rf"bucket 3: .*{words}"):
            decode_meta(data, "bucket 3")
    with pytest.raises(ValueError, match="at most"):
        decode_meta(b" " * (17 << 20), "bucket 3")

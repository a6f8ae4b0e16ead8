"""The collective weight push with two alternating bucket buffers (common/transport/broadcast.py):
many small buckets and a tensor larger than a bucket arrive bit for bit (gloo, two ranks as two
threads of this process), and the packer never refills a buffer before its broadcast is done."""
from __future__ import annotations

import torch

from stabledrl.common.transport.broadcast import _Packer, _unpack
from stabledrl.common.transport import WeightHandle, WeightPushConfig
from stabledrl.learner.group import reserve_port
from thread_push import sending_thread

torch.set_num_threads(1)


def tensors(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (300,), (3, 3), (1000,), (2, 40), (64,), (1,), (13, 3), (250,), (100, 2), (77,), (5, 9)] * 2
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float32, torch.bfloat16, torch.float32,
              torch.float64, torch.int64, torch.float32, torch.bfloat16, torch.float64, torch.float16] * 2
    out = []  # 4000 bytes of (1000,) fp32 exceed a 2 KiB bucket: it travels alone
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        t = torch.randn(shape, generator=g) * 100
        out.append((f"w{i}", t.to(dtype)))
    return out


class FakeWork:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def wait(self, *args) -> None:
        self.log.append(("wait", self.name))


def test_packer_alternates_buffers_and_waits_before_refilling_one():
    log: list = []
    packer = _Packer(2048, torch.device("cpu"), None)
    seen = []
    for i, (entries, payload) in enumerate(packer.buckets(iter(tensors(0)))):
        from_buffer = any(payload.data_ptr() == b.data_ptr() for b in packer.buffers)
        seen.append((i, from_buffer, packer.lent))
        log.append(("post", i))
        assert packer.sent(FakeWork(log, f"b{i}")) == from_buffer
        for name, t in _unpack(payload.clone(), entries):  # the bucket holds the tensors bit for bit
            assert torch.equal(t, dict(tensors(0))[name])
    buffered = [i for i, from_buffer, _ in seen if from_buffer]
    assert len(buffered) >= 4 and any(not f for _, f, _ in seen)  # several buckets, one tensor sent alone
    lent = [k for _, f, k in seen if f]
    assert all(a != b for a, b in zip(lent, lent[1:]))  # consecutive buckets use the other buffer
    # buffer k is refilled only after the broadcast that last read it was waited for
    for j, i in enumerate(buffered[2:], start=2):
        previous = buffered[j - 2]
        assert log.index(("wait", f"b{previous}")) < log.index(("post", i))


def test_gloo_push_of_many_buckets_is_bit_identical():
    cfg = WeightPushConfig(backend="gloo", timeout_s=60, bucket_mb=2048 / 2**20)
    port = reserve_port()
    source = tensors(1)
    received: dict[str, torch.Tensor] = {}
    with sending_thread(cfg, port, source, (1, 2)) as push:
        for version in (1, 2):
            received.clear()
            assert push.receive(WeightHandle(version, "gloo"),
                                lambda items: received.update({n: t.clone() for n, t in items})) == version
            assert set(received) == {n for n, _ in source}
            for name, t in source:
                assert received[name].dtype == t.dtype and torch.equal(received[name], t)

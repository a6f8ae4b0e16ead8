"""The CUDA paths of the background checkpoint writer and of weight staging (one GPU, seconds):
the writer copies device state into its reserved host memory on a stream of its own, after the
update that produced it, so the snapshot is the state at the save even while later kernels change
it; a push staged into a CUDA copy on a side stream lands whole and reaches the parameters only at
``apply``.

    python -m pytest -q -m gpu tests/gpu/test_async_paths_gpu.py
"""
from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from stabledrl.common.transport import WeightHandle, WeightPushConfig, setup_weight_push
from stabledrl.common.transport.staging import StagedWeights
from stabledrl.learner.async_checkpoint import marker_name
from stabledrl.learner.group import reserve_port

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("pinned", [True, False])
def test_the_process_writer_snapshots_a_device_state_at_the_save_and_at_the_links_speed(tmp_path, pinned):
    """learner/checkpoint_process.py: the reserved memory page-locked (a DMA per storage) or not
    (the double-buffered bounce); the copy is exact, taken after the update that produced the state
    and before the next one changes it; its speed is printed (the step after a save waits for it
    if it outlasts the next forward and backward)."""
    from stabledrl.learner.checkpoint_process import ProcessWriter, storages_nbytes

    dev = torch.device("cuda", 0)
    g = torch.Generator(device=dev).manual_seed(0)
    master = torch.rand(300 << 20, device=dev, generator=g)  # 1.2 GB fp32
    state = {"master": master, "view": master[5:10],
             "moment": torch.rand((5 << 20) + 3, device=dev, generator=g).to(torch.bfloat16)}
    expected = {k: v.cpu() for k, v in state.items()}
    writer = ProcessWriter(True, pin=pinned)  # pin=False: as where cudaHostRegister refuses
    try:
        writer.reserve(storages_nbytes(state))
        assert writer.reserved.wait(120) and writer.arena is not None
        assert writer.arena.pinned == pinned
        master.add_(0.0)  # still queued on the default stream when the save starts
        writer.save(state, str(tmp_path / "a.pt"))
        writer.start(str(tmp_path / marker_name(0)))
        writer.wait_snapshot()
        master.mul_(7.0)  # the next update
        assert writer.wait_written(timeout_s=300)
        nbytes = storages_nbytes(state)
        print(f"process writer snapshot ({'page-locked' if pinned else 'bounce'}): {nbytes / 2**30:.2f} GiB in "
              f"{writer.snapshot_s:.2f} s ({nbytes / writer.snapshot_s / 1e9:.1f} GB/s)")
        saved = torch.load(tmp_path / "a.pt")
        assert all(torch.equal(saved[k], expected[k]) for k in state)
        assert saved["view"].untyped_storage().data_ptr() == saved["master"].untyped_storage().data_ptr()
    finally:
        writer.close()


def test_a_push_staged_into_cuda_lands_whole_at_apply():
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    receiver = nn.Sequential(nn.Linear(256, 512), nn.Linear(512, 64)).to(dev)
    before = {n: p.detach().clone() for n, p in receiver.named_parameters()}
    source = {n: torch.randn(p.shape) for n, p in receiver.named_parameters()}
    cfg = WeightPushConfig(backend="gloo", timeout_s=60, bucket_mb=0.25)
    port = reserve_port()
    errors: list[BaseException] = []

    def sender() -> None:
        try:
            setup_weight_push(cfg, rank=0, world_size=2, master_addr="127.0.0.1", master_port=port).send(
                iter(source.items()), 1)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    push = setup_weight_push(cfg, rank=1, world_size=2, master_addr="127.0.0.1", master_port=port)
    staged = StagedWeights(receiver)
    assert staged.receive(push, WeightHandle(1, "gloo"), keep_order=True, timeout_s=60) == 1
    thread.join(60)
    assert not errors and staged.stream is not None
    assert all(torch.equal(p.detach(), before[n]) for n, p in receiver.named_parameters())
    assert staged.apply() == 1
    assert all(torch.equal(p.detach().cpu(), source[n]) for n, p in receiver.named_parameters())

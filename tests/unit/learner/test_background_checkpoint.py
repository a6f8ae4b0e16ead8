"""Checkpoints off the training path (learner/async_checkpoint.py): the snapshot is the state at the
save (views and shared storage kept), the writer's phases are in order (snapshot, files, marker),
a failed write leaves an error marker, and on a real ZeRO-3 engine a step right after a save is
not delayed by a slow write while the checkpoint still restores the weights of the save."""
from __future__ import annotations

import json
import multiprocessing as mp
import time
from collections import OrderedDict
from pathlib import Path

import torch

from stabledrl.learner.async_checkpoint import BackgroundWriter, HostBounce, marker_name, snapshot

torch.set_num_threads(1)


def test_snapshot_is_the_state_at_the_save_with_shared_storage_kept():
    base = torch.arange(12.0)
    state = OrderedDict(a=base[2:5], b=base.view(3, 4), nested={"c": [torch.ones(2, dtype=torch.bfloat16)]}, s="x")
    snap = snapshot(state)
    base.add_(100.0)  # the update after the save
    assert isinstance(snap, OrderedDict) and snap["s"] == "x"
    assert torch.equal(snap["a"], torch.tensor([2.0, 3.0, 4.0]))
    assert torch.equal(snap["b"], torch.arange(12.0).view(3, 4))
    assert snap["a"].untyped_storage().data_ptr() == snap["b"].untyped_storage().data_ptr()  # one copy
    assert snap["nested"]["c"][0].dtype == torch.bfloat16


def test_a_snapshot_through_a_small_bounce_buffer_copies_every_chunk_in_place():
    base = torch.randn(1000)  # 4000 bytes: 5 chunks of 999 bytes and one of 4
    other = torch.arange(7, dtype=torch.int16)
    state = {"w": base.view(10, 100), "tail": base[997:], "other": other}
    bounce = HostBounce(chunk_bytes=999)
    snap = snapshot(state, bounce=bounce)
    expected = base.clone()
    base.zero_()
    assert torch.equal(snap["w"].flatten(), expected)
    assert torch.equal(snap["tail"], expected[997:])
    assert torch.equal(snap["other"], torch.arange(7, dtype=torch.int16))
    assert snap["w"].untyped_storage().data_ptr() == snap["tail"].untyped_storage().data_ptr()
    assert bounce.buffer.numel() == 999  # one buffer, reused for every chunk and tensor


def slow_write(delay_s: float, log: list):
    def write(state, path, zipfile_serialization):
        log.append(("write start", Path(path).name, time.monotonic()))
        time.sleep(delay_s)
        torch.save(state, path)
        log.append(("write end", Path(path).name, time.monotonic()))
    return write


def test_writer_phases_and_the_marker(tmp_path):
    log: list = []
    writer = BackgroundWriter(True, write=slow_write(0.5, log))
    writer.save({"w": torch.ones(3)}, str(tmp_path / "a.pt"))
    writer.save({"w": torch.zeros(3)}, str(tmp_path / "b.pt"))
    t0 = time.monotonic()
    writer.start(str(tmp_path / marker_name(0)), written=[])
    writer.wait_snapshot()
    assert time.monotonic() - t0 < 0.4  # the copy, not the writes
    assert not (tmp_path / marker_name(0)).exists()
    assert writer.wait_written(timeout_s=10)
    marker = json.loads((tmp_path / marker_name(0)).read_text())
    assert set(marker["files"]) == {"a.pt", "b.pt"}
    assert marker["files"]["a.pt"] == (tmp_path / "a.pt").stat().st_size
    assert torch.equal(torch.load(tmp_path / "b.pt")["w"], torch.zeros(3))


def test_a_failed_write_leaves_an_error_marker_and_raises(tmp_path):
    def failing(state, path, zipfile_serialization):
        raise OSError("No space left on device")

    writer = BackgroundWriter(True, write=failing)
    writer.save({"w": torch.ones(1)}, str(tmp_path / "a.pt"))
    writer.start(str(tmp_path / marker_name(1)))
    try:
        writer.wait_written(timeout_s=10)
        raise AssertionError("the write's error was not raised")
    except RuntimeError as e:
        assert "No space left" in str(e)
    assert "No space left" in json.loads((tmp_path / marker_name(1)).read_text())["error"]


# ---- a real ZeRO-3 engine (one gloo rank, in a process of its own) ----------------------------
def _engine_run(directory: str, delay_s: float, out) -> None:
    from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, OptimizerConfig
    from stabledrl.common.models.presets import build_tiny_policy
    from stabledrl.learner.engine import LearnerEngine
    from stabledrl.learner.group import reserve_port, init_learner_group

    torch.set_num_threads(1)
    init_learner_group("127.0.0.1", reserve_port(), 0, 1, backend="gloo", timeout_s=60)
    cfg = LearnerConfig(optimizer=OptimizerConfig(lr=1e-2, eps=1e-3),
                        deepspeed=DeepSpeedConfig(zero_stage=3, dtype="fp32", param_persistence_threshold=0))
    engine = LearnerEngine(build_tiny_policy("llada", vocab_size=97, seed=0), cfg)

    def loss_fn(model, ids):
        logits = model(ids).logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()), {}

    batch = [torch.randint(4, 97, (2, 8), generator=torch.Generator().manual_seed(k)) for k in range(2)]
    timings = []
    for _ in range(2):
        t0 = time.perf_counter()
        engine.train_step(batch, loss_fn)
        timings.append(time.perf_counter() - t0)
    saved = engine.state_dict_for_push()
    log: list = []
    engine.writer = BackgroundWriter(True, write=slow_write(delay_s, log))
    t0 = time.perf_counter()
    engine.save_checkpoint_async(directory, {"step": 2}, tag="step2")
    save_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine.train_step(batch, loss_fn)  # changes the weights while the files are written
    after_s = time.perf_counter() - t0
    marker_during = (Path(directory) / "step2" / marker_name(0)).exists()
    written = engine.checkpoint_written(timeout_s=None)
    changed = any(not torch.equal(t, saved[n]) for n, t in engine.state_dict_for_push().items())
    from stabledrl.coordinator.runtime.checkpoint import ( # what the coordinator adds once the marker is there
        FORMAT, write_state,
    )

    write_state(Path(directory) / "step2", {"format": FORMAT, "step": 2, "config": {}, "parameter_shapes": {}})
    client = engine.load_checkpoint(directory, tag="step2")
    restored = all(torch.equal(t, saved[n]) for n, t in engine.state_dict_for_push().items())
    out.put({"plain_s": max(timings[1:]), "save_s": save_s, "after_s": after_s, "marker_during": marker_during,
             "written": written, "changed": changed, "restored": restored, "client": client,
             "writes": len([e for e in log if e[0] == "write end"])})


def test_a_step_after_a_save_does_not_wait_for_the_write_and_the_save_restores(tmp_path):
    delay = 4.0
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_engine_run, args=(str(tmp_path / "ckpt"), delay, out))
    proc.start()
    result = out.get(timeout=240)
    proc.join(60)
    assert result["writes"] >= 2  # model states and optimizer states, each slowed by `delay`
    assert result["save_s"] < delay and result["after_s"] < delay  # neither waited for a write
    assert not result["marker_during"] and result["written"]
    assert result["changed"] and result["restored"] and result["client"] == {"step": 2}

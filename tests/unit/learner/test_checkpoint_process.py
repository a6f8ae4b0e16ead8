"""The writer of background checkpoints (learner/checkpoint_process.py): the files hold the state
at the save (views, shared storage, parameters kept), the pickling and writing run in a child
process, the training thread gets its state back (``wait_snapshot``) and runs on while the child is
held before its write, the child dies with its learner before it leaves a marker, the reserved host
memory holds a real ZeRO-3 engine's state, and a config that still chooses a writer (the option is
gone) is refused, naming the field."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import yaml

from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.job import load_job_config
from stabledrl.learner.async_checkpoint import CheckpointWriteError, marker_name
from stabledrl.learner.checkpoint_process import ProcessWriter, storages_nbytes

ROOT = Path(__file__).resolve().parents[3]


class WhoPickles:
    """Records, in ``log``, the process id of every pickling of it (torch.save pickles it in the
    process that writes the file)."""

    def __init__(self, log: str) -> None:
        self.log = log

    def __reduce__(self):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return WhoPickles, (self.log,)


def test_the_files_hold_the_state_at_the_save_and_a_child_process_writes_them(tmp_path):
    base = torch.arange(12.0)
    state = OrderedDict(a=base[2:5], b=base.view(3, 4), p=torch.nn.Parameter(torch.ones(3)), empty=torch.empty(0),
                        nested={"c": [torch.ones(2, dtype=torch.bfloat16)], "s": "x"},
                        who=WhoPickles(str(tmp_path / "who")))
    writer = ProcessWriter(True)
    try:
        writer.save(state, str(tmp_path / "a.pt"))
        writer.save({"z": base}, str(tmp_path / "b.pt"))
        writer.start(str(tmp_path / marker_name(0)), written=[])
        writer.wait_snapshot()
        base.add_(100.0)  # the update after the save
        assert writer.wait_written(timeout_s=120)
        got = torch.load(tmp_path / "a.pt", weights_only=False)
        assert torch.equal(got["a"], torch.tensor([2.0, 3.0, 4.0]))
        assert torch.equal(got["b"], torch.arange(12.0).view(3, 4))
        assert got["a"].untyped_storage().data_ptr() == got["b"].untyped_storage().data_ptr()  # one storage
        assert isinstance(got["p"], torch.nn.Parameter) and got["p"].requires_grad
        assert got["empty"].numel() == 0 and got["nested"]["c"][0].dtype == torch.bfloat16
        assert got["nested"]["s"] == "x"
        assert torch.equal(torch.load(tmp_path / "b.pt")["z"], torch.arange(12.0))
        marker = json.loads((tmp_path / marker_name(0)).read_text())
        assert marker["files"] == {n: (tmp_path / n).stat().st_size for n in ("a.pt", "b.pt")}
        pids = [int(line) for line in (tmp_path / "who").read_text().split()]
        # the learner pickles the state's structure once (tensors as places); torch.save pickles in the child
        assert pids[0] == os.getpid() and pids[-1] == writer.child.pid != os.getpid()
        # a larger state makes the reserved memory grow; the same child writes it
        big = {"w": torch.randn(300_000)}
        writer.save(big, str(tmp_path / "c.pt"))
        writer.start(str(tmp_path / "m2"))
        assert writer.wait_written(timeout_s=120) and writer.arena.nbytes >= storages_nbytes(big)
        assert torch.equal(torch.load(tmp_path / "c.pt")["w"], big["w"])
    finally:
        writer.close()


def test_the_training_thread_goes_on_while_the_child_is_held_in_its_write(tmp_path):
    """The child is stopped (SIGSTOP) before the save: the training thread still gets its state
    back, changes it and runs on; once the child continues, the file holds the state at the save."""
    path = tmp_path / "optim_states.pt"
    weights = torch.randn(1 << 20)  # 4 MB
    expected = weights.clone()
    writer = ProcessWriter(True)
    try:
        writer.reserve(storages_nbytes({"w": weights}))
        assert writer.reserved.wait(120)
        os.kill(writer.child.pid, signal.SIGSTOP)
        writer.save({"w": weights}, str(path))
        t0 = time.monotonic()
        writer.start(str(tmp_path / marker_name(0)))
        writer.wait_snapshot()
        waited = time.monotonic() - t0
        weights.mul_(-1.0)  # the optimizer step
        ticks = 0  # the training thread runs Python freely while the child cannot write
        for _ in range(200_000):
            ticks += 1
        assert not writer.wait_written(timeout_s=0.5) and not (tmp_path / marker_name(0)).exists()
        assert waited < 30 and ticks == 200_000 and not path.exists()
        os.kill(writer.child.pid, signal.SIGCONT)
        assert writer.wait_written(timeout_s=120)
        assert torch.equal(torch.load(path)["w"], expected)  # the state at the save
        assert json.loads((tmp_path / marker_name(0)).read_text())["files"] == {path.name: path.stat().st_size}
    finally:
        if writer.child is not None:
            os.kill(writer.child.pid, signal.SIGCONT)
        writer.close()


def test_a_write_the_child_cannot_make_is_named_in_one_line_and_leaves_an_error_marker(tmp_path):
    path = tmp_path / "missing" / "optim_states.pt"  # its directory is not there
    writer = ProcessWriter(True)
    try:
        writer.save({"w": torch.ones(4)}, str(path))
        writer.start(str(tmp_path / marker_name(0)))
        with pytest.raises(CheckpointWriteError, match=rf"^No such file or directory \({path}\): make it writable"):
            writer.wait_written(timeout_s=120)
        assert "No such file or directory" in json.loads((tmp_path / marker_name(0)).read_text())["error"]
    finally:
        writer.close()


def test_a_child_killed_during_a_write_fails_that_save_and_the_next_save_starts_another(tmp_path):
    writer = ProcessWriter(True)
    try:
        writer.reserve(storages_nbytes({"w": torch.ones(1000)}))
        assert writer.reserved.wait(120)
        first = writer.child.pid
        os.kill(first, signal.SIGSTOP)  # held before its write, then killed
        writer.save({"w": torch.ones(1000)}, str(tmp_path / "a.pt"))
        writer.start(str(tmp_path / "m1"))
        writer.wait_snapshot()
        os.kill(first, signal.SIGKILL)
        with pytest.raises(RuntimeError, match="checkpoint writer process ended"):
            writer.wait_written(timeout_s=120)
        assert "ended" in json.loads((tmp_path / "m1").read_text())["error"] and not (tmp_path / "a.pt").exists()
        writer.save({"w": torch.full((1000,), 2.0)}, str(tmp_path / "b.pt"))
        writer.start(str(tmp_path / "m2"))
        assert writer.wait_written(timeout_s=120) and writer.child.pid != first
        assert torch.equal(torch.load(tmp_path / "b.pt")["w"], torch.full((1000,), 2.0))
    finally:
        writer.close()


def test_the_child_dies_with_its_learner_and_leaves_no_marker(tmp_path):
    """A learner killed during the write: its child ends too, so the tag stays incomplete and a
    resume takes the checkpoint before (coordinator/runtime/checkpoint.py; tests/e2e/test_async_checkpoint.py)."""
    path = tmp_path / "model_states.pt"
    os.mkfifo(f"{path}.tmp")  # the child blocks in the write until it is killed
    script = textwrap.dedent(f"""
        import os, sys, torch
        from stabledrl.learner.checkpoint_process import ProcessWriter
        w = ProcessWriter(True)
        w.save({{"w": torch.ones(1000)}}, {str(path)!r})
        w.start({str(tmp_path / marker_name(0))!r})
        w.wait_snapshot()
        import time; time.sleep(1.0)
        print(w.child.pid, flush=True)
        os._exit(0)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=180)
    child = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.1)
    assert not _alive(child)
    assert not (tmp_path / marker_name(0)).exists() and not path.exists()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_config_that_still_chooses_a_writer_is_refused_naming_the_field(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "model": {"preset": "tiny-llada"}, "task": {"name": "arithmetic"},
        "sampler": {"gen_length": 4, "block_length": 4, "steps": 4},
        "estimator": {"name": "block_random", "block_length": 4}, "loss": {"name": "stabledrl"},
        "algorithm": {"group_size": 4, "groups_per_step": 2}}))
    assert load_job_config(job, []).learner.checkpoint.reserve
    for value in ("thread", "process"):
        with pytest.raises(ConfigError, match=rf"learner\.checkpoint.*writer \('{value}'\) is gone: .*delete the line"):
            load_job_config(job, [f"learner.checkpoint.writer={value}"])


# ---- a real ZeRO-3 engine (one gloo rank, in a process of its own) ----------------------------
def _engine_run(directory: str, out) -> None:
    from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, OptimizerConfig
    from stabledrl.common.models.presets import build_tiny_policy
    from stabledrl.learner.engine import LearnerEngine
    from stabledrl.learner.group import reserve_port, init_learner_group

    torch.set_num_threads(1)
    init_learner_group("127.0.0.1", reserve_port(), 0, 1, backend="gloo", timeout_s=60)
    cfg = LearnerConfig(optimizer=OptimizerConfig(lr=1e-2, eps=1e-3),
                        deepspeed=DeepSpeedConfig(zero_stage=3, dtype="fp32", param_persistence_threshold=0))
    engine = LearnerEngine(build_tiny_policy("llada", vocab_size=97, seed=0), cfg)
    engine.expect_background_saves()  # as LearnerWorker does when the run saves during training

    def loss_fn(model, ids):
        logits = model(ids).logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()), {}

    batch = [torch.randint(4, 97, (2, 8), generator=torch.Generator().manual_seed(k)) for k in range(2)]
    engine.train_step(batch, loss_fn)  # the first update reserves the host memory
    writer = engine.writer
    reserved = writer.reserved.wait(120) and writer.arena.nbytes
    saved = engine.state_dict_for_push()
    engine.save_checkpoint_async(directory, {"step": 1}, tag="step1")
    engine.train_step(batch, loss_fn)  # changes the weights while the files are written
    written = engine.checkpoint_written(timeout_s=None)
    changed = any(not torch.equal(t, saved[n]) for n, t in engine.state_dict_for_push().items())
    from stabledrl.coordinator.runtime.checkpoint import FORMAT, write_state

    write_state(Path(directory) / "step1", {"format": FORMAT, "step": 1, "config": {}, "parameter_shapes": {}})
    client = engine.load_checkpoint(directory, tag="step1")
    restored = all(torch.equal(t, saved[n]) for n, t in engine.state_dict_for_push().items())
    out.put({"kind": type(writer).__name__, "reserved": reserved, "arena": writer.arena.nbytes, "written": written,
             "changed": changed, "restored": restored, "client": client, "child": writer.child.pid != os.getpid()})


@pytest.mark.e2e  # a DeepSpeed engine in a process of its own: not in make test-fast
def test_a_zero3_engine_reserves_its_state_after_the_first_update_and_the_save_restores(tmp_path):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_engine_run, args=(str(tmp_path / "ckpt"), out))
    proc.start()
    result = out.get(timeout=240)
    proc.join(60)
    assert result["kind"] == "ProcessWriter" and result["child"]
    assert result["reserved"] and result["arena"] == result["reserved"]  # the save fit the reserved memory
    assert result["written"] and result["changed"] and result["restored"] and result["client"] == {"step": 1}

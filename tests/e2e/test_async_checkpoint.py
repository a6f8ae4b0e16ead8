"""Checkpoints written in the background (run.async_checkpoint, learner/checkpoint_process.py), on
real actors (2 learner ranks: the ranks' saves are what it checks), one job (η = 1, in-order
batches: the run resumes exactly) through two faults and the resume after them:

- a full disk: the checkpoint writer's file writes fail with ENOSPC part-way from the second save
  on (injected where the bytes are written: the writer's child process opens its files through an
  ``open`` that fills up). The job stops with "No space left on device" and the file, not torch's
  stream positions or a collective timeout; the previous complete checkpoint stays `latest`; the
  resume after space is freed trains step 2 again exactly as the interrupted run trained it;
- a slow save: in that resumed job each learner rank's writer asks its child process for the
  files of every save but step 1's 20 s late, so the steps after a save do not wait for it; the
  job killed while that save is out leaves it incomplete (no marker, no coordinator.json; the
  child ends with its learner), so the next resume continues from the save before again, and
  this resumed run finishes, its own save of step 2 complete.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ray = pytest.importorskip("ray")

from stabledrl.common.metrics import read_metrics  # noqa: E402
from stabledrl.coordinator.runtime import checkpoint  # noqa: E402
from stabledrl.coordinator.driver import Driver  # noqa: E402
from stabledrl.learner.async_checkpoint import marker_name  # noqa: E402
from stabledrl.learner.worker import LearnerWorker  # noqa: E402
import harness  # noqa: E402

pytestmark = pytest.mark.e2e
DELAY_S = 20.0

# tests/helpers: full_disk.FillingFile, a file whose writes past its room raise OSError(ENOSPC)
HELPERS = Path(__file__).resolve().parents[1] / "helpers"

# Run first in the writer's child process (a ``sitecustomize`` on its path): from the second save on,
# every file it opens for writing takes 4 KB, then the disk is full.
FULL_DISK = f"""
import builtins, sys

sys.path.append({str(HELPERS)!r})
from full_disk import FillingFile

_open = builtins.open


def _filling_open(file, mode="r", *args, **kwargs):
    f = _open(file, mode, *args, **kwargs)
    name = str(file)
    return FillingFile(f, 4096) if "w" in mode and name.endswith(".tmp") and "/step1/" not in name else f


builtins.open = _filling_open
"""


class FullDiskLearner(LearnerWorker):
    """Its checkpoint writer's child starts with FULL_DISK: the learner puts it on the path the
    child inherits (learner/checkpoint_process.py passes its sys.path on)."""

    def start(self, *args, **kwargs):
        fault = Path(tempfile.mkdtemp(prefix="full-disk-"))
        (fault / "sitecustomize.py").write_text(FULL_DISK)
        sys.path.insert(0, str(fault))
        return super().start(*args, **kwargs)


class SlowWriterLearner(LearnerWorker):
    """Its writer has the files of every save but step 1's written DELAY_S late."""

    def start(self, *args, **kwargs):
        out = super().start(*args, **kwargs)
        from stabledrl.learner.checkpoint_process import ProcessWriter

        class SlowWriter(ProcessWriter):
            def _ask(self, message):
                if message[0] == "write" and "step1" not in message[2]:  # ("write", files, marker, ...)
                    time.sleep(DELAY_S)
                return super()._ask(message)

        self.engine.writer = SlowWriter(True)
        return out


def step_records(out: Path) -> list[dict]:
    """The step records of the job's metrics.jsonl, in order."""
    return [r for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r]


@pytest.fixture(scope="module")
def faults(cluster, tmp_path_factory):
    """The job through both faults and the last resume; what each left on disk, as it left it."""
    out = tmp_path_factory.mktemp("job")
    cfg = harness.job_config(out, run={"steps": 3, "checkpoint_every": 1},
                             algorithm={"max_staleness": 1, "in_order": True}, rollout={"num_workers": 1})
    directory = checkpoint.checkpoint_dir(out)
    resumed_cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"resume_from": directory})})
    seen = SimpleNamespace(directory=directory)

    # the full disk: saves after step 1 (complete) and step 2 (ENOSPC)
    with pytest.raises(Exception) as info:
        Driver(cfg, learner_cls=FullDiskLearner).run()
    seen.full_disk_message = str(info.value)
    seen.latest_after_full_disk = (directory / "latest").read_text()
    seen.step2_state_after_full_disk = (directory / "step2" / checkpoint.STATE_FILE).exists()
    seen.full_disk_records = step_records(out)

    # space freed, a slow writer: resumed at step 1, saves after step 2 (late) and trains step 3
    driver = Driver(resumed_cfg, learner_cls=SlowWriterLearner)
    driver.setup()
    try:
        driver.train()  # the step-2 files are still being written at the end
        pending = driver.pending_save
        seen.pending = None if pending is None else (pending.path.name, pending.written())
        for actor in driver.actors.learners:  # the crash: the learner processes die mid-write
            ray.kill(actor)
    finally:
        driver.close()
    seen.step1_state_after_kill = (directory / "step1" / checkpoint.STATE_FILE).is_file()
    seen.step2_state_after_kill = (directory / "step2" / checkpoint.STATE_FILE).exists()
    seen.step2_marker_after_kill = (directory / "step2" / marker_name(0)).exists()
    seen.slow_save_records = step_records(out)
    seen.resume_tag_after_kill = checkpoint.verify(directory, driver.config_json()).tag

    # the ordinary learner again: Driver.run, which, unlike a bare train, waits for step 2's background save
    seen.resumed = Driver(resumed_cfg)
    seen.resumed.run()
    seen.resumed_records = step_records(out)
    seen.step2_state_at_the_end = (directory / "step2" / checkpoint.STATE_FILE).is_file()
    return seen


def test_a_full_disk_stops_the_job_naming_it_and_the_resume_is_exact(faults):
    message = faults.full_disk_message
    assert "No space left on device" in message and "step2" in message, message
    assert "pos" not in message and "dist_timeout" not in message, message
    assert faults.latest_after_full_disk == "step1"
    assert not faults.step2_state_after_full_disk
    first = {int(r["step"]): r["train/loss"] for r in faults.full_disk_records}
    # step 2 recomputed bit for bit, by the resume after space was freed and by the one after the kill
    assert {int(r["step"]): r["train/loss"] for r in faults.slow_save_records}[2] == first[2]
    assert faults.resumed.step == 3
    again = {int(r["step"]): r["train/loss"] for r in faults.resumed_records}
    assert sorted(again) == [1, 2, 3] and again[2] == first[2]
    assert faults.step2_state_at_the_end


def test_a_kill_during_a_slow_save_resumes_from_the_save_before(faults):
    assert faults.pending == ("step2", False)
    assert faults.step1_state_after_kill
    assert not faults.step2_state_after_kill
    assert not faults.step2_marker_after_kill
    assert [int(r["step"]) for r in faults.slow_save_records] == [1, 2, 3]
    records = {int(r["step"]): r for r in faults.slow_save_records}
    # the steps after a save ran while it was written (one save writes 2+ files, each DELAY_S late)
    assert records[3]["time/step"] < DELAY_S
    assert records[3]["time/learner0/checkpoint"] < DELAY_S / 4  # the save's own call returned at once

    assert faults.resume_tag_after_kill == "step1"
    assert faults.resumed.step == 3
    steps = [int(r["step"]) for r in faults.resumed_records]
    assert steps == [1, 2, 3]  # step 1 kept, steps 2-3 recomputed after the resume

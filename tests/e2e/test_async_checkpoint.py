"""Checkpoints written in the background (run.async_checkpoint, learner/checkpoint_process.py), on
real actors: with each learner rank's writer asking its child process for the files 20 s late from
the second save on, the steps after a save do not wait for it; a job killed while that save is out
leaves it incomplete (no marker, no coordinator.json; the child ends with its learner), so the
resume continues from the save before, and the resumed run finishes."""
from __future__ import annotations

import time

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


class SlowWriterLearner(LearnerWorker):
    """Its writer has the files written DELAY_S late from the second save on (the first at once)."""

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


def test_a_kill_during_a_slow_save_resumes_from_the_save_before(cluster, tmp_path):
    cfg = harness.job_config(tmp_path, run={"steps": 3, "checkpoint_every": 1}, algorithm={"max_staleness": 1},
                             rollout={"num_workers": 1})  # the learner ranks' saves are what it checks
    driver = Driver(cfg, learner_cls=SlowWriterLearner)
    driver.setup()
    try:
        driver.train()  # saves after steps 1 and 2; the step-2 files are still being written at the end
        pending = driver.pending_save
        assert pending is not None and pending.path.name == "step2" and not pending.written()
        for actor in driver.actors.learners:  # the crash: the learner processes die mid-write
            ray.kill(actor)
    finally:
        driver.close()
    directory = checkpoint.checkpoint_dir(tmp_path)
    assert (directory / "step1" / checkpoint.STATE_FILE).is_file()
    assert not (directory / "step2" / checkpoint.STATE_FILE).exists()
    assert not (directory / "step2" / marker_name(0)).exists()
    records = {int(r["step"]): r for r in read_metrics(tmp_path / "metrics.jsonl") if "time/step" in r}
    # the steps after a save ran while it was written (one save writes 2+ files, each DELAY_S late)
    assert records[3]["time/step"] < DELAY_S
    assert records[3]["time/learner0/checkpoint"] < DELAY_S / 4  # the save's own call returned at once

    resume = checkpoint.verify(directory, driver.config_json())
    assert resume.tag == "step1"
    resumed_cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"resume_from": directory})})
    resumed, _, _ = harness.run_driver(resumed_cfg)
    assert resumed.step == 3
    steps = [int(r["step"]) for r in read_metrics(tmp_path / "metrics.jsonl") if "time/step" in r]
    assert steps == [1, 2, 3]  # step 1 kept, steps 2-3 recomputed after the resume

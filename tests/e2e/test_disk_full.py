"""A full disk during a background checkpoint, on real actors: the learner's file writes fail
with ENOSPC part-way from the second save on (injected where the bytes are written). The job
stops with "No space left on device" and the file, not torch's stream positions or a collective
timeout; the previous complete checkpoint stays `latest`; the resume after space is freed trains
step 2 again exactly as the interrupted run trained it."""
from __future__ import annotations

import errno
import os

import pytest

ray = pytest.importorskip("ray")

from stabledrl.common.metrics import read_metrics  # noqa: E402
from stabledrl.coordinator.runtime import checkpoint  # noqa: E402
from stabledrl.coordinator.driver import Driver  # noqa: E402
from stabledrl.learner.worker import LearnerWorker  # noqa: E402
import harness  # noqa: E402

pytestmark = pytest.mark.e2e


class FullDiskLearner(LearnerWorker):
    """From the second save on, every file takes 4 KB and then the disk is full."""

    def start(self, *args, **kwargs):
        out = super().start(*args, **kwargs)
        from stabledrl.learner.async_checkpoint import BackgroundWriter, write_file

        class Full:
            def __init__(self, path, mode):
                self.f, self.taken = open(path, mode), 0

            def write(self, data):
                if self.taken + len(data) > 4096:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                self.taken += len(data)
                return self.f.write(data)

            def __getattr__(self, name):
                return getattr(self.f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

        def write(state, path, zipfile_serialization):
            write_file(state, path, zipfile_serialization, opener=open if "step1" in path else Full)

        self.engine.writer = BackgroundWriter(True, write=write)
        return out


@pytest.fixture(scope="module")
def cluster():
    with harness.local_ray(__name__):
        yield


def test_a_full_disk_stops_the_job_naming_it_and_the_resume_is_exact(cluster, tmp_path):
    cfg = harness.job_config(tmp_path, run={"steps": 3, "checkpoint_every": 1}, algorithm={"in_order": True})
    driver = Driver(cfg, learner_cls=FullDiskLearner)
    with pytest.raises(Exception) as info:
        driver.run()
    message = str(info.value)
    assert "No space left on device" in message and "step2" in message, message
    assert "pos" not in message and "dist_timeout" not in message, message
    directory = checkpoint.checkpoint_dir(tmp_path)
    assert (directory / "latest").read_text() == "step1"
    assert not (directory / "step2" / checkpoint.STATE_FILE).exists()
    first = {int(r["step"]): r["train/loss"] for r in read_metrics(tmp_path / "metrics.jsonl") if "train/loss" in r}

    resumed_cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"resume_from": directory})})
    resumed, _, _ = harness.run_driver(resumed_cfg)  # space freed: the ordinary learner
    assert resumed.step == 3
    again = {int(r["step"]): r["train/loss"] for r in read_metrics(tmp_path / "metrics.jsonl") if "train/loss" in r}
    assert sorted(again) == [1, 2, 3] and again[2] == first[2]  # step 2 recomputed bit for bit
    assert (directory / "step2" / checkpoint.STATE_FILE).is_file()

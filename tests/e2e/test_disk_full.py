"""A full disk during a background checkpoint, on real actors: the checkpoint writer's file writes
fail with ENOSPC part-way from the second save on (injected where the bytes are written: the
writer's child process opens its files through an ``open`` that fills up). The job
stops with "No space left on device" and the file, not torch's stream positions or a collective
timeout; the previous complete checkpoint stays `latest`; the resume after space is freed trains
step 2 again exactly as the interrupted run trained it."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from stabledrl.common.metrics import read_metrics  # noqa: E402
from stabledrl.coordinator.runtime import checkpoint  # noqa: E402
from stabledrl.coordinator.driver import Driver  # noqa: E402
from stabledrl.learner.worker import LearnerWorker  # noqa: E402
import harness  # noqa: E402

pytestmark = pytest.mark.e2e


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


def test_a_full_disk_stops_the_job_naming_it_and_the_resume_is_exact(cluster, tmp_path):
    cfg = harness.job_config(tmp_path, run={"steps": 3, "checkpoint_every": 1}, algorithm={"in_order": True},
                             rollout={"num_workers": 1})  # the learner ranks' saves are what it checks
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
    resumed = Driver(resumed_cfg)  # space freed: the ordinary learner
    resumed.run()  # which, unlike a bare train, waits for step 2's background save to complete
    assert resumed.step == 3
    again = {int(r["step"]): r["train/loss"] for r in read_metrics(tmp_path / "metrics.jsonl") if "train/loss" in r}
    assert sorted(again) == [1, 2, 3] and again[2] == first[2]  # step 2 recomputed bit for bit
    assert (directory / "step2" / checkpoint.STATE_FILE).is_file()

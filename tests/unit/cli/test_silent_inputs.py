"""Inputs that passed silently or failed cryptically, each now one clear line before work starts:
a prompt that is not text, a timeout no timer can hold, a negative count, an empty data file, a
plan the machine cannot hold."""
from __future__ import annotations


import pytest
import yaml

import stabledrl.cli.main as cli
from test_bad_inputs import no_cluster, run_job  # noqa: F401 - the fixture, used by name
from test_config_mistakes import JOB


@pytest.mark.parametrize("field", ["task.reward.timeout_s", "task.reward.import_timeout_s",
                                   "task.reward.sandbox.cpu_seconds", "rollout.request_timeout_s",
                                   "cluster.start_timeout_s", "learner.dist_timeout_s", "weights.timeout_s"])
def test_a_timeout_no_timer_can_hold_is_refused_naming_the_field(tmp_path, capsys, field):
    """Finding: task.reward.timeout_s=1e300 passed validation and --dry-run; every reward call then
    raised OverflowError. Every timeout is bounded (a million seconds)."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(JOB))
    assert cli.main(["train", "--config", str(path), "--dry-run", f"{field}=1e300"]) == 2
    err = capsys.readouterr().err
    assert f"{field}: Input should be less than or equal to 1000000" in err, err


@pytest.mark.parametrize("field", ["task.reward.sandbox.memory_mb", "task.reward.sandbox.file_size_mb",
                                   "task.reward.sandbox.disk_mb"])
def test_a_size_no_limit_can_hold_is_refused_naming_the_field(tmp_path, capsys, field):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(JOB))
    assert cli.main(["train", "--config", str(path), "--dry-run", f"{field}={1 << 50}"]) == 2
    assert f"{field}: Input should be less than or equal to 1048576" in capsys.readouterr().err

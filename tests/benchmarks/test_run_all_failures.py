"""A benchmark run cannot report success by omission: a job that exits 0 but recorded a failed part
(or wrote no result) is ``failed``, and every failed, timed-out or deadline-skipped job is one of
the run's failures (its exit code 1); jobs the plan leaves out (no second GPU, --only) are not."""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_all import Job, Runner, job_status  # noqa: E402


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text("import json, sys\nout = sys.argv[sys.argv.index('--out') + 1]\n" + textwrap.dedent(body))
    return str(path)  # absolute: Runner joins it to the benchmarks' directory, which keeps it as is


def test_a_recorded_part_failure_or_a_missing_result_fails_a_job_that_exited_zero():
    assert job_status("ok", {"parts": {"a": {}}, "errors": {}}) == "ok"
    assert job_status("ok", {"parts": {}, "errors": {"zero2_ckpt_on": "ValueError: metric ..."}}) == "failed"
    assert job_status("ok", None) == "failed"
    assert job_status("timeout", {"errors": {}}) == "timeout"


def test_the_runner_lists_every_job_that_did_not_finish_cleanly(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    ok = _script(tmp_path, "ok", "json.dump({'parts': {'x': {'v': 1}}, 'errors': {}}, open(out, 'w'))\n")
    part_failed = _script(tmp_path, "part", "json.dump({'parts': {}, 'errors': {'x': 'boom'}}, open(out, 'w'))\n")
    silent = _script(tmp_path, "silent", "pass\n")
    crashed = _script(tmp_path, "crash", "raise SystemExit(3)\n")
    runner = Runner(out, deadline_s=120, n_gpus=0, tiny=True)
    runner.skipped = {"learner_2gpu": "needs 2 GPUs"}
    work = runner.work
    jobs = [Job(name, script, ["--out", str(work / f"{name}.json")], [], 60)
            for name, script in (("good", ok), ("part_failed", part_failed), ("silent", silent), ("crashed", crashed))]
    runner.run_plan([jobs], [])
    runner.deadline = 0.0  # no time left: the next job is skipped, which is a failure too
    late = Job("late", ok, ["--out", str(work / "late.json")], [], 60)
    runner.run(late)
    assert runner.failures() == {"part_failed": "failed", "silent": "failed", "crashed": "failed", "late": "skipped"}
    table = json.loads((out / "results.json").read_text())["jobs"]
    assert table["good"]["status"] == "ok" and table["learner_2gpu"]["status"] == "skipped"
    assert table["part_failed"]["result"]["errors"] == {"x": "boom"}


def test_a_part_sees_its_planned_gpus_within_the_runners_own(tmp_path, monkeypatch):
    """A runner started with CUDA_VISIBLE_DEVICES=2,3 (a lane of a 4-GPU host) runs its part planned
    on [0, 1] with devices 2 and 3: the part records what it saw."""
    out = tmp_path / "out"
    out.mkdir()
    seen = _script(tmp_path, "seen", "import os\njson.dump({'parts': {'env': {'visible': "
                                     "os.environ.get('CUDA_VISIBLE_DEVICES')}}, 'errors': {}}, open(out, 'w'))\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    runner = Runner(out, deadline_s=120, n_gpus=2, tiny=True)
    runner.run(Job("lane", seen, ["--out", str(runner.work / "lane.json")], [0, 1], 60))
    runner.run(Job("second", seen, ["--out", str(runner.work / "second.json")], [1], 60))
    table = json.loads((out / "results.json").read_text())["jobs"]
    assert table["lane"]["result"]["parts"]["env"]["visible"] == "2,3"
    assert table["second"]["result"]["parts"]["env"]["visible"] == "3"

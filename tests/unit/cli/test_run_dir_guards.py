"""What run.output_dir must offer before Ray starts: no other job in it (its lock), and, for a
resume, the space one checkpoint of the run takes."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

import stabledrl.cli.main as cli
from stabledrl.common.trust.checkpoint_files import FORMAT
from stabledrl.common.trust.run_lock import LOCK_FILE
from stabledrl.coordinator.runtime.checkpoint import write_state
from tests.unit.common.test_run_trust import job_file, make_run


@pytest.fixture(autouse=True)
def own_key(tmp_path, monkeypatch):
    monkeypatch.setenv("STABLEDRL_KEY_FILE", str(tmp_path / "key" / "run.key"))


@pytest.fixture
def started(monkeypatch):
    seen: list = []
    monkeypatch.setattr(cli, "train_job", lambda cfg: seen.append(cfg) or 0)
    monkeypatch.setattr("stabledrl.common.sandbox.scorer.check_reward", lambda task: None)
    return seen


HOLD = "import sys, time; from stabledrl.common.trust.run_lock import lock_output_dir as lock; " \
       "lock(sys.argv[1]); print('held', flush=True); time.sleep(600)"


def test_a_second_job_in_a_running_jobs_output_dir_is_refused(tmp_path, capsys, started):
    """Finding: two jobs started 2 s apart into one run.output_dir were both accepted; a second
    job with --overwrite would delete the running one's files."""
    run = make_run(tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for argv in (["train", "--resume", str(run)], ["train", "--config", str(job_file(tmp_path, run)),
                                                        "--overwrite"]):
            assert cli.main(argv) == 2
            err = capsys.readouterr().err
            assert f"run.output_dir {run} is in use by another job (pid {holder.pid} on " in err, err
            assert err.count("\n") == 1 and not started
        assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != LOCK_FILE} == before
    finally:
        holder.kill()
        holder.wait()
    assert cli.main(["train", "--resume", str(run)]) == 0 and started  # the lock went with its process


def test_a_resume_without_room_for_a_checkpoint_stops_before_ray(tmp_path, capsys, started, monkeypatch):
    """Finding: a disk too full for a checkpoint but with more than 1 MiB free passed the write
    probe; Ray, the actors and a step of training ran before the save failed."""
    import stabledrl.common.trust.run_dir as run_dir

    run = make_run(tmp_path)
    tag = run / "checkpoints" / "step2"
    with open(tag / "mp_rank_00_model_states.pt", "wb") as f:
        f.truncate(3 << 30)  # a 3 GiB checkpoint file (sparse: no space taken here)
    state = json.loads((tag / "coordinator.json").read_text())
    write_state(tag, {k: v for k, v in state.items() if k not in ("seal", "files")} | {"format": FORMAT})
    real = shutil.disk_usage
    monkeypatch.setattr(run_dir.shutil, "disk_usage", lambda p: real(p)._replace(free=2 << 30))
    assert cli.main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"run.output_dir {run} has 2.00 GiB free, but a checkpoint of this run takes 3.00 GiB ({tag})" in err
    assert not started
    assert cli.main(["train", "--resume", str(run), "run.checkpoint_every=0", "run.save_final_checkpoint=false"]) == 0
    monkeypatch.setattr(run_dir.shutil, "disk_usage", lambda p: real(p)._replace(free=4 << 30))
    assert cli.main(["train", "--resume", str(run)]) == 0 and len(started) == 2


def test_the_lock_is_taken_once_per_process_and_given_back(tmp_path):
    from stabledrl.common.trust.run_lock import lock_output_dir, release

    run = tmp_path / "run"
    lock_output_dir(run)
    lock_output_dir(run)  # the same process again: no-op
    other = subprocess.run([sys.executable, "-c", HOLD.replace("time.sleep(600)", "pass"), str(run)],
                           capture_output=True, text=True)
    assert other.returncode != 0 and "is in use by another job" in other.stderr
    release(run)
    other = subprocess.run([sys.executable, "-c", HOLD.replace("time.sleep(600)", "pass"), str(run)],
                           capture_output=True, text=True)
    assert other.returncode == 0, other.stderr


def test_a_filesystem_without_locks_is_said_on_stderr_and_the_job_goes_on(tmp_path, monkeypatch, capsys):
    """A filesystem that cannot lock (some network mounts): the job is not refused, and the user
    is told on stderr, through the job's log, that nothing keeps a second job out."""
    import errno

    from stabledrl.common.job_log import show_log
    from stabledrl.common.trust import run_lock

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_lock.fcntl, "flock", no_locks)
    undo = show_log()
    try:
        run_lock.lock_output_dir(tmp_path / "run")
    finally:
        undo()
    out = capsys.readouterr()
    assert out.out == "" and "no lock on this filesystem (No locks available); make sure no other job" in out.err
    assert (tmp_path / "run").is_dir()

"""A checkpoint write the disk refuses (no space, a quota, permissions) stops the job with that
cause and the file in one line, keeps the previous complete checkpoint, and leaves nothing half
written that a resume could take for part of a checkpoint. The faults are injected where the
bytes are written: a file object whose writes raise OSError(ENOSPC) part-way, as a full disk does."""
from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch

from stabledrl.common.trust.checkpoint_files import FORMAT, STATE_FILE, CheckpointError, clear_incomplete
from stabledrl.coordinator.runtime import checkpoint
from stabledrl.common.metrics import restore_metrics
from stabledrl.coordinator.runtime.checkpoint import PendingSave, write_state
from stabledrl.coordinator.runtime.episode_io import save_episodes
from stabledrl.learner.async_checkpoint import (
    CheckpointWriteError, disk_cause, marker_name, write_file,
)
from full_disk import FillingFile

STATE = {"w": torch.randn(64, 64), "b": torch.randn(64)}


def filling_opener(code: int = errno.ENOSPC, after: int = 6038):
    """open() whose file takes ``after`` bytes, then raises OSError(code) on every write."""
    return lambda path, mode: FillingFile(open(path, mode), after, code)


@pytest.mark.parametrize(
    "code, words",
    [
        (errno.ENOSPC, "No space left on device"),
        (errno.EDQUOT, "Disk quota exceeded"),
        (errno.EACCES, "Permission denied"),
    ],
)
def test_a_refused_write_names_the_cause_and_the_file_not_torchs_stream_position(tmp_path, code, words):
    path = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    with pytest.raises(CheckpointWriteError) as info:
        write_file(STATE, str(path), True, opener=filling_opener(code))
    message = str(info.value)
    assert message.startswith(f"{words} ({path})") and "\n" not in message and "pos" not in message, message
    assert not path.exists() and not Path(f"{path}.tmp").exists()  # nothing half written stays


def test_a_failed_background_save_keeps_the_previous_checkpoint_and_says_so(tmp_path):
    directory = tmp_path / "checkpoints"
    for step in (2, 4):
        (directory / f"step{step}").mkdir(parents=True)
    save_episodes(directory / "step2", [])
    write_state(directory / "step2", {"format": FORMAT, "step": 2, "config": {}, "parameter_shapes": {}})
    (directory / "latest").write_text("step2")
    (directory / "step4" / marker_name(0)).write_text(json.dumps({"error": f"No space left on device ({directory})"}))
    save = PendingSave(directory / "step4", 1, {"format": FORMAT, "step": 4}, [])
    with pytest.raises(CheckpointError) as info:
        save.poll()
    message = str(info.value)
    assert "No space left on device" in message and "the last complete checkpoint, step2, is kept" in message
    assert (directory / "latest").read_text() == "step2" and not (directory / "step4" / STATE_FILE).exists()
    assert checkpoint.verify(directory, {}).tag == "step2"
    clear_incomplete(directory / "step4")  # the resumed run saves step 4 again from an empty directory
    clear_incomplete(directory / "step2")
    assert not (directory / "step4").exists() and (directory / "step2" / STATE_FILE).is_file()


def test_the_coordinators_own_writes_on_a_full_disk_are_one_line(tmp_path, monkeypatch):
    directory = tmp_path / "checkpoints"
    (directory / "step2").mkdir(parents=True)
    save = PendingSave(directory / "step2", 0, {"format": FORMAT, "step": 2, "config": {}, "parameter_shapes": {}}, [])

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(directory / "step2" / "episodes.json"))

    monkeypatch.setattr(checkpoint, "save_episodes", full)
    with pytest.raises(
        CheckpointError,
        match=r"cannot write checkpoint .*step2: No space left on device .*episodes.json"
        r"\); no complete checkpoint was written before it",
    ):
        save.poll()
    assert not (directory / "latest").exists()


def test_resuming_on_a_full_disk_leaves_the_metrics_as_they_were(tmp_path, monkeypatch):
    metrics = tmp_path / "metrics.jsonl"
    text = "".join(json.dumps({"step": s}) + "\n" for s in range(6))
    metrics.write_text(text)
    real_open = open

    def full(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if "w" in mode:
            f.write = lambda data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device", str(file)))
        return f

    monkeypatch.setattr("builtins.open", full)
    with pytest.raises(OSError, match="No space left"):
        restore_metrics(tmp_path, 3)
    monkeypatch.undo()
    assert metrics.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no 0-byte metrics.before_resume.jsonl
    assert restore_metrics(tmp_path, 3) == 2  # space freed: the resume goes on
    assert (tmp_path / "metrics.before_resume.jsonl").read_text() == text


def test_a_write_torch_reports_without_a_cause_is_explained_by_probing_the_disk(tmp_path, monkeypatch):
    import stabledrl.learner.async_checkpoint as ac

    error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 6144 vs 6038")
    assert disk_cause(str(tmp_path), error) is error  # the disk takes a probe: the error stays as it was

    def full(path, write, opener=open):
        raise CheckpointWriteError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(ac, "_durably", full)
    cause = disk_cause(str(tmp_path), error)
    assert (
        isinstance(cause, CheckpointWriteError)
        and str(cause) == f"No space left on device ({tmp_path}): free space there"
    )

"""A run directory is the user's data (common/trust/seal.py, common/trust/run_dir.py): a run's config that
names reward code is used only as the run wrote it, a resume or an evaluation never loosens the
reward sandbox unless the user says so, and run.output_dir is checked before Ray starts. Every
refusal exits 2 with one line naming the file or field and what to do; no actor starts."""
from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import yaml

import stabledrl.cli.main as cli
from stabledrl.common.trust.checkpoint_files import FORMAT
from stabledrl.common.trust.seal import SEAL_LINE, sealed_text, text_is_sealed
from stabledrl.coordinator.runtime.checkpoint import write_state
from tests.unit.cli.test_config_mistakes import JOB

REWARD = "def score(completion, row):\n    open({marker!r}, 'w').write('ran')\n    return 1.0\n"


@pytest.fixture(autouse=True)
def own_key(tmp_path, monkeypatch):
    monkeypatch.setenv("STABLEDRL_KEY_FILE", str(tmp_path / "key" / "run.key"))


@pytest.fixture
def started(monkeypatch):
    """Whether train_job was reached (it is replaced: no Ray)."""
    seen: list = []
    monkeypatch.setattr(cli, "train_job", lambda cfg: seen.append(cfg) or 0)
    # the reward's own dry import in its sandbox is test_reward_confinement's; here only the run's trust
    monkeypatch.setattr(cli, "check_reward", lambda task: None)
    return seen


def make_run(root: Path, reward: dict | None = None) -> Path:
    """A run directory as the job writes it: sealed config.yaml and one sealed checkpoint."""
    run = root / "run"
    (root / "r.py").write_text("def score(completion, row):\n    return 1.0\n")  # the reward file must exist
    config = {**JOB, "task": {**JOB["task"], "reward": reward or {}}, "run": {"output_dir": str(run)}}
    tag = run / "checkpoints" / "step2"
    tag.mkdir(parents=True)
    (run / "config.yaml").write_text(sealed_text(yaml.safe_dump(config, sort_keys=False)))
    write_state(tag, {"format": FORMAT, "step": 2, "config": config, "parameter_shapes": {}})
    (tag.parent / "latest").write_text("step2")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    return run


def attack(run: Path, root: Path) -> Path:
    """What the probe did: the reward pointed at a file of the attacker's, isolation inline, in
    config.yaml and in the checkpoint's coordinator.json alike (the sizes rewritten to match)."""
    evil = root / "evil.py"
    evil.write_text(REWARD.format(marker=str(root / "PWNED")))
    for file in (run / "config.yaml", run / "checkpoints" / "step2" / "coordinator.json"):
        data = yaml.safe_load(file.read_text()) if file.suffix == ".yaml" else json.loads(file.read_text())
        config = data if file.suffix == ".yaml" else data["config"]
        config["task"]["reward"] = {"custom": f"{evil}:score", "isolation": "inline"}
        file.write_text(yaml.safe_dump(data) if file.suffix == ".yaml" else json.dumps(data))
    return evil


def test_the_job_seals_its_config_and_an_edit_breaks_the_seal(tmp_path):
    text = sealed_text("a: 1\n")
    assert text.splitlines()[-1].startswith(SEAL_LINE) and text_is_sealed(text)
    assert yaml.safe_load(text) == {"a": 1}  # the seal is a YAML comment
    assert not text_is_sealed(text.replace("a: 1", "a: 2"))
    assert not text_is_sealed("a: 1\n")


@pytest.mark.parametrize("command", ["resume", "eval", "new run"])
def test_a_tampered_run_config_naming_reward_code_is_refused(tmp_path, capsys, started, command):
    run = make_run(tmp_path)
    attack(run, tmp_path)
    argv = {"resume": ["train", "--resume", str(run)],
            "eval": ["eval", "--config", str(run / "config.yaml"), "--checkpoint", str(run)],
            "new run": ["train", "--config", str(run / "config.yaml"), f"run.output_dir={tmp_path / 'new'}"]}[command]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one message
    assert f"{run / 'config.yaml'} is a run's config" in err and "evil.py:score" in err and "--trust-run" in err
    assert not started and not (tmp_path / "PWNED").exists()


def test_a_run_config_with_its_seal_line_removed_is_refused_too(tmp_path, capsys, started):
    run = make_run(tmp_path, {"custom": f"{tmp_path / 'r.py'}:score"})
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text("".join(line for line in text.splitlines(True) if not line.startswith(SEAL_LINE)))
    assert cli.main(["train", "--resume", str(run)]) == 2
    assert "has no seal" in capsys.readouterr().err and not started


def test_the_runs_own_config_resumes_and_trust_run_accepts_an_edited_one(tmp_path, capsys, started):
    run = make_run(tmp_path, {"custom": f"{tmp_path / 'r.py'}:score"})
    assert cli.main(["train", "--resume", str(run)]) == 0 and len(started) == 1
    attack(run, tmp_path)
    assert cli.main(["train", "--resume", str(run), "--trust-run", "--allow-weaker-sandbox"]) == 0 and len(started) == 2


def test_a_built_in_reward_needs_no_seal(tmp_path, started):
    """Nothing of the config runs as code: a run copied from another machine resumes as usual."""
    run = make_run(tmp_path)
    (run / "config.yaml").write_text(yaml.safe_dump(yaml.safe_load((run / "config.yaml").read_text())))
    assert cli.main(["train", "--resume", str(run)]) == 0 and started


@pytest.mark.parametrize("override, field", [
    ("task.reward.isolation=inline", "task.reward.isolation: process -> inline"),
    ("task.reward.sandbox.landlock=false", "task.reward.sandbox.landlock: true -> false"),
    ("task.reward.sandbox.allow_network=true", "allow_network: false -> true"),
    ("task.reward.sandbox.read_paths=[/etc]", "read_paths: adds ['/etc']"),
    ("task.reward.sandbox.memory_mb=100000", "memory_mb: 4096 -> 100000"),
])
@pytest.mark.parametrize("command", ["resume", "eval"])
def test_a_weaker_sandbox_than_the_runs_needs_the_flag(
    tmp_path, capsys, started, monkeypatch, override, field, command
):
    import stabledrl.evaluation.offline as offline_eval

    monkeypatch.setattr(offline_eval, "eval_command", lambda cfg, **kw: started.append(cfg))
    run = make_run(tmp_path, {"custom": f"{tmp_path / 'r.py'}:score"})
    argv = (["train", "--resume", str(run)] if command == "resume"
            else ["eval", "--config", str(run / "config.yaml"), "--checkpoint", str(run)])
    assert cli.main([*argv, override]) == 2
    err = capsys.readouterr().err
    assert field in err and "--allow-weaker-sandbox" in err and not started
    assert cli.main([*argv, override, "--allow-weaker-sandbox"]) == 0 and started
    assert cli.main([*argv, "task.reward.timeout_s=1"]) == 0  # a tighter sandbox needs nothing


# ---- run.output_dir --------------------------------------------------------------------------
def job_file(tmp_path: Path, output_dir: Path | str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**JOB, "run": {"output_dir": str(output_dir)}}))
    return path


def test_an_output_dir_holding_a_run_is_not_overwritten(tmp_path, capsys, started):
    run = make_run(tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert cli.main(["train", "--config", str(job_file(tmp_path, run))]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and f"stabledrl train --resume {run}" in err and "--overwrite" in err
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}  # the check's lock
    assert after == before and not started
    assert cli.main(["train", "--config", str(job_file(tmp_path, run)), "--overwrite"]) == 0 and started
    assert not (run / "checkpoints").exists() and not (run / "metrics.jsonl").exists()


@pytest.mark.parametrize("where, fragment", [("file", "is a file, not a directory"), ("/proc/self/x", "under /proc"),
                                             ("/sys/x", "under /sys")])
def test_an_output_dir_that_is_a_file_or_a_system_tree_is_refused(tmp_path, capsys, started, where, fragment):
    target = tmp_path / "afile" if where == "file" else Path(where)
    if where == "file":
        target.write_text("x")
    assert cli.main(["train", "--config", str(job_file(tmp_path, target))]) == 2
    assert fragment in capsys.readouterr().err and not started


@pytest.mark.parametrize(
    "code, words",
    [
        (errno.ENOSPC, "No space left on device"),
        (errno.EDQUOT, "Disk quota exceeded"),
        (errno.EACCES, "Permission denied"),
    ],
)
def test_a_full_disk_or_a_quota_is_named_before_ray_starts(tmp_path, capsys, started, monkeypatch, code, words):
    import builtins
    import os

    real_open = builtins.open

    def full(file, mode="r", *args, **kwargs):
        if ".write-test-" in str(file) and "w" in mode:
            raise OSError(code, os.strerror(code), str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full)
    run = make_run(tmp_path)
    assert cli.main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert words in err and str(run) in err and not started
    assert not list(run.glob(".write-test-*")) and not (run / "metrics.before_resume.jsonl").exists()


def test_a_baseline_lowered_in_an_unsealed_manifest_does_not_count(tmp_path, capsys, monkeypatch):
    """The attacker lowers the sandbox in coordinator.json so that a weaker eval looks unchanged:
    the manifest fails its seal, so the baseline is the default sandbox, and the eval is refused."""
    import stabledrl.evaluation.offline as offline_eval

    monkeypatch.setattr(offline_eval, "eval_command", lambda cfg, **kw: None)
    run = make_run(tmp_path, {"custom": f"{tmp_path / 'r.py'}:score"})
    state_file = run / "checkpoints" / "step2" / "coordinator.json"
    state = json.loads(state_file.read_text())
    state["config"]["task"]["reward"]["isolation"] = "inline"
    state_file.write_text(json.dumps(state))
    argv = ["eval", "--config", str(run / "config.yaml"), "--checkpoint", str(run), "task.reward.isolation=inline"]
    assert cli.main(argv) == 2
    assert "task.reward.isolation: process -> inline" in capsys.readouterr().err

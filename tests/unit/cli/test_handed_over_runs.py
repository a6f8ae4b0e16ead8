"""A run someone handed over is verified however it arrives: a config bearing a seal line that does
not verify is refused wherever it lies, anything the project wrote (a checkpoint tag, an export)
marks its directory as a run, an export carries its sealed config (`eval --model EXPORT` needs no
other), and a key file that cannot serve is named in one line before anything starts."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import yaml

import stabledrl.cli.main as cli
import stabledrl.evaluation.offline as offline_eval
from stabledrl.common.trust.seal import EXPORT_CONFIG, SEAL_LINE, sealed_text
from tests.unit.common.test_run_trust import attack, make_run


@pytest.fixture(autouse=True)
def own_key(tmp_path, monkeypatch):
    monkeypatch.setenv("STABLEDRL_KEY_FILE", str(tmp_path / "key" / "run.key"))


@pytest.fixture
def reached(monkeypatch):
    """What got past the checks: training (train_job) or an evaluation (eval_command); no Ray, no model."""
    seen: list = []
    monkeypatch.setattr(cli, "train_job", lambda cfg: seen.append(("train", cfg)) or 0)
    monkeypatch.setattr(offline_eval, "eval_command", lambda cfg, **kw: seen.append(("eval", cfg, kw)))
    monkeypatch.setattr("stabledrl.common.sandbox.scorer.check_reward", lambda task: None)
    return seen


def handed_over(tmp_path: Path, *, keep_seal: bool = True) -> Path:
    """The probe's hand-over: config.yaml (edited to name the attacker's reward, inline) and
    final_model; no checkpoints/, no metrics.jsonl."""
    run = make_run(tmp_path)
    attack(run, tmp_path)
    shutil.rmtree(run / "checkpoints")
    (run / "metrics.jsonl").unlink()
    (run / "final_model").mkdir()
    config = run / "config.yaml"
    config.write_text(config.read_text() + (f"{SEAL_LINE}{'0' * 64}\n" if keep_seal else ""))  # a seal that fails
    return run


def refused(argv: list[str], capsys, reached, tmp_path: Path, fragment: str = "is a run's config") -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err
    assert not reached and not (tmp_path / "PWNED").exists()
    return err


@pytest.mark.parametrize("command", ["eval", "train"])
def test_a_config_handed_over_with_its_model_is_verified(tmp_path, capsys, reached, command):
    """Finding: with only config.yaml and final_model, `eval --config RUN/config.yaml --model
    RUN/final_model` ran the edited config's reward unconfined (its stale seal line kept);
    `train --config RUN/config.yaml` too."""
    run = handed_over(tmp_path)
    argv = {"eval": ["eval", "--config", str(run / "config.yaml"), "--model", str(run / "final_model")],
            "train": ["train", "--config", str(run / "config.yaml"), f"run.output_dir={tmp_path / 'new'}"]}[command]
    assert "does not match its seal" in refused(argv, capsys, reached, tmp_path)
    moved = tmp_path / "elsewhere" / "config.yaml"  # a sealed config stays a run's config wherever it lies
    moved.parent.mkdir()
    shutil.copy(run / "config.yaml", moved)
    argv[2] = str(moved)
    assert "does not match its seal" in refused(argv, capsys, reached, tmp_path)


def test_a_handed_over_config_without_its_seal_line_is_still_a_runs(tmp_path, capsys, reached):
    run = handed_over(tmp_path, keep_seal=False)
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text("".join(line for line in text.splitlines(True) if SEAL_LINE not in line))
    argv = ["eval", "--config", str(run / "config.yaml"), "--model", str(run / "final_model")]
    assert "has no seal" in refused(argv, capsys, reached, tmp_path)


def test_checkpoint_tags_at_the_runs_root_mark_it_as_a_run(tmp_path, capsys, reached):
    """Finding: with the tags moved to the run's root (RUN/latest, RUN/step2; no checkpoints/, no
    metrics.jsonl), `eval --config RUN/config.yaml --checkpoint RUN` skipped the seal."""
    run = make_run(tmp_path)
    attack(run, tmp_path)
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text("".join(line for line in text.splitlines(True) if SEAL_LINE not in line))
    for entry in (run / "checkpoints").iterdir():
        entry.rename(run / entry.name)
    (run / "checkpoints").rmdir()
    (run / "metrics.jsonl").unlink()
    argv = ["eval", "--config", str(run / "config.yaml"), "--checkpoint", str(run)]
    refused(argv, capsys, reached, tmp_path)
    (run / "latest").unlink()  # a tag alone (a directory holding coordinator.json) marks it too
    refused(argv, capsys, reached, tmp_path)


def export(tmp_path: Path, reward: dict) -> Path:
    """An exported model directory as the job writes it: the job's sealed config inside."""
    run = make_run(tmp_path, reward)
    final = run / "final_model"
    final.mkdir()
    (final / EXPORT_CONFIG).write_text((run / "config.yaml").read_text())
    return final


def test_an_export_carries_its_config(tmp_path, capsys, reached):
    final = export(tmp_path, {"custom": f"{tmp_path / 'r.py'}:score"})
    assert cli.main(["eval", "--model", str(final), "--k", "1"]) == 0
    (kind, cfg, kwargs), = reached
    assert kind == "eval" and kwargs["model_dir"] == str(final)
    assert cfg.task.reward.custom == f"{tmp_path / 'r.py'}:score" and cfg.task.held_out == 10
    reached.clear()
    carried = yaml.safe_load((final / EXPORT_CONFIG).read_text())
    carried["task"]["reward"] = {"custom": f"{tmp_path / 'evil.py'}:score", "isolation": "inline"}
    (final / EXPORT_CONFIG).write_text(yaml.safe_dump(carried))  # its seal line gone with the edit
    refused(["eval", "--model", str(final)], capsys, reached, tmp_path)
    (final / EXPORT_CONFIG).unlink()
    refused(["eval", "--model", str(final)], capsys, reached, tmp_path, f"carries no {EXPORT_CONFIG}")


def test_a_lora_runs_adapter_export_carries_its_config_too(tmp_path, capsys, reached):
    """A LoRA run also exports its adapters (final_adapter, a PEFT folder): `eval --adapter` alone
    reads the config it carries, and a config beside an adapter export is a run's."""
    final = export(tmp_path, {"custom": f"{tmp_path / 'r.py'}:score"})
    adapter = final.parent / "final_adapter"
    final.rename(adapter)
    assert cli.main(["eval", "--adapter", str(adapter)]) == 0
    (kind, cfg, kwargs), = reached
    assert kind == "eval" and kwargs["adapter"] == str(adapter) and kwargs["model_dir"] is None
    reached.clear()
    run = adapter.parent
    attack(run, tmp_path)  # run/config.yaml edited (its seal gone), its checkpoints and metrics removed
    shutil.rmtree(run / "checkpoints")
    (run / "metrics.jsonl").unlink()
    refused(["eval", "--config", str(run / "config.yaml"), "--adapter", str(adapter)], capsys, reached, tmp_path)


def test_the_python_api_verifies_a_runs_config_too(tmp_path, reached):
    from stabledrl import api
    from stabledrl.common.trust.seal import RunTrustError

    run = handed_over(tmp_path)
    with pytest.raises(RunTrustError, match="does not match its seal"):
        api.evaluate(run / "config.yaml", model=run / "final_model")
    with pytest.raises(RunTrustError, match="does not match its seal"):
        api.train(run / "config.yaml", [f"run.output_dir={tmp_path / 'new'}"])
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("key, fragment", [("directory", "is a directory"), ("short", "is 5 bytes, not a key"),
                                           ("dangling", "is a dangling symlink"),
                                           ("shared", "is readable or writable by others (mode 644)")])
@pytest.mark.parametrize("command", ["train", "resume", "eval"])
def test_a_key_file_that_cannot_serve_is_named_before_anything_starts(tmp_path, capsys, reached, monkeypatch, key,
                                                                      fragment, command):
    """Findings: STABLEDRL_KEY_FILE naming a directory gave a TypeError after 51 s, a 5-byte key a
    raw RunTrustError traceback after 34 s (both once Ray ran), and a resume with a directory as
    the key said the config was 'edited ... or written by another machine'."""
    run = make_run(tmp_path, {"custom": f"{tmp_path / 'r.py'}:score"})  # sealed under the fixture's key
    path = tmp_path / "bad.key"
    if key == "directory":
        path.mkdir()
    elif key == "short":
        path.write_bytes(b"12345")
        path.chmod(0o600)
    elif key == "shared":  # probing around: a key others can read lets them seal a run they changed
        path.write_bytes(b"k" * 32)
        path.chmod(0o644)
    else:
        path.symlink_to(tmp_path / "nowhere")
    monkeypatch.setenv("STABLEDRL_KEY_FILE", str(path))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({**yaml.safe_load((run / "config.yaml").read_text()),
                                   "run": {"output_dir": str(tmp_path / "new")}}))
    argv = {"train": ["train", "--config", str(job)], "resume": ["train", "--resume", str(run)],
            "eval": ["eval", "--config", str(run / "config.yaml"), "--checkpoint", str(run)]}[command]
    t0 = time.monotonic()
    err = refused(argv, capsys, reached, tmp_path, f"{path} (the key that seals run directories, $STABLEDRL_KEY_FILE)")
    assert fragment in err and "edited" not in err
    assert time.monotonic() - t0 < 10


def test_a_sealed_config_is_still_the_users_to_run(tmp_path, reached):
    """The checks refuse only what is not as the run wrote it: the run's own sealed config, handed
    over with its model, evaluates and trains as usual."""
    run = make_run(tmp_path, {"custom": f"{tmp_path / 'r.py'}:score"})
    (run / "final_model").mkdir()
    assert cli.main(["eval", "--config", str(run / "config.yaml"), "--model", str(run / "final_model")]) == 0
    assert cli.main(["train", "--config", str(run / "config.yaml"), f"run.output_dir={tmp_path / 'new'}"]) == 0
    assert [kind for kind, *_ in reached] == ["eval", "train"]
    assert sealed_text("a: 1\n") != "a: 1\n"

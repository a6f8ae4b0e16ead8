"""Inputs that passed silently or failed cryptically, each now one clear line before work starts:
a prompt that is not text, a timeout no timer can hold, a negative count, an empty data file, a
plan the machine cannot hold."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

import stabledrl.cli.main as cli
from stabledrl.common.config.base import ConfigError
from test_bad_inputs import no_cluster, run_job  # noqa: F401 - the fixture, used by name
from test_config_mistakes import JOB


def surrogate_file(tmp_path: Path) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "\\ud800+1=", "answer": "2"}\n'  # valid JSON: a lone surrogate escape
                    + "".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(4)))
    return path


@pytest.mark.usefixtures("no_cluster")
def test_a_prompt_with_a_lone_surrogate_is_a_bad_row_named_by_file_and_line(tmp_path, capsys):
    """Finding: "\\ud800+1=" (valid JSON) gave a raw TypeError traceback from the tokenizer, naming
    no file or line, even with task.on_bad_row=skip."""
    source = {"kind": "file", "path": str(surrogate_file(tmp_path))}
    code, err = run_job(tmp_path, capsys, task={"source": source, "held_out": 0})
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert f"{source['path']}: line 1: field 'prompt' holds '\\ud800' at character 0, a lone surrogate" in err, err


def test_a_lone_surrogate_row_is_skipped_and_counted_with_skip(tmp_path):
    from stabledrl.common.config.model import ModelConfig
    from stabledrl.common.config.task import parse_task_config
    from stabledrl.common.models.loading import load_model_tokenizer
    from stabledrl.common.tasks import load_task_data

    cfg = parse_task_config({"name": "arithmetic", "held_out": 0, "on_bad_row": "skip",
                             "source": {"kind": "file", "path": str(surrogate_file(tmp_path))}})
    data = load_task_data(cfg, tokenizer=load_model_tokenizer(ModelConfig(preset="tiny-llada")))
    assert len(data.train) == 4 and data.reports[0].skipped == {"not_text": 1}
    assert data.reports[0].examples[0].startswith("line 1: field 'prompt' holds")


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


@pytest.mark.parametrize("flag, value", [("--num-prompts", "-3"), ("--num-prompts", "0"), ("--samples", "-1"),
                                         ("--k", "0"), ("--show", "-2"), ("--workers", "0")])
def test_eval_refuses_a_count_below_its_least(tmp_path, capsys, flag, value):
    """Finding: `eval --num-prompts -3` evaluated 197 of 200 prompts (a slice from the end) and exited 0."""
    with pytest.raises(SystemExit) as done:
        cli.main(["eval", "--config", str(tmp_path / "job.yaml"), "--model", str(tmp_path), flag, value])
    assert done.value.code == 2
    assert f"argument {flag}: {value} is less than" in capsys.readouterr().err


def test_the_python_api_refuses_a_negative_count_too():
    from stabledrl.common.config.base import validate
    from stabledrl.common.config.job import JobConfig
    from stabledrl.evaluation.offline import evaluate_policy

    cfg = validate(JobConfig, JOB)
    with pytest.raises(ConfigError, match="num_prompts must be at least 1, got -3"):
        evaluate_policy(cfg, None, None, num_prompts=-3)


@pytest.mark.parametrize("rows, held_out, fragment", [
    (0, 100, "no rows to train on (read 0)"),
    (5, 100, "task.held_out = 100 leaves no training rows out of its 5 rows"),
])
@pytest.mark.usefixtures("no_cluster")
def test_too_few_rows_name_the_file(tmp_path, capsys, rows, held_out, fragment):
    """Finding: an empty JSONL said "held_out=100 leaves no training rows out of 0", naming no file."""
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(rows)))
    code, err = run_job(tmp_path, capsys, task={"source": {"kind": "file", "path": str(path)}, "held_out": held_out})
    assert code == 2 and err.count("\n") == 1, err
    assert f"stabledrl: {path}: {fragment}" in err, err


def test_the_dry_run_warns_of_a_plan_this_machine_cannot_hold(monkeypatch):
    """Finding: the dry run planned 100000 workers without the refusal a real start gives."""
    from stabledrl.cli.dry_run import dry_run
    from stabledrl.common.config.base import validate
    from stabledrl.common.config.job import JobConfig

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = validate(JobConfig, {**JOB, "rollout": {"num_workers": 100000}, "cluster": {**JOB["cluster"],
                                                                                     "local_num_cpus": 8}})
    out = io.StringIO()
    assert dry_run(cfg, out=out) == 0
    text = out.getvalue()
    assert "WARNING: `stabledrl train` on this machine stops before any actor starts: " in text
    assert "rollout.num_workers (100000) × cluster.rollout.num_cpus (0.5) = 50001 CPUs, but this machine" in text
    assert "has 8" in text
    yaml.safe_load(text)  # the warning is a comment: the output still reads as the config
    small = validate(JobConfig, {**JOB, "cluster": {**JOB["cluster"], "local_num_cpus": 8}})
    out = io.StringIO()
    dry_run(small, out=out)
    assert "WARNING" not in out.getvalue()
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    out = io.StringIO()
    dry_run(cfg, out=out)
    assert "WARNING" not in out.getvalue() and "checked against the cluster at 10.0.0.5:6379" in out.getvalue()


def test_scale_refuses_a_count_below_one_and_an_address_nothing_answers(capsys):
    """Probing around the eval counts: `scale --workers -3` was sent to the job; `scale --address`
    naming no GCS waited minutes in Ray's client retries."""
    import time

    with pytest.raises(SystemExit) as done:
        cli.main(["scale", "--job", "x", "--workers", "-3"])
    assert done.value.code == 2 and "argument --workers: -3 is less than 1" in capsys.readouterr().err
    t0 = time.monotonic()
    assert cli.main(["scale", "--job", "x", "--address", "127.0.0.1:1"]) == 2
    assert "cannot reach the cluster's GCS at 127.0.0.1:1" in capsys.readouterr().err
    assert time.monotonic() - t0 < 30


def test_plot_names_a_directory_without_metrics_and_refuses_a_weight_past_one(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err == f"stabledrl: {tmp_path}: no metrics.jsonl (give a run's output_dir or the file itself)\n", err
    with pytest.raises(SystemExit):
        cli.main(["plot", str(tmp_path), "--out", str(tmp_path / "x.png"), "--smooth", "5"])
    assert "argument --smooth: 5 is not in [0, 1)" in capsys.readouterr().err

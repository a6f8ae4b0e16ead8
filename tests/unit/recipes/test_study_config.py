"""The study config (every run validated up front, method sections merged, seed-major order) and
its report (table, results, figure, the docs/study.md section), built from metrics files alone."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import stabledrl.cli.main as cli
from stabledrl.common.config.base import ConfigError
from stabledrl.recipes.study import load_study_config, load_study_dir, run_config, save_study_config, write_report
from stabledrl.recipes.study.config import merge
from stabledrl.recipes.study.report import publish

REPO = Path(__file__).resolve().parents[3]
STUDY_CPU = REPO / "deploy" / "configs" / "study_cpu.yaml"
STUDY_GPU = REPO / "deploy" / "configs" / "study_gpu.yaml"


def test_merge_replaces_a_section_whose_name_changes_and_merges_otherwise():
    base = {"loss": {"name": "stabledrl", "clip_max": 5.0}, "learner": {"optimizer": {"lr": 1e-4, "grad_clip": 1.0}}}
    out = merge(base, {"loss": {"name": "grpo", "clip_eps": 0.2}, "learner": {"optimizer": {"lr": 5e-5}}})
    assert out["loss"] == {"name": "grpo", "clip_eps": 0.2}  # no stabledrl field leaks into grpo
    assert out["learner"] == {"optimizer": {"lr": 5e-5, "grad_clip": 1.0}}
    assert merge(base, {"loss": {"clip_max": 3.0}})["loss"] == {"name": "stabledrl", "clip_max": 3.0}
    assert base["loss"]["clip_max"] == 5.0  # the base is not modified


@pytest.mark.parametrize("path", [STUDY_CPU, STUDY_GPU])
def test_the_checked_in_studies_validate_every_run(path):
    study = load_study_config(path)
    assert set(study.methods) == {"grpo", "stabledrl", "stabledrl+dipod", "drpo"} and len(study.seeds) >= 3
    losses = {m: run_config(study, m, study.seeds[0]).loss for m in study.methods}
    assert losses["stabledrl+dipod"].name == "dipod" and losses["stabledrl+dipod"].base.name == "stabledrl"
    first = run_config(study, "grpo", study.seeds[0])
    assert first.estimator.masks == "independent" and first.algorithm.inner_iterations >= 2  # the blamed regime
    assert first.warmstart is not None and first.eval.every > 0


def test_runs_are_seed_major_and_each_has_its_own_directory_and_no_checkpoint(tmp_path):
    study = load_study_config(STUDY_CPU, [f"output_dir={tmp_path}", "seeds=[3, 4]"])
    assert study.runs[:4] == [("grpo", 3), ("stabledrl", 3), ("stabledrl+dipod", 3), ("drpo", 3)]
    cfg = run_config(study, "drpo", 4, model_path=tmp_path / "warm")
    assert cfg.run.seed == 4 and cfg.run.output_dir == tmp_path / "drpo" / "seed4"
    assert not cfg.run.save_final_checkpoint and not cfg.run.export_final and cfg.warmstart is None
    assert cfg.model.path == tmp_path / "warm" and cfg.model.preset is None


def test_settings_line_says_per_method_for_what_a_method_overrides():
    from stabledrl.recipes.study.report import settings_line

    shared = settings_line(load_study_config(STUDY_CPU))
    assert "μ = 4" in shared and "per method" not in shared
    study = load_study_config(STUDY_CPU, ["methods.grpo.algorithm.inner_iterations=1"])
    line = settings_line(study)
    assert "μ per method" in line and "μ = " not in line and "η = 1" in line and "lr 0.0001" in line


@pytest.mark.parametrize("override, words", [
    ("methods.grpo.loss.clip_eps=-1", ["methods.grpo", "clip_eps"]),
    ("methods.drpo.loss.name=nope", ["methods.drpo", "loss"]),
    ("seeds=[1, 1]", ["seeds"]),
    ("job.algorithm.group_size=1", ["group_size"]),
    ("concurrency=0", ["concurrency"]),
])
def test_a_bad_study_fails_naming_the_field(override, words):
    with pytest.raises(ConfigError) as e:
        load_study_config(STUDY_CPU, [override])
    assert all(w in str(e.value) for w in words), str(e.value)


def test_cli_study_dry_run_lists_the_runs_and_a_bad_override_exits_2(capsys):
    assert cli.main(["study", "--config", str(STUDY_CPU), "--dry-run", "seeds=[0]"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("runs: grpo/seed0, stabledrl/seed0, stabledrl+dipod/seed0, drpo/seed0")
    assert cli.main(["study", "--config", str(STUDY_CPU), "methods.grpo.loss.clip_eps=abc"]) == 2
    assert "methods.grpo" in capsys.readouterr().err


def fake_run(directory: Path, rewards: list[float], final_accuracy: float) -> None:
    directory.mkdir(parents=True)
    lines = [{"step": 0, "eval/pass@1": 0.33}]
    lines += [{"step": i, "rollout/reward_mean": r, "train/grad_norm_max": 1.0 + i % 3, "train/ratio/max": 2.0,
               "train/clip/frac_upper": 0.1, "staleness/mean": 1.0, "time/step": 0.1} for i, r in enumerate(rewards, 1)]
    lines.append({"step": len(rewards), "eval/pass@1": final_accuracy})
    (directory / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def test_report_from_files_alone(tmp_path):
    study = load_study_config(STUDY_CPU, [f"output_dir={tmp_path / 'study'}", "seeds=[0, 1]", "job.run.steps=30",
                                          f"report.markdown={tmp_path / 'STUDY.md'}",
                                          f"report.figure={tmp_path / 'docs' / 'cpu.png'}"])
    save_study_config(study)
    for method, seed in study.runs:
        collapsing = method == "grpo" and seed == 1
        fake_run(study.output_dir / method / f"seed{seed}", [0.4] * 10 + ([0.0] if collapsing else [0.4]) * 20,
                 0.05 if collapsing else 0.4)
    (tmp_path / "STUDY.md").write_text(
        "# Study\n\nintro\n\n<!-- study:cpu -->\nold table\n<!-- /study:cpu -->\n\nafter\n"
    )
    reloaded = load_study_dir(study.output_dir)  # study.json makes the directory self-describing
    assert reloaded.runs == study.runs
    written = write_report(reloaded, command="stabledrl study --report X")
    table = (study.output_dir / "table.md").read_text()
    assert "| grpo | 2 | 33.0 ± 0.0 | 22.5 ± 17.5 |" in table and "| 1/2 |" in table
    results = json.loads((study.output_dir / "results.json").read_text())
    assert len(results["runs"]) == 8 and sum(r["collapsed"] for r in results["runs"]) == 1
    assert written["figure"] == study.output_dir / "figure.png" and (tmp_path / "docs" / "cpu.png").is_file()
    md = (tmp_path / "STUDY.md").read_text()
    assert "old table" not in md and md.startswith("# Study\n\nintro") and md.rstrip().endswith("after")
    assert "Command: `stabledrl study --report X`" in md and "](docs/cpu.png)" in md and "| 1/2 |" in md


def test_report_redrawn_from_a_directory_keeps_the_recorded_statuses_and_timing(tmp_path):
    study = load_study_config(STUDY_CPU, [f"output_dir={tmp_path / 'study'}", "seeds=[0]", "job.run.steps=30",
                                          "report=null"])
    save_study_config(study)
    for method, seed in study.runs:
        fake_run(study.output_dir / method / f"seed{seed}", [0.4] * 30, 0.4)
    write_report(study, statuses={run: "finished" for run in study.runs}, timing={"total": 123.0})
    with (study.output_dir / "outcomes.jsonl").open("w") as f:  # the runner's record: drpo was stopped
        f.write(json.dumps({"method": "drpo", "seed": 0, "status": "stopped", "wall_s": 1.0, "error": ""}) + "\n")
    write_report(load_study_dir(study.output_dir), figure=False)
    table = (study.output_dir / "table.md").read_text()
    assert "| drpo | 1 (1 unfinished) |" in table and "| grpo | 1 |" in table
    assert "Not finished: drpo/seed0 (stopped)" in table and "total 123 s" in table
    assert json.loads((study.output_dir / "results.json").read_text())["timing"] == {"total": 123.0}


def test_publish_appends_a_missing_section(tmp_path):
    study = load_study_config(STUDY_CPU, [f"report.markdown={tmp_path / 'S.md'}", "report.section=gpu",
                                          f"report.figure={tmp_path / 'f.png'}"])
    (tmp_path / "S.md").write_text("# S\n")
    publish(study, "| table |\n", None, None)
    assert (tmp_path / "S.md").read_text() == "# S\n\n<!-- study:gpu -->\n\n| table |\n\n<!-- /study:gpu -->\n"

"""The stability study: GRPO, StableDRL, StableDRL + DiPOD and DRPO on one model, task and set
of seeds, in the regime docs/algorithms.md §1 blames (independent masks, few Monte-Carlo draws,
several inner iterations, stale samples), with a table and a figure of the outcome.

    stabledrl study --config deploy/configs/study_cpu.yaml     (make study)
    stabledrl study --report runs/study_cpu                    (table + figure from the files)

config.py: the study config; runner.py: warm start, Ray, the runs (in lanes when concurrent);
analysis.py: collapses, spikes, tables; report.py: table.md, results.json, figure.png, the docs/study.md section.
"""
from stabledrl.recipes.study.config import CollapseRule, StudyConfig, load_study_config, run_config
from stabledrl.recipes.study.report import load_study_dir, load_study_file, save_study_config, write_report
from stabledrl.recipes.study.runner import StudyResult, run_study

__all__ = [
    "CollapseRule",
    "StudyConfig",
    "StudyResult",
    "load_study_config",
    "load_study_dir",
    "load_study_file",
    "run_config",
    "run_study",
    "save_study_config",
    "write_report",
]

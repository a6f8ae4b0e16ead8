"""Every shipped job config checkpoints periodically: a run stopped part-way (Ctrl-C, a lost node)
can be resumed from a checkpoint at most ``checkpoint_every`` steps back. Study configs run many
short runs that keep metrics only (stabledrl/recipes/study/config.py) and are re-run, not resumed."""
from __future__ import annotations

from pathlib import Path

import pytest

from stabledrl.common.config.job import load_job_config

CONFIGS = sorted(p for p in (Path(__file__).resolve().parents[3] / "deploy" / "configs").glob("*.yaml")
                 if not p.name.startswith("study_"))


def test_the_shipped_configs_are_all_here():
    assert {p.name for p in CONFIGS} >= {"quickstart.yaml", "llada8b_1node.yaml", "trado8b_1node.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_checkpoints_periodically(path):
    cfg = load_job_config(path)
    assert 0 < cfg.run.checkpoint_every < cfg.run.steps, (path.name, cfg.run.checkpoint_every, cfg.run.steps)
    assert cfg.run.save_final_checkpoint

"""docs/rewards.md's example is the one in docs/examples/rewards/ (the page shows the files as they
are), and its functions score its data as the page says: TRL's form, None for a word it does not
apply to, the per-completion form, summed with their weights. tests/e2e/test_reward_example.py runs
it through `stabledrl train`."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from stabledrl.common.config.job import load_job_config
from stabledrl.common.sandbox.scorer import RewardScorer
from stabledrl.common.tasks import load_task_data

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "docs" / "examples" / "rewards"
PAGE = (ROOT / "docs" / "rewards.md").read_text()


def test_the_page_shows_the_example_files_as_they_are():
    python = re.findall(r"```python\n(.*?)```", PAGE, re.S)
    assert python == [(EXAMPLE / "rewards.py").read_text()]
    shown = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", PAGE, re.S)[0])
    assert shown["task"] == yaml.safe_load((EXAMPLE / "job.yaml").read_text())["task"]
    assert "stabledrl train --config docs/examples/rewards/job.yaml" in PAGE


def test_the_example_functions_score_its_data(monkeypatch):
    monkeypatch.chdir(ROOT)  # the config's paths are relative to the repository root
    cfg = load_job_config(EXAMPLE / "job.yaml", ["task.reward.isolation=inline"])
    data = load_task_data(cfg.task)
    rows = {row.record["answer"][::-1]: row for row in data.train + data.held_out}
    cat, fish = rows["cat"], rows["fish"]
    assert data.task.render_prompt(cat) == "Reverse the word cat. Answer:"
    with RewardScorer(cfg.task, data.task) as scorer:
        got = scorer.score_batch(["tac", "tacc", "hsif", "hsfi x"], [cat, cat, fish, fish])
    assert got[0].parts == {"exact": 1.0, "brevity": 0.0, "custom": 1.0}  # hard_words: None for an easy word
    assert got[1].total == pytest.approx(-0.1)
    assert got[2].parts == {"exact": 1.0, "hard_words": 1.0, "brevity": 0.0, "custom": 1.5}
    assert got[3].total == pytest.approx(0.5 * 0.5 - 0.2)  # 2 of 4 letters in place, 2 characters too many
    assert scorer.stats.failed == 0

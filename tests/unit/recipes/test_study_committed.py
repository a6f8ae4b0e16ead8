"""The GPU study's committed runs (docs/study/gpu_runs/*.tar.xz) still give, through today's
analysis code, the tables STUDY.md shows: a change to the collapse rule, the summaries or the table
format, or a hand edit of a generated section, fails here until the sections are regenerated
(STUDY.md, "Repeat it")."""
from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from stabledrl.recipes.study import load_study_dir, write_report
from stabledrl.recipes.study.report import section_pattern

REPO = Path(__file__).resolve().parents[3]
ARCHIVES = sorted((REPO / "docs" / "study" / "gpu_runs").glob("*.tar.xz"))


def test_every_gpu_setting_is_committed():
    assert {a.name for a in ARCHIVES} == {f"{m}_lr{lr}.tar.xz" for m in ("indep", "shared") for lr in ("2e-5", "5e-5")}


@pytest.mark.parametrize("archive", ARCHIVES, ids=lambda p: p.name.split(".")[0])
def test_committed_runs_regenerate_the_study_md_section(archive, tmp_path):
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    (directory,) = tmp_path.iterdir()
    study = load_study_dir(directory)
    assert len(list(directory.glob("*/seed*/metrics.jsonl"))) == len(study.runs) == 12
    section = study.report.section
    written = write_report(study.model_copy(update={"report": None}), figure=False)
    table = written["table"].read_text().rstrip()
    match = section_pattern(section).search((REPO / "STUDY.md").read_text())
    assert match, f"STUDY.md has no section {section!r}"
    assert table in match.group(0)
    assert all(r.finished for r in written["runs"])
    assert (REPO / study.report.figure).is_file()

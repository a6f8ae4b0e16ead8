"""The repository holds the product, its tests and its benchmarks, not the history of making them:
no tracked file names an issue (by its number or as the one at hand), a host by a letter of its own,
a calendar date or a measuring session's calls to a GPU machine. Measurement
records (tests/benchmarks/results/) are data and carry their own timestamps; git keeps the history."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the words are split so that this file does not match itself
PATTERNS = {
    "an issue number": re.compile(r"\biss" + r"ues?\s*#?\d+", re.IGNORECASE),
    "a lettered host": re.compile(r"\b[Hh]" + r"osts? [A-Z]\b(?!['\w])"),
    "a calendar date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    "an issue referred to": re.compile(r"\bthe iss" + r"ue's\b", re.IGNORECASE),
    "a session's GPU call": re.compile(r"\bdevice c" + r"alls?\b", re.IGNORECASE),
}
DATA = ("tests/benchmarks/results/",)  # measurement records: data with their own timestamps
BINARY = (".png", ".jpg", ".gz", ".xz", ".tgz", ".whl", ".pt", ".safetensors", ".parquet")


def tracked_files() -> list[str]:
    """Every file git tracks here (on a copy without git: every file under the repository, build and
    run outputs left out)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=30)
        return [p for p in out.stdout.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "runs", ".cache", "__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist"}
        return [str(p.relative_to(REPO)) for p in REPO.rglob("*")
                if p.is_file() and not skip & set(p.relative_to(REPO).parts) and ".egg-info" not in str(p)]


def findings(files: list[str]) -> list[str]:
    out = []
    for name in files:
        if name.startswith(DATA) or name.endswith(BINARY) or not (REPO / name).is_file():
            continue
        text = (REPO / name).read_text(errors="replace")
        for what, pattern in PATTERNS.items():
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                out.append(f"{name}:{line}: {what} ({match.group(0)!r})")
    return out


def test_no_tracked_file_names_an_issue_a_lettered_host_or_a_date():
    assert findings(tracked_files()) == []


def test_the_check_finds_each_kind(tmp_path, monkeypatch):
    monkeypatch.setattr("test_no_notebook.REPO", tmp_path)
    (tmp_path / "a.py").write_text("# as measured for iss" + "ue 20 on h" + "ost J, 2026" + "-11-28 (the iss"
                                   + "ue's figure, dev" + "ice call 3)\nx = 1\n")
    (tmp_path / "fine.md").write_text("ZeRO-3 on a host of 4 GPUs; a hostname; issues are tracked elsewhere\n")
    (tmp_path / "tests/benchmarks/results").mkdir(parents=True)
    (tmp_path / "tests/benchmarks/results/r.json").write_text('{"started": "2026' + '-11-28"}')
    found = findings(["a.py", "fine.md", "tests/benchmarks/results/r.json"])
    assert [f.split(": ", 1)[1].split(" (")[0] for f in found] == [
        "an issue number", "a lettered host", "a calendar date", "an issue referred to", "a session's GPU call"]
    assert all(f.startswith("a.py:1:") for f in found)

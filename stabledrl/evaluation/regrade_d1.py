"""`stabledrl eval --regrade-d1 PATH`: grade d1's own generation files with this project's graders.

    stabledrl eval --regrade-d1 ~/d1                      # d1's checkout: its eval/eval_baselines
    stabledrl eval --regrade-d1 ~/d1/eval/results --graders math-verify,latex --out regrade.json

d1's ``eval.py`` writes ``<setup>_<rank>_generations.json`` files (``setup`` is
``<dataset>_<model>_<length>_<steps>``), each with a ``generations`` list of ``question``,
``generations`` (the raw decoded window) and ``ground_truth`` (as d1 read it: a float or null for
GSM8K, the answer string for MATH, ``[numbers, target]`` for Countdown, the solution for Sudoku).
Here every completion is decided by ``stabledrl.common.tasks.graders``'s d1 graders and the accuracies are
summed per setup as d1's ``parse_and_get_acc.py`` sums them (all ranks' files together), so the
table printed must be d1's. ``--graders`` adds MATH500 columns by other graders. ``--out`` writes
the table and every decision as JSON (to compare completion by completion). Nothing of d1 is
imported: only its JSON files are read.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional, Sequence

from stabledrl.common.config.base import ConfigError
from stabledrl.common.tasks import graders as g

_SETUP = re.compile(r"(.+)_\d+_generations\.json$")
_PUZZLE = re.compile(r"Sudoku puzzle: ([0-9]{16})")
_NUMBERS = re.compile(r"Numbers: \[([\d, ]+)\]", re.IGNORECASE)
_TARGET = re.compile(r"Target: (\d+)", re.IGNORECASE)


def generation_files(path: str) -> list[Path]:
    """d1's generation files under ``path``: a d1 checkout (its eval/eval_baselines) or a directory."""
    root = Path(path).expanduser()
    for directory in (root / "eval" / "eval_baselines", root):
        files = sorted(p for p in directory.glob("*_generations.json") if _SETUP.match(p.name))
        if files:
            return files
    raise ConfigError(f"--regrade-d1 {path}: no d1 generation files (*_<rank>_generations.json) there or in "
                      f"{root / 'eval' / 'eval_baselines'}")


def task_of(setup: str) -> Optional[str]:
    """The benchmark of a setup name, tested in d1's order."""
    for key, task in (("gsm", "gsm8k"), ("math", "math500"), ("countdown", "countdown"), ("sudoku", "sudoku")):
        if key in setup:
            return task
    return None


def _sudoku_puzzle(question: str) -> str:
    if len(question) >= 16 and question[:16].isdigit():
        return question[:16]
    found = _PUZZLE.search(question)
    if not found:
        raise ValueError(f"no 16-digit puzzle in the question {question[:60]!r}")
    return found.group(1)


def _countdown_truth(item: dict[str, Any]) -> tuple[list[int], Optional[float]]:
    truth = item.get("ground_truth", [])
    if isinstance(truth, list) and len(truth) == 2:
        return list(truth[0]), truth[1]
    question = item.get("question", "")
    numbers = _NUMBERS.search(question)
    target = _TARGET.search(question)
    return ([int(n.strip()) for n in numbers.group(1).split(",")] if numbers else [],
            int(target.group(1)) if target else None)


def decide(task: str, item: dict[str, Any], math_graders: Sequence[str] = ()) -> dict[str, Any]:
    """One completion of a d1 file, decided by the d1 grader (and the extra MATH graders)."""
    text = item.get("generations", "")
    truth = item.get("ground_truth")
    extra: dict[str, float] = {}
    if task == "gsm8k":
        grade = g.gsm8k_decision(text, truth)
    elif task == "math500":
        truth = truth if truth is not None else ""
        answer = g.math_answer(text)
        grade = g.Grade(float(answer is not None and g.math_is_equiv(answer, truth)), 1.0, answer)
        for name in math_graders:
            equal = g.MATH_GRADERS[name][0]
            extra[name] = float(bool(answer) and equal(answer, truth))
    elif task == "countdown":
        numbers, target = _countdown_truth(item)
        grade = g.countdown_decision(text, numbers, target)
    else:
        grade = g.sudoku_decision(text, _sudoku_puzzle(item.get("question", "")), truth)
    return {"correct": grade.correct, "total": grade.total, "answer": grade.answer, **({"by": extra} if extra else {})}


def regrade(files: Sequence[Path], math_graders: Sequence[str] = ()) -> dict[str, Any]:
    """Per setup: correct, total, accuracy (%) as d1 sums them, and every decision (file, index)."""
    for name in math_graders:
        g.check_math_grader(name)
    setups: dict[str, dict[str, Any]] = defaultdict(lambda: {"correct": 0.0, "total": 0.0, "completions": 0,
                                                             "by": defaultdict(float), "decisions": []})
    for path in files:
        setup = _SETUP.match(path.name).group(1)
        task = task_of(setup)
        if task is None:
            continue
        s = setups[setup]
        s["task"] = task
        for i, item in enumerate(json.loads(path.read_text()).get("generations", [])):
            d = decide(task, item, math_graders if task == "math500" else ())
            s["correct"] += d["correct"]
            s["total"] += d["total"]
            s["completions"] += 1
            for name, v in d.get("by", {}).items():
                s["by"][name] += v
            s["decisions"].append({"file": path.name, "index": i, **d})
    table = {}
    for setup, s in sorted(setups.items()):
        # d1 divides by the completions, except Sudoku (empty cells)
        denominator = s["total"] if s["task"] == "sudoku" else s["completions"]
        table[setup] = {"task": s["task"], "correct": s["correct"], "denominator": denominator,
                        "accuracy": 100.0 * s["correct"] / denominator if denominator else 0.0,
                        "by": {n: 100.0 * v / denominator for n, v in s["by"].items()}, "decisions": s["decisions"]}
    return table


def regrade_command(path: str, math_graders: Sequence[str] = (), out: Optional[str] = None) -> dict[str, Any]:
    files = generation_files(path)
    table = regrade(files, math_graders)
    names = list(math_graders)
    head = f"{'setup (task_model_length_steps)':<40} {'d1 grader':>10}" + "".join(f" {n:>12}" for n in names)
    print(f"regrading {len(files)} d1 generation files from {files[0].parent}")
    print(head)
    print("-" * len(head))
    for setup, row in table.items():
        extra = "".join(f" {row['by'][n]:>11.2f}%" if row["task"] == "math500" else f" {'-':>12}" for n in names)
        print(f"{setup:<40} {row['accuracy']:>9.2f}%{extra}")
    if out:
        record = {"source": str(files[0].parent), "graders": {"d1": "stabledrl.common.tasks.graders (d1)",
                                                               **{n: g.MATH_GRADERS[n][1] for n in names}},
                  "versions": g.grader_versions(names), "setups": table}
        Path(out).write_text(json.dumps(record, indent=1) + "\n")
        print(f"decisions written to {out}")
    return table

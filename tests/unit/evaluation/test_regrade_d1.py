"""`stabledrl eval --regrade-d1 PATH` (stabledrl/evaluation/regrade_d1.py): d1's generation files graded by this
project's d1 graders and summed as d1's parse_and_get_acc.py sums them (every rank's file of a
setup together; Sudoku over empty cells). The files here are hand-made in d1's format."""
from __future__ import annotations

import json

import pytest

from stabledrl.cli.main import main
from stabledrl.evaluation.regrade_d1 import regrade, generation_files
from stabledrl.common.config.base import ConfigError

SUDOKU_Q = "Solve the following Sudoku puzzle: 3102200002100320\n"


def write(directory, name, items):
    (directory / name).write_text(json.dumps({"generations": [
        {"question": q, "generations": g, "ground_truth": t} for q, g, t in items]}))


@pytest.fixture
def d1_files(tmp_path):
    out = tmp_path / "eval" / "eval_baselines"
    out.mkdir(parents=True)
    write(out, "gsm8k_instruct_128_64_0_generations.json", [("q", "\\boxed{18}<|eot_id|>", 18.0),
                                                             ("q", "\\boxed{-10}", None)])  # d1: never right
    write(out, "gsm8k_instruct_128_64_1_generations.json", [("q", "<answer>1,080</answer>", 1080.0)])
    write(out, "math500_instruct_128_64_0_generations.json", [("q", "\\boxed{\\frac{3}{24}}", "\\frac{1}{8}"),
                                                               ("q", "\\boxed{0.5}", "\\frac{1}{2}")])
    write(out, "countdown_instruct_128_64_0_generations.json", [("q", "\\boxed{-53 + 55 + 49}", [[49, 55, 53], 51])])
    write(out, "sudoku_instruct_128_64_0_generations.json", [(SUDOKU_Q, "<answer>3142243142131324</answer>",
                                                              "3142243142131324"),
                                                             (SUDOKU_Q, "<answer>\n314224314213<|eot_id|>",
                                                              "3142243142131324")])
    return tmp_path


def test_a_d1_checkout_is_regraded_setup_by_setup(d1_files):
    table = regrade(generation_files(str(d1_files)), ["latex"])
    acc = {k: round(v["accuracy"], 6) for k, v in table.items()}
    assert acc == {"gsm8k_instruct_128_64": round(100 / 3, 6), "math500_instruct_128_64": 50.0,
                   "countdown_instruct_128_64": 100.0, "sudoku_instruct_128_64": 100 * 14 / 16}
    assert table["math500_instruct_128_64"]["by"] == {"latex": 100.0}  # the LaTeX equivalence reduces 3/24
    assert [d["correct"] for d in table["gsm8k_instruct_128_64"]["decisions"]] == [1.0, 0.0, 0.0]


def test_the_command_prints_the_table_and_refuses_a_place_without_files(d1_files, tmp_path, capsys):
    out = tmp_path / "regrade.json"
    assert main(["eval", "--regrade-d1", str(d1_files), "--graders", "latex", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "math500_instruct_128_64" in printed and "50.00%" in printed
    record = json.loads(out.read_text())
    assert record["versions"]["stabledrl"] and "latex" in record["graders"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no d1 generation files"):
        generation_files(str(empty))
    assert main(["eval", "--regrade-d1", str(empty)]) == 2
    assert main(["eval", "--regrade-d1", str(d1_files), "--graders", "sympy"]) == 2

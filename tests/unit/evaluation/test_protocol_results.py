"""A protocol evaluation's bookkeeping (stabledrl/evaluation/protocol.py, stabledrl/evaluation/results.py): the
work units cover every (benchmark, length, row) once, results append per prompt and survive a kill,
a rerun with other settings is refused, the table is Σ correct / Σ total per cell, and a checkpoint
is verified before DeepSpeed reads it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from stabledrl.common.config.protocol import ProtocolConfig
from stabledrl.common.tasks.graders import Grade
from stabledrl.common.tokenizer import build_char_tokenizer
from stabledrl.evaluation.protocol import Unit, grade_unit, pending_units, prepare, unit_request
from stabledrl.evaluation.results import ResultLog, ResultsMismatch, protocol_table, record, table_markdown

TOK = build_char_tokenizer()
SOLUTION = "3142243142131324"  # of puzzle 3102200002100320: 8 empty cells
SOLUTION_2 = "2143432114323214"  # of puzzle 2100432004000000: 10 empty cells


def protocol(tmp_path: Path, **settings) -> ProtocolConfig:
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text("".join(json.dumps({"question": f"Q{i}?", "answer": f"#### {i}"}) + "\n" for i in range(5)))
    sudoku = tmp_path / "sudoku.csv"
    sudoku.write_text(f"Puzzle,Solution\n3102200002100320,{SOLUTION}\n2100432004000000,{SOLUTION_2}\n")
    benchmarks = {"gsm8k": {"source": {"kind": "file", "path": str(gsm), "columns": {"prompt": "question"}}},
                  "sudoku": {"source": {"kind": "file", "path": str(sudoku), "columns": {"puzzle": "Puzzle",
                                                                                      "solution": "Solution"}},
                             "num_prompts": 2}}
    return ProtocolConfig(**{"benchmarks": benchmarks, "gen_lengths": [32, 64], "batch_size": 2, **settings})


def test_units_cover_every_row_and_length_once_and_skip_what_is_done(tmp_path):
    prepared = prepare(protocol(tmp_path), TOK)
    keys = lambda units: [(u.benchmark, u.gen_length, prepared.benchmarks[u.benchmark].rows[i].prompt_id)  # noqa: E731
                          for u in units for i in u.indices]
    units = pending_units(prepared, set())
    everything = keys(units)
    assert len(everything) == len(set(everything)) == (5 + 2) * 2
    assert all(len(u.indices) <= 2 for u in units) and units[0].gen_length == 64  # longest generations first
    done = set(everything[::3])
    rest = keys(pending_units(prepared, done))
    assert sorted(rest) == sorted(set(everything) - done)
    prompts, seeds, sampler = unit_request(prepared, units[0])
    assert (sampler.gen_length, sampler.steps, sampler.block_length, sampler.temperature) == (64, 32, 32, 0.0)
    assert prompts[0] == prepared.prompts[units[0].benchmark][units[0].indices[0]] and len(seeds) == len(prompts)


def graded_log(tmp_path: Path, prepared) -> ResultLog:
    """Every unit graded with known completions: GSM8K right on rows 0 and 3 at length 32 and on row 0 at
    64; Sudoku: the first puzzle solved, the second with 2 of its 10 empty cells right (its first row)."""
    log = ResultLog.open(tmp_path / "out", prepared.header("policy X"))
    hashes = prepared.prompt_hashes()
    for unit in pending_units(prepared, set()):
        rows = prepared.benchmarks[unit.benchmark].rows
        right = {32: {"gsm8k-0", "gsm8k-3"}, 64: {"gsm8k-0"}}[unit.gen_length]
        texts = []
        for i in unit.indices:
            row = rows[i]
            if unit.benchmark == "gsm8k":
                texts.append(f"\\boxed{{{row.answer if row.prompt_id in right else 99}}}")
            else:
                texts.append(f"<answer>{SOLUTION}</answer>" if row.meta["solution"] == SOLUTION
                             else f"<answer>{SOLUTION_2[:4]}</answer>")
        log.append(grade_unit(prepared, unit, texts, hashes))
    return log


def test_the_table_is_the_share_of_right_units_per_benchmark_and_length(tmp_path):
    prepared = prepare(protocol(tmp_path), TOK)
    log = graded_log(tmp_path, prepared)
    table = protocol_table(prepared.header("policy X"), prepared.benchmarks, [32, 64], log.records)
    gsm, sudoku = table["rows"]
    assert gsm["results"]["32"]["accuracy"] == pytest.approx(100 * 2 / 5)
    assert gsm["results"]["64"]["accuracy"] == pytest.approx(100 * 1 / 5)
    # 8 of 8 empty cells right in the first puzzle, 2 of 10 in the second: cells over the whole set (10 / 18),
    # not the mean of the puzzles' shares (60%)
    assert sudoku["results"]["32"]["accuracy"] == pytest.approx(100 * 10 / 18) and sudoku["prompts"] == 2
    markdown = table_markdown(table)
    assert "| Benchmark | Prompts | 32 | 64 |" in markdown and "| GSM8K | 5 | 40.0 | 20.0 |" in markdown
    assert "| Sudoku | 2 | 55.6 | 55.6 |" in markdown


def test_results_survive_a_kill_and_a_rerun_skips_them(tmp_path):
    prepared = prepare(protocol(tmp_path), TOK)
    log = graded_log(tmp_path, prepared)
    path = log.out_dir / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:5]) + lines[5][:20])  # killed while writing line 6
    again = ResultLog.open(log.out_dir, prepared.header("policy X"))
    assert len(again.done()) == 5 and path.read_text() == "".join(lines[:5])  # the torn line is gone
    todo = pending_units(prepared, again.done())
    assert sum(len(u.indices) for u in todo) == 14 - 5
    again.append([record("gsm8k", 32, "gsm8k-9", "h", Grade(1.0, 1.0, "1"), "\\boxed{1}")])
    assert len(ResultLog.open(log.out_dir, prepared.header("policy X")).done()) == 6


def test_a_rerun_with_other_settings_or_prompts_is_refused(tmp_path):
    prepared = prepare(protocol(tmp_path), TOK)
    log = graded_log(tmp_path, prepared)
    with pytest.raises(ResultsMismatch, match="policy: stored 'policy X', now 'policy Y'"):
        ResultLog.open(log.out_dir, prepared.header("policy Y"))
    greedy_off = prepare(protocol(tmp_path, temperature=0.5), TOK)
    with pytest.raises(ResultsMismatch, match="decoding"):
        ResultLog.open(log.out_dir, greedy_off.header("policy X"))
    fewer = prepare(protocol(tmp_path, gen_lengths=[32]), TOK)  # a narrower rerun of the same settings is fine
    assert ResultLog.open(log.out_dir, fewer.header("policy X")).done() == log.done()
    reworded = prepare(protocol(tmp_path), TOK)
    reworded.prompts["gsm8k"][0] = reworded.prompts["gsm8k"][0] + [5]
    with pytest.raises(ResultsMismatch, match="other prompts"):
        ResultLog.open(log.out_dir, reworded.header("policy X")).check_prompts(reworded.prompt_hashes())


def test_grade_unit_grades_each_completion_against_its_own_row(tmp_path):
    prepared = prepare(protocol(tmp_path), TOK)
    unit = Unit("gsm8k", 32, (4, 1))
    out = grade_unit(prepared, unit, ["\\boxed{4}", "\\boxed{4}"], prepared.prompt_hashes())
    assert [(r["prompt_id"], r["correct"]) for r in out] == [("gsm8k-4", 1.0), ("gsm8k-1", 0.0)]


def test_a_checkpoint_is_verified_before_deepspeed_reads_it(tmp_path):
    from stabledrl.evaluation.offline import checkpoint_weights
    from stabledrl.common.trust.checkpoint_files import CheckpointError
    from stabledrl.coordinator.runtime.checkpoint import write_state

    tag = tmp_path / "checkpoints" / "step2"
    tag.mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(2)}}, tag / "mp_rank_00_model_states.pt")
    (tag.parent / "latest").write_text("step2")
    with pytest.raises(CheckpointError, match="coordinator.json"):
        checkpoint_weights(tmp_path)  # a tag the job never finished writing
    write_state(tag, {"format": 2, "step": 2, "config": {}, "parameter_shapes": {"w": [2]}})
    with (tag / "mp_rank_00_model_states.pt").open("ab") as f:
        f.write(b"appended")
    with pytest.raises(CheckpointError, match="manifest says"):
        checkpoint_weights(tmp_path / "checkpoints")  # changed after the save


def test_other_math_graders_get_their_own_rows_and_the_header_names_every_grader(tmp_path):
    math = tmp_path / "math.jsonl"
    math.write_text("".join(json.dumps({"problem": f"P{i}", "answer": a}) + "\n"
                            for i, a in enumerate(["\\frac{1}{8}", "12", "5"])))
    cfg = ProtocolConfig(benchmarks={"math500": {"source": {"kind": "file", "path": str(math),
                                                            "columns": {"prompt": "problem"}}}},
                         gen_lengths=[32], math_graders=["latex"])
    prepared = prepare(cfg, TOK)
    header = prepared.header("policy X")
    assert set(header["graders"]) == {"gsm8k", "math500", "countdown", "sudoku", "math500[latex]"}
    assert "is_equiv" in header["graders"]["math500"] and "stabledrl" in header["grader_versions"]
    log = ResultLog.open(tmp_path / "out", header)
    hashes = prepared.prompt_hashes()
    # d1's grader: only the last is right; the LaTeX equivalence also takes 3/24 and "12 cm"
    texts = ["\\boxed{\\frac{3}{24}}", "\\boxed{12 cm}", "\\boxed{5}"]
    for unit in pending_units(prepared, set()):
        log.append(grade_unit(prepared, unit, [texts[i] for i in unit.indices], hashes))
    table = protocol_table(json.loads((tmp_path / "out" / "run.json").read_text()), prepared.benchmarks, [32],
                           log.records)
    cells = {row["benchmark"]: row["results"]["32"]["correct"] for row in table["rows"]}
    assert cells == {"math500": 1.0, "math500[latex]": 3.0}
    assert "MATH500 (latex grader)" in table_markdown(table)
    with pytest.raises(ResultsMismatch, match="graders"):
        ResultLog.open(tmp_path / "out", prepare(cfg.model_copy(update={"math_graders": []}), TOK).header("policy X"))

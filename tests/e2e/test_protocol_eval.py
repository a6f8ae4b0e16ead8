"""`stabledrl eval --protocol d1` through Ray actors on CPU (stabledrl/evaluation/protocol_command.py,
stabledrl/evaluation/protocol.py).

A policy double whose answer is forced per (prompt, generation length) goes through the real
sampler on two EvalWorker actors: the table must equal the hand-computed accuracies, every
(benchmark, length, prompt) must be graded exactly once, and a rerun after a kill (on one worker)
must skip what was graded and give the same table. The command itself runs on the tiny LLaDA preset
(one worker) and prints one column per generation length."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import PretrainedConfig

from stabledrl.common.config.base import validate
from stabledrl.common.config.job import JobConfig
from stabledrl.common.config.protocol import ProtocolConfig
from stabledrl.common.models.base import DiffusionPolicy, FamilySpec
from stabledrl.common.tokenizer import build_char_tokenizer
from stabledrl.evaluation.protocol import pending_units, prepare, run_units

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("cluster")]
RAY_CPUS = 2  # the logical CPUs of its Ray instance (tests/e2e/conftest.py)
TOK = build_char_tokenizer()
SOLUTION, SOLUTION_2 = "3142243142131324", "2143432114323214"  # of puzzles with 8 and 10 empty cells


class ForcedAnswers(nn.Module):
    """Puts all its mass on a fixed completion per (prompt, generation length): the row's prompt is
    read off the canvas (its tokens from the first real one), the length from the row's size."""

    def __init__(self, answers: dict[tuple[tuple[int, ...], int], list[int]]) -> None:
        super().__init__()
        self.answers = answers
        self.prompts = sorted({p for p, _ in answers}, key=len, reverse=True)
        self.config = PretrainedConfig(vocab_size=len(TOK))
        self.config._attn_implementation = "sdpa"
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, logits_to_keep=None, **_):
        logits = torch.zeros(*input_ids.shape, len(TOK))
        for b in range(input_ids.shape[0]):
            start = int((position_ids[b] == 0).nonzero().max())  # padding sits at position 0 before the first token
            row = input_ids[b, start:].tolist()
            prompt = next(p for p in self.prompts if tuple(row[: len(p)]) == p)
            target = prompt + tuple(self.answers[(prompt, len(row) - len(prompt))])
            logits[b, start:].scatter_(-1, torch.tensor(target)[:, None], 50.0)
        return SimpleNamespace(logits=logits[:, logits_to_keep], cache=None)


def forced_loader(answers):
    def load(model_cfg):
        spec = FamilySpec("forced", attention="full", shifted_logits=False, default_block_size=32)
        policy = DiffusionPolicy(ForcedAnswers(answers), spec, mask_token_id=TOK.mask_token_id,
                                 eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id)
        return policy, TOK

    return load


def benchmark_files(root: Path) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    (root / "gsm.jsonl").write_text(
        "".join(
            json.dumps({"question": f"Ann has {i} pens. How many?", "answer": f"#### {i}"}) + "\n" for i in range(5)
        )
    )
    (root / "math.jsonl").write_text(json.dumps({"problem": "Halve 1.", "answer": "\\frac{1}{2}"}) + "\n"
                                     + json.dumps({"problem": "Add 2 and 2.", "answer": "4"}) + "\n")
    (root / "cd.jsonl").write_text(json.dumps({"input": "49,55,53", "output": "51"}) + "\n")
    (root / "sudoku.csv").write_text(f"Puzzle,Solution\n3102200002100320,{SOLUTION}\n2100432004000000,{SOLUTION_2}\n")
    file = lambda name, **columns: {"kind": "file", "path": str(root / name), "columns": columns}  # noqa: E731
    return {"gsm8k": {"source": file("gsm.jsonl", prompt="question")},
            "math500": {"source": file("math.jsonl", prompt="problem")},
            "countdown": {"source": file("cd.jsonl", numbers="input", target="output"), "num_prompts": 1},
            "sudoku": {"source": file("sudoku.csv", puzzle="Puzzle", solution="Solution"), "num_prompts": 2}}


def job(root: Path, **protocol) -> JobConfig:
    return validate(JobConfig, {
        "model": {"preset": "tiny-llada"}, "task": {"name": "arithmetic", "held_out": 4},
        "estimator": {"name": "mean_field"}, "loss": {"name": "stabledrl"},
        "rollout": {"num_workers": 2, "request_timeout_s": 300}, "cluster": {"rollout": {"num_cpus": 0.5}},
        "eval": {"protocol": {"benchmarks": benchmark_files(root / "data"), **protocol}}})


def forced_answers(protocol: ProtocolConfig) -> dict:
    """GSM8K right on rows {0, 3} at 64 tokens and {0, 1, 2, 3} at 128; MATH's first right ("0.5" for
    1/2), its second wrong; Countdown right at 128 only; Sudoku: the first puzzle solved, the second
    with 2 of its 10 empty cells right."""
    prepared = prepare(protocol, TOK)
    answers = {}
    for name, bench in prepared.benchmarks.items():
        for row, ids in zip(bench.rows, prepared.prompts[name]):
            for n in protocol.gen_lengths:
                i = int(row.prompt_id.rsplit("-", 1)[1])
                text = {
                    "gsm8k": f"\\boxed{{{i if i in ({0, 3} if n == 64 else {0, 1, 2, 3}) else 99}}}",
                    "math500": "\\boxed{0.5}" if i == 0 else "\\boxed{3}",
                    "countdown": "\\boxed{49 + 55 - 53}" if n == 128 else "\\boxed{49 + 55 + 53}",
                    "sudoku": f"<answer>{SOLUTION if i == 0 else SOLUTION_2[:4]}</answer>",
                }[name]
                completion = TOK.encode(text, add_special_tokens=False) + [TOK.eos_token_id]
                answers[(tuple(ids), n)] = completion + [TOK.eos_token_id] * (n - len(completion))
    return answers


EXPECTED = {"GSM8K": (40.0, 80.0), "MATH500": (50.0, 50.0), "Countdown": (0.0, 100.0),
            "Sudoku": (round(100 * 10 / 18, 9),) * 2}


def table_values(table: dict) -> dict:
    """title -> accuracies rounded to 1e-9 (exact for these fractions)"""
    return {row["title"]: tuple(round(row["results"][str(n)]["accuracy"], 9) for n in table["gen_lengths"])
            for row in table["rows"]}


def test_pass_at_1_is_the_hand_computed_value_and_a_rerun_skips_what_is_graded(tmp_path, capsys):
    from stabledrl.evaluation.protocol_command import protocol_command

    cfg = job(tmp_path, gen_lengths=[64, 128], batch_size=2)
    answers = forced_answers(cfg.eval.protocol)
    out = tmp_path / "out"
    table = protocol_command(cfg, cfg.eval.protocol, out=str(out), workers=2, loader=forced_loader(answers))
    assert table_values(table) == EXPECTED
    printed = capsys.readouterr().out
    assert "| Benchmark | Prompts | 64 | 128 |" in printed and "| GSM8K | 5 | 40.0 | 80.0 |" in printed
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    keys = [(r["benchmark"], r["gen_length"], r["prompt_id"]) for r in map(json.loads, lines)]
    assert len(keys) == len(set(keys)) == (5 + 2 + 1 + 2) * 2  # every prompt at every length, once

    (out / "results.jsonl").write_text("".join(lines[:7]) + lines[7][:30])  # killed while writing line 8
    from stabledrl.common.job_log import show_log

    undo = show_log()  # the job's lines on stdout, as the CLI shows them
    try:
        again = protocol_command(cfg, cfg.eval.protocol, out=str(out), workers=1, loader=forced_loader(answers))
    finally:
        undo()
    assert "13 to go" in capsys.readouterr().out
    relines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    assert relines[:7] == lines[:7] and len(relines) == len(lines)  # the graded 7 were kept, not sampled again
    assert table_values(again) == table_values(table)
    assert json.loads((out / "table.json").read_text())["rows"] == again["rows"]


class Recorder:
    """An actor with EvalWorker's ``complete`` that remembers what it was given."""

    def __init__(self) -> None:
        self.seen: list[tuple[tuple[int, ...], int]] = []

    def complete(self, prompts, seeds, sampler):
        self.seen += [(tuple(p), sampler.gen_length) for p in prompts]
        return [""] * len(prompts)

    def log(self):
        return self.seen


def test_units_are_dealt_over_the_workers_and_each_prompt_runs_once(tmp_path):
    import ray

    protocol = job(tmp_path, gen_lengths=[64, 128], batch_size=1).eval.protocol
    prepared = prepare(protocol, TOK)
    units = pending_units(prepared, set())
    workers = [ray.remote(Recorder).options(num_cpus=0.5).remote() for _ in range(2)]
    finished = []
    run_units(workers, prepared, units, lambda unit, texts: finished.append(unit), timeout_s=120)
    seen = [ray.get(w.log.remote()) for w in workers]
    assert all(seen) and sorted(finished, key=str) == sorted(units, key=str)  # both worked; each unit once
    expected = sorted((tuple(prepared.prompts[u.benchmark][i]), u.gen_length) for u in units for i in u.indices)
    assert sorted(seen[0] + seen[1]) == expected and len(expected) == (5 + 2 + 1 + 2) * 2


def test_the_command_prints_one_column_per_generation_length(tmp_path, capsys):
    import yaml

    from stabledrl.cli.main import main

    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(job(tmp_path).model_dump(mode="json")))  # d1's defaults: 128, 256, 512
    code = main(["eval", "--config", str(config), "--protocol", "d1", "--benchmarks", "gsm8k,sudoku",
                 "--lengths", "32,64,96", "--num-prompts", "1", "--workers", "1", "--out", str(tmp_path / "tiny")])
    printed = capsys.readouterr().out
    assert code == 0
    assert "| Benchmark | Prompts | 32 | 64 | 96 |" in printed
    assert "| GSM8K | 1 |" in printed and "| Sudoku | 1 |" in printed and "MATH500" not in printed
    table = json.loads((tmp_path / "tiny" / "table.json").read_text())
    assert table["gen_lengths"] == [32, 64, 96] and table["decoding"]["block_length"] == 32
    assert all(cell["graded"] == 1 for row in table["rows"] for cell in row["results"].values())
    assert main(["eval", "--config", str(config), "--protocol", "d1", "--lengths", "50"]) == 2  # not a multiple of 32
    assert "multiple of block_length" in capsys.readouterr().err

"""Published evaluation protocols: which rows, what prompt, which grader, per benchmark.

    protocol = PROTOCOLS["d1"]
    bench = load_benchmark(protocol, "gsm8k", cfg.benchmarks["gsm8k"], tokenizer)   # BenchmarkRows
    ids = prompt_ids(tokenizer, bench.task, bench.rows[0])      # the one prompt encoding
    grade = bench.grade(completion, bench.rows[0])              # Grade(correct, total, answer)

**d1** (arXiv 2504.12216; SPG's release evaluates with it, on LLaDA-8B-Instruct): the user turn
is the benchmark's instruction, a blank line, then the question; it goes through the model's chat
template (``stabledrl.common.tasks.prompts``) and the answer is started for the model with
``<reasoning>`` (d1 writes it after the template for every model). Decoding is greedy with
low-confidence remasking, block 32, steps = length / 2, at lengths 128, 256 and 512
(``stabledrl.common.config.protocol``). The rows: the GSM8K test split (1319) and MATH500 (500) whole; 256
Countdown puzzles of d1's ``countdown_cd3_test.jsonl`` and 256 Sudoku puzzles of d1's
``4x4_test_sudoku.csv``, drawn as d1 draws them (numpy ``RandomState(42).choice(N, 256,
replace=False)``; Countdown's file holds 256 rows, so all of them). The graders decide as d1's
``parse_and_get_acc.py`` decides (``stabledrl.common.tasks.graders``; MATH by MATH's ``is_equiv``).

The instruction texts are d1's, character for character (the stray ``"`` at the end of MATH500's
is d1's too); the question lines follow d1's datasets. By default (``generation: stabledrl``) this
differs from d1's scripts in the decoding: the prompt is encoded once, without the second BOS that
d1's ``tokenizer(prompt)`` adds in front of a LLaDA template that already holds one; each prompt is
decoded as if alone (padding hidden); completions are read up to the first EOS. ``generation: d1``
does all three as d1 does (``d1_prompt_ids``, ``d1_batches``, ``stabledrl.rollout.sampling.d1_compat``).

SPG's release evaluates the same way (its GSM8K reader also accepts an answer tag that never
closes, and its Sudoku set is another split with three worked examples in the prompt).

What the StableDRL release evaluated with is not d1's protocol, as far as its code shows. Its
``eval/`` folder (deleted from the repository in January 2026; the history keeps it) was d1's
eval.py with one change to the decoding, ``diffusion_steps = gen_length`` (one token per step where
d1 takes two), d1's prompts, and a grader that asks Math-Verify about the raw generation first and
falls back to the parsed answer. Its remaining ``math_metrics.py`` decodes the bare question
(no chat template; GSM8K without any instruction, MATH with the training instruction) greedily at
256 tokens in 256 steps with blocks of 8 and grades the whole completion with Math-Verify. Which of
these produced the paper's table is not said in the release, and the paper's evaluation section
could not be read here; comparing with its numbers under ``--protocol d1`` compares protocols too.

This module does not import torch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from stabledrl.common.tasks.base import Row, Task
from stabledrl.common.tasks.graders import GRADERS, Grader
from stabledrl.common.tasks.prompts import prompt_text
from stabledrl.common.config.task import parse_task_config
from stabledrl.common.tasks.build import build_task
from stabledrl.common.tasks.data import prompt_length, rows_from_records
from stabledrl.common.tasks.sources import DataError, read_source

_FORMAT = ("Respond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n"
           "\\boxed{...}\n</answer>")
GSM8K_INSTRUCTION = ("You are a math expert. You will be given a question to solve. Solve it step by step. Wrap "
                     "the final answer in a \\boxed{}. \n" + _FORMAT)
MATH500_INSTRUCTION = ("You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the "
                       "final answer in a \\boxed{}.\n" + _FORMAT + '" \n')
COUNTDOWN_INSTRUCTION = (
    "Using only the provided numbers, create an arithmetic expression that evaluates to exactly the provided target "
    "number. You may use the operations +, -, *, and / as needed, but each number must be used exactly once. Think "
    "step-by-step. After reasoning, provide only your final expression inside \\boxed{} tags without including an "
    "equals sign or the target number. For example: \\boxed{a + b * c}" + _FORMAT
)
SUDOKU_INSTRUCTION = (
    "\nPlease solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character string reading "
    "left-to-right, top-to-bottom, where '0' represents empty cells.\n\nRules:\n- Fill empty cells with digits 1-4\n"
    "- Each row must contain digits 1-4 exactly once\n- Each column must contain digits 1-4 exactly once\n"
    "- Each 2x2 box must contain digits 1-4 exactly once\n\nImportant: Your solution must be a COMPLETE 16-character "
    "string with only the digits 1-4, representing your final solved grid.\n\nRespond in this exact format:\n"
    "<reasoning>\nYour step-by-step solving process\n</reasoning>\n<answer>\n[16-character solution string with no "
    "spaces or separators]\n</answer>\n"
)
D1_FILES = "https://raw.githubusercontent.com/dllm-reasoning/d1/main/dataset"


def _d1_file(name: str, columns: dict[str, str]) -> dict[str, Any]:
    return {"kind": "file", "path": f"data/d1/{name}", "columns": columns}


def _fetch(name: str) -> str:
    return f"mkdir -p data/d1 && curl -L -o data/d1/{name} {D1_FILES}/{name}"


@dataclass(frozen=True)
class Benchmark:
    """One row of a protocol's table."""

    title: str  # as the papers' tables name it
    task: str  # the task (stabledrl.common.tasks) whose records and checker fields the rows use
    instruction: str  # text of the user turn before the question (a blank line between)
    question: Callable[[Row], str]  # the question line of a row
    source: dict[str, Any]  # the default data source (a task.source mapping)
    num_prompts: Optional[int]  # rows evaluated by default (None: all)
    unit: str  # what the accuracy counts: "answers", or "empty cells" (Sudoku)
    fetch: str = ""  # how to get the default data when it is missing


@dataclass(frozen=True)
class Protocol:
    name: str
    benchmarks: dict[str, Benchmark]
    response_prefix: str  # written after the chat template: the start of the model's answer
    subsample_seed: int  # numpy RandomState seed of a subsample


def _countdown_question(row: Row) -> str:
    return f"Numbers: {list(row.meta['numbers'])}\nTarget: {row.meta['target']}"


D1 = Protocol(
    name="d1",
    response_prefix="<reasoning>",
    subsample_seed=42,
    benchmarks={
        "gsm8k": Benchmark(
            "GSM8K", "gsm8k", GSM8K_INSTRUCTION, lambda row: row.prompt,
            {"kind": "hf", "dataset": "openai/gsm8k", "config": "main", "split": "test",
             "columns": {"prompt": "question"}},
            None, "answers"),
        "math500": Benchmark(
            "MATH500", "math", MATH500_INSTRUCTION, lambda row: row.prompt,
            {"kind": "hf", "dataset": "HuggingFaceH4/MATH-500", "split": "test", "columns": {"prompt": "problem"}},
            None, "answers"),
        "countdown": Benchmark(
            "Countdown", "countdown", COUNTDOWN_INSTRUCTION, _countdown_question,
            _d1_file("countdown_cd3_test.jsonl", {"numbers": "input", "target": "output"}),
            256, "answers", _fetch("countdown_cd3_test.jsonl")),
        "sudoku": Benchmark(
            "Sudoku", "sudoku4", SUDOKU_INSTRUCTION,
            lambda row: f"Solve the following Sudoku puzzle: {row.meta['puzzle']}\n",
            _d1_file("4x4_test_sudoku.csv", {"puzzle": "Puzzle", "solution": "Solution"}),
            256, "empty cells", _fetch("4x4_test_sudoku.csv")),
    },
)
PROTOCOLS: dict[str, Protocol] = {"d1": D1}


@dataclass
class BenchmarkRows:
    """A benchmark ready to evaluate: its task (prompt encoding), rows in evaluation order, grader."""

    name: str
    benchmark: Benchmark
    task: Task
    rows: list[Row]
    grade: Grader
    source: str  # where the rows came from (for the table's notes)
    size: int  # rows the source holds


def subsample(n_rows: int, k: Optional[int], seed: int) -> list[int]:
    """Indices of the rows a protocol evaluates: all in order (k None), or numpy's
    ``RandomState(seed).choice(n_rows, k, replace=False)`` in the order it draws them (d1's draw)."""
    if k is None:
        return list(range(n_rows))
    if k > n_rows:
        raise ValueError(f"num_prompts={k} exceeds the {n_rows} rows of the benchmark")
    return [int(i) for i in np.random.RandomState(seed).choice(n_rows, k, replace=False)]


def d1_batches(n_rows: int, world_size: int, batch_size: int) -> list[list[int]]:
    """The batches d1's eval.py decodes rows 0..n-1 in: rank r of ``world_size`` takes rows r, r + W,
    r + 2W, ... (its DistributedSampler, no shuffling, no padding rows) in batches of
    ``batch_size``. Without an attention mask a row's tokens depend on its batch (the padding), so
    ``generation: d1`` must batch as d1's run did."""
    out = []
    for rank in range(world_size):
        mine = list(range(rank, n_rows, world_size))
        out += [mine[k : k + batch_size] for k in range(0, len(mine), batch_size)]
    return out


# The GPUs d1's published generation files (eval/eval_baselines/<setup>_<rank>_generations.json) came from,
# read from the files themselves: rank r's file holds rows r, r + W, r + 2W, ... of the benchmark's rows
# (d1's eval.py samples without shuffling) for W the number of files of the setup. Countdown and Sudoku:
# 7 files of 37 and 36 rows at every length, in that split of d1's subsample; MATH500: 2 files at 128
# tokens, 6 at 256 and 512, the same order either way. GSM8K's 10 files (1,130 of the 1,319 test
# questions) are no such split of the test set for any W: unknown, so run_eval.sh's 8 GPUs.
def d1_prompt_ids(tokenizer: Any, task: Task, row: Row) -> list[int]:
    """The prompt as d1 encodes it: the same text, through ``tokenizer(text)`` with the tokenizer's
    special tokens added (LLaDA's: a second BOS in front of the template's own)."""
    return [int(i) for i in tokenizer(prompt_text(tokenizer, task, row))["input_ids"]]


def benchmark_task(protocol: Protocol, name: str, max_prompt_tokens: int = 4096) -> Task:
    """The benchmark's task with the protocol's prompt: instruction + blank line + question, then
    the response prefix. Rows it reads carry the question as their prompt."""
    bench = protocol.benchmarks[name]
    section: dict[str, Any] = {"name": bench.task, "template": bench.instruction + "\n\n{prompt}",
                               "max_prompt_tokens": max_prompt_tokens, "source": bench.source}
    task = build_task(parse_task_config(section))
    task_from_record = task.from_record

    def from_record(record: Any) -> Row:
        row = task_from_record(record)
        return dataclasses.replace(row, prompt=bench.question(row))

    return dataclasses.replace(task, from_record=from_record, response_prefix=protocol.response_prefix)


def load_benchmark(protocol: Protocol, name: str, cfg: Any, tokenizer: Any = None,
                   max_prompt_tokens: int = 4096) -> BenchmarkRows:
    """The rows of benchmark ``name`` (``cfg``: its ``BenchmarkConfig``). Row i of the source gets
    the id ``<name>-<i>``, so results are keyed by position and duplicates in the data are kept.
    A row that cannot be read or is too long stops loading, naming it (DataError)."""
    bench = protocol.benchmarks[name]
    task = benchmark_task(protocol, name, max_prompt_tokens)
    source = cfg.source
    if source is None:
        source = parse_task_config({"name": bench.task, "source": bench.source}).source
    try:
        records = read_source(source)
    except DataError as e:
        hint = f"; fetch d1's file with: {bench.fetch}" if bench.fetch and cfg.source is None else ""
        raise DataError(f"benchmark {name}: {e}{hint}") from None
    count = cfg.num_prompts or bench.num_prompts
    if count is not None and count > len(records.rows):
        raise DataError(f"benchmark {name}: {records.source} holds {len(records.rows)} rows, fewer than the {count} "
                        f"to evaluate (set eval.protocol.benchmarks.{name}.num_prompts)")
    chosen = subsample(len(records.rows), count, protocol.subsample_seed)
    picked = [{**records.rows[i], "id": f"{name}-{i}"} for i in chosen]
    rows, _ = rows_from_records(task, picked, source=records.source, columns=source.columns,
                                max_prompt_tokens=max_prompt_tokens, on_bad_row="error",
                                length=prompt_length(task, tokenizer))
    return BenchmarkRows(name, bench, task, rows, GRADERS[bench.task], records.source, len(records.rows))



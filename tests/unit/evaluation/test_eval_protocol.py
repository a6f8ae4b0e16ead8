"""The d1 protocol's rows and prompts (common/tasks/protocols.py, common/config/protocol.py): the
prompt a model reads is d1's (instruction, blank line, question, chat template, "<reasoning>"),
through the one prompt encoding; rows are d1's draw; bad settings are refused naming the field."""
from __future__ import annotations

import json

import pytest

from stabledrl.common.config.base import ConfigError, validate
from stabledrl.common.config.protocol import BenchmarkConfig, ProtocolConfig
from stabledrl.common.config.task import FileSource
from stabledrl.common.models import load_tokenizer
from stabledrl.common.models.release_tokenizers import write_release_tokenizer
from stabledrl.common.tasks import DataError
from stabledrl.common.tasks.prompts import prompt_ids, prompt_text
from stabledrl.common.tasks.protocols import D1, load_benchmark, subsample

LLADA_USER = "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n"
LLADA_ASSISTANT = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"


@pytest.fixture(scope="module")
def llada_tokenizer(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llada")
    write_release_tokenizer("llada", directory)
    return load_tokenizer(directory)


@pytest.fixture
def files(tmp_path):
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text("".join(json.dumps({"question": f"Tom has {i} apples. How many?", "answer": f"so\n#### {i}"}) + "\n"
                           for i in range(5)))
    countdown = tmp_path / "countdown.jsonl"
    countdown.write_text(json.dumps({"input": "30,100,93", "output": "23"}) + "\n")
    sudoku = tmp_path / "sudoku.csv"
    sudoku.write_text("Puzzle,Solution\n0140432014020000,2143432114323214\n3102200002100320,3142243142131324\n")
    math = tmp_path / "math.jsonl"
    math.write_text(json.dumps({"problem": "What is $1/2$ as a decimal?", "answer": "0.5"}) + "\n")
    return {
        "gsm8k": BenchmarkConfig(source=FileSource(path=str(gsm), columns={"prompt": "question"})),
        "math500": BenchmarkConfig(source=FileSource(path=str(math), columns={"prompt": "problem"})),
        "countdown": BenchmarkConfig(
            source=FileSource(path=str(countdown), columns={"numbers": "input", "target": "output"}), num_prompts=1
        ),
        "sudoku": BenchmarkConfig(
            source=FileSource(path=str(sudoku), columns={"puzzle": "Puzzle", "solution": "Solution"}), num_prompts=2
        ),
    }


def test_the_prompt_is_d1s_through_the_chat_template_with_one_bos(files, llada_tokenizer):
    questions = {
        "gsm8k": "Tom has 0 apples. How many?",
        "math500": "What is $1/2$ as a decimal?",
        "countdown": "Numbers: [30, 100, 93]\nTarget: 23",
        "sudoku": "Solve the following Sudoku puzzle: 0140432014020000\n",  # d1's row 0 of this file is drawn second
    }
    for name, question in questions.items():
        bench = load_benchmark(D1, name, files[name], llada_tokenizer)
        row = next(r for r in bench.rows if bench.benchmark.question(r) == question)
        user = (bench.benchmark.instruction + "\n\n" + question).strip()  # LLaDA's template trims the turn
        expected = LLADA_USER + user + LLADA_ASSISTANT + "<reasoning>"
        assert prompt_text(llada_tokenizer, bench.task, row) == expected
        ids = prompt_ids(llada_tokenizer, bench.task, row)
        assert ids == llada_tokenizer.encode(expected, add_special_tokens=False)
        assert ids.count(llada_tokenizer.bos_token_id) == 1 and ids[0] == llada_tokenizer.bos_token_id


def test_the_instructions_ask_for_d1s_answer_formats():
    assert D1.benchmarks["gsm8k"].instruction.startswith("You are a math expert.")
    assert "\\boxed{...}\n</answer>" in D1.benchmarks["gsm8k"].instruction
    assert D1.benchmarks["math500"].instruction.endswith('</answer>" \n')  # d1's text, stray quote included
    assert "each number must be used exactly once" in D1.benchmarks["countdown"].instruction
    assert "[16-character solution string with no spaces or separators]" in D1.benchmarks["sudoku"].instruction


def test_rows_are_d1s_draw_keyed_by_their_position_in_the_source(files, llada_tokenizer):
    # d1 evaluates numpy RandomState(42).choice(N, 256, replace=False); its published Sudoku generations
    # (LLaDA-8B-Instruct, 7 GPUs, rank 0) start with the puzzles of rows 361, 73, 374 of its 500-row file
    assert subsample(500, 256, 42)[:3] == [361, 73, 374]
    assert sorted(subsample(256, 256, 42)) == list(range(256))  # Countdown: the whole file, reordered
    assert subsample(7, None, 42) == list(range(7))
    sudoku = load_benchmark(D1, "sudoku", files["sudoku"], llada_tokenizer)
    assert [r.prompt_id for r in sudoku.rows] == [f"sudoku-{i}" for i in subsample(2, 2, 42)]
    assert sudoku.rows[0].meta["puzzle"] == "3102200002100320" and sudoku.size == 2  # leading zeros kept (CSV as text)
    gsm = load_benchmark(D1, "gsm8k", files["gsm8k"], llada_tokenizer)
    assert [r.prompt_id for r in gsm.rows] == [f"gsm8k-{i}" for i in range(5)] and gsm.rows[3].answer == "3"
    few = load_benchmark(D1, "gsm8k", files["gsm8k"].model_copy(update={"num_prompts": 2}), llada_tokenizer)
    assert [r.prompt_id for r in few.rows] == [f"gsm8k-{i}" for i in subsample(5, 2, 42)]


def test_a_benchmark_without_its_data_or_rows_is_refused_naming_what_to_do(
    files, llada_tokenizer, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # no data/d1/ here
    with pytest.raises(DataError, match="curl -L -o data/d1/4x4_test_sudoku.csv"):
        load_benchmark(D1, "sudoku", BenchmarkConfig(), llada_tokenizer)
    with pytest.raises(DataError, match="eval.protocol.benchmarks.sudoku.num_prompts"):
        load_benchmark(D1, "sudoku", files["sudoku"].model_copy(update={"num_prompts": None}), llada_tokenizer)
    with pytest.raises(DataError, match="max_prompt_tokens"):
        load_benchmark(D1, "gsm8k", files["gsm8k"], llada_tokenizer, max_prompt_tokens=50)


def test_protocol_settings_are_checked_naming_the_field():
    cfg = ProtocolConfig()
    assert cfg.gen_lengths == [128, 256, 512] and cfg.block_length == 32 and cfg.temperature == 0.0
    assert [cfg.steps(n) for n in cfg.gen_lengths] == [64, 128, 256]
    assert sorted(cfg.benchmarks) == ["countdown", "gsm8k", "math500", "sudoku"]
    for bad, field in (
        ({"gen_lengths": [100]}, "gen_lengths"),
        ({"benchmarks": {"mmlu": {}}}, "benchmarks"),
        ({"gen_lengths": [128, 128]}, "gen_lengths"),
        ({"steps_per_token": 0.3}, "steps_per_token"),
        ({"benchmarks": {"gsm8k": {"num_prompts": 0}}}, "num_prompts"),
        ({"temprature": 0}, "temprature"),
    ):
        with pytest.raises(ConfigError, match=field):
            validate(ProtocolConfig, bad)


def test_generation_d1_batches_pads_and_encodes_as_d1(files, llada_tokenizer, monkeypatch):
    from stabledrl.common.tasks.protocols import d1_batches
    from stabledrl.evaluation.protocol import pending_units, prepare, unit_request

    # d1's DistributedSampler: rank r takes rows r, r + W, ...; then batches of its own rows
    assert d1_batches(10, 3, 2) == [[0, 3], [6, 9], [1, 4], [7], [2, 5], [8]]
    cfg = ProtocolConfig(benchmarks={"gsm8k": files["gsm8k"]}, gen_lengths=[64], generation="d1", d1_world_size=2,
                         d1_batch_size=2)
    prepared = prepare(cfg, llada_tokenizer)
    bench = prepared.benchmarks["gsm8k"]
    ids = prepared.prompts["gsm8k"][0]
    assert ids[:2] == [llada_tokenizer.bos_token_id] * 2  # d1's tokenizer(text) adds a BOS before the template's
    units = pending_units(prepared, set())
    assert [u.indices for u in units] == [(0, 2), (4,), (1, 3)]
    done = {("gsm8k", 64, bench.rows[0].prompt_id)}
    assert [u.indices for u in pending_units(prepared, done)] == [(0, 2), (4,), (1, 3)]  # a batch reruns whole
    prepared.prompts["gsm8k"][2] = prepared.prompts["gsm8k"][2][:-3]  # rows of different lengths
    prompts, _, sampler = unit_request(prepared, units[0])
    assert len(prompts[0]) == len(prompts[1]) and prompts[1][:3] == [llada_tokenizer.pad_token_id] * 3
    assert sampler.compat == "d1" and sampler.max_batch_size == 2 and sampler.temperature == 0
    assert prepared.header("p")["decoding"]["d1_batches"] == {"gsm8k 64": [2, 2]}
    with pytest.raises(ConfigError, match="temperature 0"):
        validate(ProtocolConfig, {"generation": "d1", "temperature": 0.5})


def test_extra_math_graders_are_checked_up_front(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_math_verify(name, *args, **kwargs):
        if name == "math_verify":
            raise ImportError("not installed")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr("builtins.__import__", no_math_verify)
    with pytest.raises(ConfigError, match="math_graders.*pip install"):
        validate(ProtocolConfig, {"math_graders": ["math-verify"]})
    assert validate(ProtocolConfig, {"math_graders": ["latex"]}).math_graders == ["latex"]


# d1's published generation files (eval/eval_baselines): rows per file, in file (rank) order, per setup
D1_PUBLISHED_ROWS = {
    ("countdown", 128): [37, 37, 37, 37, 36, 36, 36], ("countdown", 256): [37, 37, 37, 37, 36, 36, 36],
    ("countdown", 512): [37, 37, 37, 37, 36, 36, 36], ("sudoku", 128): [37, 37, 37, 37, 36, 36, 36],
    ("sudoku", 256): [37, 37, 37, 37, 36, 36, 36], ("sudoku", 512): [37, 37, 37, 37, 36, 36, 36],
    ("math500", 128): [250, 250], ("math500", 256): [84, 84, 83, 83, 83, 83],
    ("math500", 512): [84, 84, 83, 83, 83, 83],
}
# GSM8K at 128 tokens: rows per file, and the test-set positions of the first three questions of files 0-4
D1_GSM8K_ROWS = [164, 164, 164, 164, 163, 62, 62, 62, 63, 62]
D1_GSM8K_FIRST = [[0, 7, 14], [1, 8, 15], [2, 9, 16], [4, 11, 17], [6, 13, 18]]


@pytest.mark.parametrize("setup", sorted(D1_PUBLISHED_ROWS))
def test_generation_d1_splits_rows_over_the_ranks_d1s_files_came_from(setup):
    """The default world size per benchmark and length gives every rank of d1's published files its rows
    (each file was checked to hold rows r, r + W, ... of the benchmark's order in a scratch run)."""
    from stabledrl.common.config.protocol import ProtocolConfig
    from stabledrl.common.tasks.protocols import d1_batches

    benchmark, length = setup
    n_rows = sum(D1_PUBLISHED_ROWS[setup])
    ranks = ProtocolConfig().d1_ranks(benchmark, length)
    batches = d1_batches(n_rows, ranks, ProtocolConfig().d1_batch(length))
    per_rank = [sum(len(b) for b in batches if b[0] % ranks == r) for r in range(ranks)]
    assert per_rank == D1_PUBLISHED_ROWS[setup]
    assert ProtocolConfig(d1_world_size=8).d1_ranks(benchmark, length) == 8  # set outright, it holds


def test_d1s_gsm8k_files_are_no_rank_split_so_the_default_is_run_evals():
    from stabledrl.common.config.protocol import ProtocolConfig

    assert sum(D1_GSM8K_ROWS) == 1130
    for world in range(1, 17):
        assert [list(range(r, 1319, world))[:3] for r in range(5)] != D1_GSM8K_FIRST
    assert ProtocolConfig().d1_ranks("gsm8k", 256) == 8


def test_protocols_say_what_the_stabledrl_release_evaluated_with():
    """The StableDRL release's deleted eval/ decoded one token per step (diffusion_steps = gen_length)
    and graded with Math-Verify; its math_metrics.py decodes the bare question: no claim that it
    reports with d1's protocol."""
    from stabledrl.common.tasks import protocols

    doc = " ".join(protocols.__doc__.split())
    assert "StableDRL paper report with it" not in doc
    assert "``diffusion_steps = gen_length`` (one token per step where d1 takes two)" in doc
    assert "bare question" in doc and "Math-Verify" in doc

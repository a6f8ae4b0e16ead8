"""Task data beyond flat files: Hugging Face datasets (a save_to_disk directory, a hub id from a
hand-built local cache, nothing downloaded), dotted paths into nested fields, chat-message prompts,
verl's layout as it is, the whole record reaching custom rewards; and JSONL that is not UTF-8,
has a 10 MB line, or a broken line (reported with its file line)."""
from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stabledrl.common.config.task import parse_task_config
from stabledrl.common.models import load_tokenizer
from stabledrl.common.models.release_tokenizers import write_release_tokenizer
from stabledrl.common.sandbox.scorer import RewardScorer
from stabledrl.common.tasks import DataError, load_task_data
from stabledrl.common.tasks.prompts import prompt_text

QUESTIONS = [f"Sam has {i} apples and buys {i} more. How many apples?" for i in range(1, 9)]
VERL = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [
            {"role": "user", "content": f'{q} Let\'s think step by step and output the final answer after "####".'}
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
        "extra_info": {"split": "train", "index": i, "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}", "question": q},
    }
    for i, q in enumerate(QUESTIONS, start=1)
]


def gsm8k(source, **kw):
    return parse_task_config({"name": "gsm8k", "source": source, "max_prompt_tokens": 400, **kw})


def write_parquet(path, records):
    pq.write_table(pa.Table.from_pylist(records), path)
    return str(path)


@pytest.fixture(scope="module")
def llada(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llada")
    write_release_tokenizer("llada", directory)
    return load_tokenizer(directory)


def test_verl_parquet_loads_as_it_is(tmp_path, llada):
    data = load_task_data(gsm8k({"kind": "file", "path": write_parquet(tmp_path / "train.parquet", VERL)}))
    row = data.train[0]
    assert [r.answer for r in data.train] == [str(2 * i) for i in range(1, 9)]  # reward_model.ground_truth
    assert row.prompt == VERL[0]["prompt"][0]["content"] and row.messages == tuple(VERL[0]["prompt"])
    assert row.record["extra_info"]["index"] == 1 and row.record["data_source"] == "openai/gsm8k"
    # the data's messages are the conversation: no task template around them, the chat template applied once
    assert prompt_text(llada, data.task, row) == (
        "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n" + row.prompt
        + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert data.task.render_prompt(row) == row.prompt  # a plain tokenizer reads the message text


def test_message_prompts_keep_their_system_turn_and_get_the_task_system_prompt_otherwise(tmp_path, llada):
    records = [
        {"prompt": [{"role": "system", "content": "Answer tersely."}, {"role": "user", "content": "What is 3+4?"}],
         "answer": "7"},
        {"prompt": [{"role": "user", "content": "What is 5+4?"}], "answer": "9"},
        {"prompt": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], "answer": "4"},
        {"prompt": [{"role": "narrator", "content": "hi"}, {"role": "user", "content": "1+1?"}], "answer": "2"},
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    data = load_task_data(gsm8k({"path": str(path)}, on_bad_row="skip", system_prompt="Be exact."))
    assert data.reports[0].skipped == {"invalid": 2}  # an assistant turn last; an unknown role
    assert data.task.messages(data.train[0])[0] == {"role": "system", "content": "Answer tersely."}
    assert data.task.messages(data.train[1]) == [{"role": "system", "content": "Be exact."},
                                                 {"role": "user", "content": "What is 5+4?"}]
    assert prompt_text(llada, data.task, data.train[1]).startswith(
        "<|startoftext|><|start_header_id|>system<|end_header_id|>\n\nBe exact.<|eot_id|>")


def test_dotted_columns_read_nested_fields_and_list_items(tmp_path):
    path = write_parquet(tmp_path / "train.parquet", VERL)
    data = load_task_data(
        gsm8k({"path": path, "columns": {"prompt": "extra_info.question", "answer": "extra_info.answer"}})
    )
    assert [r.prompt for r in data.train] == QUESTIONS and not data.train[0].messages  # text: the template applies
    assert [r.answer for r in data.train] == [str(2 * i) for i in range(1, 9)]  # "#### N" parsed from the solution
    assert data.train[0].meta["solution"] == "1 + 1 = 2"
    data = load_task_data(
        gsm8k({"path": path, "columns": {"prompt": "prompt.0.content", "answer": "reward_model.ground_truth"}})
    )
    assert data.train[0].prompt == VERL[0]["prompt"][0]["content"]
    with pytest.raises(DataError, match=r"no column \['reward_model.truth'\]"):  # no record has that path
        load_task_data(gsm8k({"path": path, "columns": {"answer": "reward_model.truth"}}))
    partial = [{**VERL[0], "extra_info": {"index": 1}}] + VERL[1:]  # row 1 lacks extra_info.answer
    path = write_parquet(tmp_path / "partial.parquet", partial)
    with pytest.raises(DataError, match="row 1: missing field 'answer'"):
        load_task_data(gsm8k({"path": path, "columns": {"answer": "extra_info.answer"}}))


def test_save_to_disk_directory_with_splits(tmp_path):
    import datasets

    rows = [{"question": q, "answer": f"#### {2 * i}"} for i, q in enumerate(QUESTIONS, start=1)]
    datasets.DatasetDict({
        "train": datasets.Dataset.from_list(rows[:6]), "test": datasets.Dataset.from_list(rows[6:]),
    }).save_to_disk(str(tmp_path / "saved"))
    source = {"kind": "hf", "dataset": str(tmp_path / "saved"), "columns": {"prompt": "question"}}
    data = load_task_data(gsm8k(source, held_out_source={**source, "split": "test"}))
    assert [r.prompt for r in data.train] == QUESTIONS[:6] and [r.prompt for r in data.held_out] == QUESTIONS[6:]
    assert data.reports[0].source.endswith("saved[train]")
    with pytest.raises(DataError, match=r"no split 'validation' \(splits: \['test', 'train'\]\)"):
        load_task_data(gsm8k({**source, "split": "validation"}))
    with pytest.raises(DataError, match="neither a directory written by save_to_disk nor a hub id"):
        load_task_data(gsm8k({**source, "dataset": str(tmp_path / "absent" / "x" / "y")}))


@pytest.fixture
def offline_datasets_cache(tmp_path, monkeypatch):
    """A datasets cache holding the prepared dataset ``acme/word-sums`` (config ``main``, splits
    train and test), built here from local Parquet files; the hub is switched off."""
    import datasets
    import huggingface_hub.constants
    from datasets.packaged_modules.parquet.parquet import Parquet

    cache = tmp_path / "datasets-cache"
    for module, name, value in [
        (datasets.config, "HF_DATASETS_CACHE", cache),
        (datasets.config, "HF_DATASETS_OFFLINE", True),
        (datasets.config, "HF_HUB_OFFLINE", True),
        (huggingface_hub.constants, "HF_HUB_OFFLINE", True),
    ]:
        monkeypatch.setattr(module, name, value)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    files = {}
    for split, part in (("train", VERL[:6]), ("test", VERL[6:])):
        files[split] = write_parquet(tmp_path / f"{split}.parquet", part)
    builder = Parquet(dataset_name="word-sums", config_name="main", data_files=files, cache_dir=str(tmp_path / "build"))
    builder.download_and_prepare()
    # the cache layout of a hub dataset: <namespace>___<name>/<config>/<version>/<hash>/
    prepared = next((tmp_path / "build" / "word-sums").glob("*/0.0.0"))
    shutil.copytree(prepared, cache / "acme___word-sums" / "main" / "0.0.0" / "0123456789abcdef")
    return cache


def test_hub_dataset_resolves_from_the_local_cache(offline_datasets_cache):
    source = {"kind": "hf", "dataset": "acme/word-sums", "config": "main", "split": "train"}
    data = load_task_data(gsm8k(source, held_out_source={**source, "split": "test"}))
    assert [r.answer for r in data.train] == [str(2 * i) for i in range(1, 7)]
    assert [r.answer for r in data.held_out] == ["14", "16"]
    assert data.train[0].messages == tuple(VERL[0]["prompt"]) and data.train[0].record["extra_info"]["index"] == 1
    with pytest.raises(
        DataError, match=r"'acme/other' is not in the local datasets cache.*load_dataset\('acme/other'\)"
    ):
        load_task_data(gsm8k({**source, "dataset": "acme/other", "config": None}))


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_custom_reward_reads_any_column_of_the_record(tmp_path, isolation):
    reward_file = tmp_path / "reward.py"
    reward_file.write_text(
        "def score(completion, row):\n"
        "    return row.record['extra_info']['index'] + (row.record['reward_model']['ground_truth'] in completion)\n"
    )
    cfg = gsm8k({"path": write_parquet(tmp_path / "train.parquet", VERL)},
                reward={"custom": f"{reward_file}:score", "format_weight": 0.0, "isolation": isolation})
    rows = load_task_data(cfg).train
    with RewardScorer(cfg) as scorer:
        assert [scorer.score("#### 6", r).total for r in rows[:3]] == [1.0, 2.0, 4.0]


def gsm8k_lines(path, lines: list[bytes], **kw):
    path.write_bytes(b"\n".join(lines) + b"\n")
    return gsm8k({"path": str(path), "columns": {"prompt": "question", "answer": "final"}}, **kw)


def record(i: int, **extra) -> bytes:
    return json.dumps({"question": f"What is {i} + {i}?", "final": f"#### {2 * i}", **extra}).encode()


def test_non_utf8_line_is_named_with_its_file_and_line(tmp_path):
    lines = [record(1), record(2), b'{"question": "caf\xe9?", "final": "#### 1"}', record(4)]
    cfg = gsm8k_lines(tmp_path / "latin1.jsonl", lines)
    with pytest.raises(DataError, match=r"latin1.jsonl: line 3: not UTF-8 \(byte 0xe9 at column 18\)"):
        load_task_data(cfg)
    data = load_task_data(cfg.model_copy(update={"on_bad_row": "skip"}))
    assert len(data.train) == 3 and data.reports[0].skipped == {"not_utf8": 1} and data.reports[0].read == 4


def test_a_10_mb_line_is_an_ordinary_row(tmp_path):
    lines = [record(1), record(2, notes="x" * 10_000_000), record(3)]
    for on_bad_row in ("error", "skip"):
        data = load_task_data(gsm8k_lines(tmp_path / "big.jsonl", lines, on_bad_row=on_bad_row))
        assert [r.answer for r in data.train] == ["2", "4", "6"] and data.reports[0].n_skipped == 0
        assert len(data.train[1].record["notes"]) == 10_000_000


def test_broken_json_lines_are_reported_with_their_own_line_number(tmp_path):
    lines = [record(1), b"", record(2), b'{"question": "cut off', record(4), b'{"question": "What is 9?"}', b"[1, 2]"]
    cfg = gsm8k_lines(tmp_path / "broken.jsonl", lines)
    with pytest.raises(DataError, match=r"broken.jsonl: line 4: not valid JSON \(Unterminated string"):
        load_task_data(cfg)
    data = load_task_data(cfg.model_copy(update={"on_bad_row": "skip"}))
    report = data.reports[0]
    assert [r.answer for r in data.train] == ["2", "4", "8"]
    assert report.skipped == {"bad_json": 2, "missing_field": 1} and report.read == 6
    assert report.examples == ["line 4: not valid JSON (Unterminated string starting at, column 14)",
                               "line 6: missing field 'answer'", "line 7: a JSON list, not an object"]


def test_a_json_array_file_is_read_whole(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([json.loads(record(i)) for i in range(1, 4)], indent=2))
    data = load_task_data(gsm8k({"path": str(path), "columns": {"prompt": "question", "answer": "final"}}))
    assert [r.answer for r in data.train] == ["2", "4", "6"]

"""Task data from JSONL / Parquet (written here with pyarrow), bad rows, the split, the prompt stream."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stabledrl.common.config.task import parse_task_config
from stabledrl.common.tasks import (
    DataCursor,
    DataError,
    PromptStream,
    Row,
    build_task,
    load_task_data,
    rows_from_records,
    split_rows,
)

GOOD = [{"question": f"What is {i} + {i}?", "final": f"#### {2 * i}"} for i in range(20)]
BAD = [
    {"question": "Missing answer", "final": None},  # row 21
    {"question": "   ", "final": "#### 1"},  # row 22: empty prompt
    {"question": "x" * 300, "final": "#### 1"},  # row 23: over max_prompt_tokens
    {"question": "What is 0 + 0?", "final": "#### 0"},  # row 24: duplicate of row 1
    {"question": "No number", "final": "#### none"},  # row 25: answer holds no number
]


def write_jsonl(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return str(path)


def write_parquet(path, records):
    pq.write_table(pa.Table.from_pylist(records), path)
    return str(path)


def gsm8k_config(path, **kw):
    return parse_task_config({
        "name": "gsm8k",
        "source": {"kind": "file", "path": path, "columns": {"prompt": "question", "answer": "final"}},
        "max_prompt_tokens": 200,
        **kw,
    })


@pytest.mark.parametrize("writer,suffix", [(write_jsonl, "jsonl"), (write_parquet, "parquet")])
def test_good_file_loads_with_column_mapping(tmp_path, writer, suffix):
    data = load_task_data(gsm8k_config(writer(tmp_path / f"d.{suffix}", GOOD)))
    assert [r.prompt for r in data.train] == [g["question"] for g in GOOD]
    assert [r.answer for r in data.train] == [str(2 * i) for i in range(20)]
    assert data.reports[0].read == data.reports[0].kept == 20 and data.held_out == []


@pytest.mark.parametrize("writer,suffix", [(write_jsonl, "jsonl"), (write_parquet, "parquet")])
def test_bad_rows_error_with_their_row_number(tmp_path, writer, suffix):
    path = writer(tmp_path / f"d.{suffix}", GOOD + BAD)
    unit = "line" if suffix == "jsonl" else "row"  # JSONL errors name the file line
    with pytest.raises(DataError, match=rf"{unit} 21: missing field 'answer'"):
        load_task_data(gsm8k_config(path))
    for i, needle in [(1, f"{unit} 21: field 'prompt' is empty"), (2, f"{unit} 21: prompt has 3"),
                      (3, f"{unit} 21: duplicate id")]:
        only = writer(tmp_path / f"only{i}.{suffix}", GOOD + [BAD[i]])
        with pytest.raises(DataError, match=needle):
            load_task_data(gsm8k_config(only))


@pytest.mark.parametrize("writer,suffix", [(write_jsonl, "jsonl"), (write_parquet, "parquet")])
def test_bad_rows_skipped_and_counted(tmp_path, writer, suffix):
    data = load_task_data(gsm8k_config(writer(tmp_path / f"d.{suffix}", GOOD + BAD), on_bad_row="skip"))
    report = data.reports[0]
    assert len(data.train) == report.kept == 20 and report.read == 25
    assert report.skipped == {"missing_field": 1, "empty_field": 1, "too_long": 1, "duplicate_id": 1, "invalid": 1}
    assert report.examples[0].startswith("line 21" if suffix == "jsonl" else "row 21")


def test_token_counter_decides_prompt_length(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", GOOD)
    words = lambda text: len(text.split())  # noqa: E731
    cfg = gsm8k_config(path, max_prompt_tokens=30)
    assert len(load_task_data(cfg, count_tokens=words).train) == 20
    with pytest.raises(DataError, match="line 1: prompt has 9[0-9] tokens"):  # characters: the template alone is 78
        load_task_data(cfg)


def test_missing_column_is_reported_with_the_available_ones(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", GOOD)
    cfg = parse_task_config({"name": "gsm8k", "source": {"kind": "file", "path": path}, "on_bad_row": "skip"})
    with pytest.raises(DataError, match=r"no column \['answer', 'prompt'\].*final.*question"):
        load_task_data(cfg)
    with pytest.raises(DataError, match="does not exist"):
        load_task_data(gsm8k_config(str(tmp_path / "absent.jsonl")))


def test_jsonl_lines_stand_alone_and_a_broken_parquet_file_is_a_file_error(tmp_path):
    """A field that is a number on one JSONL line and text on the next is judged per row."""
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "a", "final": 1}, {"question": "b", "final": "x"}])
    data = load_task_data(gsm8k_config(path, on_bad_row="skip"))
    assert [r.answer for r in data.train] == ["1"] and data.reports[0].skipped == {"invalid": 1}
    broken = tmp_path / "d.parquet"
    broken.write_bytes(b"PAR1 not really parquet")
    with pytest.raises(DataError, match="cannot read .*d.parquet as parquet"):
        load_task_data(gsm8k_config(str(broken), on_bad_row="skip"))


def test_structured_tasks_from_parquet(tmp_path):
    cd = write_parquet(tmp_path / "cd.parquet", [
        {"id": "c1", "nums": [2, 3, 5, 7], "target": 22},
        {"id": "c2", "nums": [1, 1], "target": None},
    ])
    cfg = parse_task_config(
        {
            "name": "countdown",
            "source": {"kind": "file", "path": cd, "columns": {"numbers": "nums"}},
            "on_bad_row": "skip",
        }
    )
    data = load_task_data(cfg)
    assert [r.prompt_id for r in data.train] == ["c1"] and data.reports[0].skipped == {"missing_field": 1}
    row = data.train[0]
    assert data.task.reward(data.task.reference_completion(row), row).parts["correctness"] == 1.0

    sd = write_parquet(
        tmp_path / "sd.parquet", [{"puzzle": "1004300221004001"}, {"puzzle": "1100000000000000"}, {"puzzle": "12"}]
    )
    cfg = parse_task_config({"name": "sudoku4", "source": {"kind": "file", "path": sd}, "on_bad_row": "skip"})
    data = load_task_data(cfg)
    assert [r.meta["solution"] for r in data.train] == ["1234341221434321"]
    assert data.reports[0].skipped == {"invalid": 2}  # a clash of clues has no solution; "12" is not a grid


def test_held_out_source_and_overlap(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", GOOD)
    test = write_jsonl(tmp_path / "test.jsonl", GOOD[:3] + [{"question": "New?", "final": "#### 9"}])
    held_src = {"kind": "file", "path": test, "columns": {"prompt": "question", "answer": "final"}}
    data = load_task_data(gsm8k_config(train, held_out_source=held_src))
    assert len(data.held_out) == 4 and len(data.train) == 17
    assert data.reports[0].skipped == {"in_held_out": 3}


# ---------------------------------------------------------------- split
ROWS = [Row(f"id-{i}", f"p{i}", str(i)) for i in range(500)]


def test_split_is_deterministic_exact_and_order_free():
    train, held = split_rows(ROWS, 50, seed=0)
    assert len(held) == 50 and len(train) == 450 and {r.prompt_id for r in train}.isdisjoint(r.prompt_id for r in held)
    train2, held2 = split_rows(list(reversed(ROWS)), 50, seed=0)
    assert {r.prompt_id for r in held2} == {r.prompt_id for r in held}
    assert {r.prompt_id for r in split_rows(ROWS, 50, seed=1)[1]} != {r.prompt_id for r in held}
    with pytest.raises(DataError):
        split_rows(ROWS[:10], 10, seed=0)


def test_fractional_split_membership_ignores_other_rows():
    held_all = {r.prompt_id for r in split_rows(ROWS, 0.2, seed=0)[1]}
    held_half = {r.prompt_id for r in split_rows(ROWS[:250], 0.2, seed=0)[1]}
    assert held_half == {pid for pid in held_all if int(pid.split("-")[1]) < 250}
    assert 60 < len(held_all) < 140  # ~Binomial(500, 0.2): mean 100, sd 9


def test_generated_data_split(tmp_path):
    cfg = parse_task_config(
        {"name": "arithmetic", "source": {"kind": "generated", "n": 300, "seed": 5}, "held_out": 30}
    )
    a, b = load_task_data(cfg), load_task_data(cfg)
    assert a.train == b.train and a.held_out == b.held_out and len(a.held_out) == 30
    assert {r.prompt for r in a.train}.isdisjoint(r.prompt for r in a.held_out)


# ---------------------------------------------------------------- stream
def test_stream_epochs_are_seeded_permutations():
    stream = PromptStream(ROWS[:50], seed=7)
    e0, e1 = stream.take(50), stream.take(50)
    assert sorted(r.prompt_id for r in e0) == sorted(r.prompt_id for r in ROWS[:50])
    assert sorted(r.prompt_id for r in e1) == sorted(r.prompt_id for r in ROWS[:50])
    assert e0 != e1 and stream.cursor == DataCursor(epoch=1, index=50)
    assert PromptStream(list(reversed(ROWS[:50])), seed=7).take(100) == e0 + e1  # file order does not matter
    assert PromptStream(ROWS[:50], seed=8).take(50) != e0


def test_stream_resumes_exactly():
    reference = PromptStream(ROWS[:30], seed=1).take(100)
    first = PromptStream(ROWS[:30], seed=1)
    head = first.take(47)
    state = first.state_dict()
    assert state["epoch"] == 1 and state["index"] == 17
    resumed = PromptStream(ROWS[:30], seed=1)
    resumed.load_state_dict(state)
    assert head + resumed.take(53) == reference
    assert PromptStream(ROWS[:30], seed=1, cursor=DataCursor(1, 17)).take(53) == reference[47:]


def test_stream_refuses_a_foreign_state():
    state = PromptStream(ROWS[:30], seed=1).state_dict()
    with pytest.raises(ValueError, match="saved for rows"):
        PromptStream(ROWS[:31], seed=1).load_state_dict(state)
    with pytest.raises(ValueError):
        PromptStream(ROWS[:30], seed=2).load_state_dict(state)
    with pytest.raises(ValueError):
        PromptStream(ROWS[:30], seed=1, cursor=DataCursor(0, 31))


def test_rows_from_records_without_a_file():
    task = build_task(parse_task_config({"name": "arithmetic"}))
    rows, report = rows_from_records(
        task, [{"prompt": "1+1=", "answer": "2"}, {"prompt": "1+2=", "answer": "three"}],
        source="inline", max_prompt_tokens=12, on_bad_row="skip",
    )
    assert [r.answer for r in rows] == ["2"] and report.skipped == {"invalid": 1}


def test_long_prompts_keep_their_last_tokens_where_they_are_encoded(tmp_path):
    """task.long_prompts keep_last: the row over max_prompt_tokens loads, and its prompt is the last
    max_prompt_tokens tokens of the full prompt, as d1 cuts (max_prompt_length, from the left)."""
    from stabledrl.common.config.model import ModelConfig
    from stabledrl.common.models import load_policy
    from stabledrl.common.tasks.prompts import prompt_ids

    _, tokenizer = load_policy(ModelConfig(preset="tiny-llada"))
    path = write_jsonl(tmp_path / "d.jsonl", GOOD + [BAD[2]])
    refused = gsm8k_config(path, on_bad_row="skip")
    kept = gsm8k_config(path, long_prompts="keep_last")
    assert load_task_data(refused, tokenizer=tokenizer).reports[0].skipped == {"too_long": 1}
    data = load_task_data(kept, tokenizer=tokenizer)
    assert data.reports[0].kept == 21
    long_row = next(r for r in data.train if r.prompt.startswith("xxx"))
    full = prompt_ids(tokenizer, build_task(refused), long_row)
    cut = prompt_ids(tokenizer, build_task(kept), long_row)
    assert len(full) > 300 and cut == full[-200:]
    short = data.train[0]
    assert prompt_ids(tokenizer, build_task(kept), short) == prompt_ids(tokenizer, build_task(refused), short)

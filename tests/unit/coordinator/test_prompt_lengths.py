"""``task.max_prompt_tokens`` counts the model's tokens of the prompt as the model reads it (chat
template included), in the data loader and in the driver, which loads the model's tokenizer for it;
too-long rows follow ``on_bad_row`` and are counted."""
from __future__ import annotations

import json

import pytest

from stabledrl.common.config.base import apply_overrides, load_yaml, validate
from stabledrl.common.config.job import JobConfig
from stabledrl.common.config.model import ModelConfig
from stabledrl.common.config.task import parse_task_config
from stabledrl.common.models.loading import load_model_tokenizer
from stabledrl.common.models.release_tokenizers import write_release_tokenizer
from stabledrl.common.tasks import DataError, load_task_data
from stabledrl.common.tasks.prompts import prompt_ids

QUESTIONS = ["What is 12 + 30 + 45?", "Tom has 3 cats and 4 dogs. How many pets?", "Is 7 prime?"]


def write_data(path):
    path.write_text("\n".join(json.dumps({"question": q, "answer": str(i)}) for i, q in enumerate(QUESTIONS)) + "\n")
    return str(path)


def task_cfg(path, limit, **kw):
    return parse_task_config({"name": "gsm8k", "source": {"path": path, "columns": {"prompt": "question"}},
                              "template": "{prompt}", "max_prompt_tokens": limit, **kw})


@pytest.fixture(scope="module")
def llada_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llada")
    write_release_tokenizer("llada", directory)
    return directory


def test_lengths_are_model_tokens_of_the_templated_prompt(tmp_path, llada_dir):
    tok = load_model_tokenizer(ModelConfig(path=llada_dir))
    path = write_data(tmp_path / "d.jsonl")
    everything = load_task_data(task_cfg(path, 512), tokenizer=tok)
    rows, task = everything.train, everything.task
    tokens = [len(prompt_ids(tok, task, r)) for r in rows]
    chars = [len(task.render_prompt(r)) for r in rows]
    assert all(t == c + 23 for t, c in zip(tokens, chars))  # 6 markers + "user", "assistant", 2 x "\n\n": 23 tokens

    limit = tokens[0]  # row 1 fits exactly; the longer row 2 does not, though its text has fewer characters
    assert chars[1] <= limit < tokens[1]
    data = load_task_data(task_cfg(path, limit, on_bad_row="skip"), tokenizer=tok)
    assert [r.prompt for r in data.train] == [QUESTIONS[0], QUESTIONS[2]]
    assert data.reports[0].skipped == {"too_long": 1}
    with pytest.raises(DataError, match=rf"line 2: prompt has {tokens[1]} tokens, more than max_prompt_tokens={limit}"):
        load_task_data(task_cfg(path, limit), tokenizer=tok)
    assert len(load_task_data(task_cfg(path, limit)).train) == 3  # characters (no tokenizer) let row 2 through


def test_a_required_template_the_tokenizer_lacks_is_refused_at_load(tmp_path):
    tok = load_model_tokenizer(ModelConfig(preset="tiny-llada"))
    with pytest.raises(DataError, match="no chat template"):
        load_task_data(task_cfg(write_data(tmp_path / "d.jsonl"), 512, chat_template="on"), tokenizer=tok)


class _Stop(Exception):
    pass


def test_the_driver_counts_prompt_tokens_with_the_models_tokenizer(tmp_path, llada_dir, monkeypatch):
    """Driver.setup (up to the first actor) keeps exactly the rows whose templated prompt fits."""
    import stabledrl.coordinator.driver as driver

    path = write_data(tmp_path / "d.jsonl")
    tok = load_model_tokenizer(ModelConfig(path=llada_dir))
    parsed = load_task_data(task_cfg(path, 512), tokenizer=tok)
    limit = len(prompt_ids(tok, parsed.task, parsed.train[0]))
    raw = apply_overrides(load_yaml("deploy/configs/quickstart.yaml"), [
        f"model={{path: {llada_dir}}}", "warmstart=null", f"run.output_dir={tmp_path / 'run'}",
        (f"task={{name: gsm8k, source: {{path: {path}, columns: {{prompt: question}}}}, template: '{{prompt}}', "
        f"max_prompt_tokens: {limit}, on_bad_row: skip}}"),
    ])
    monkeypatch.setattr(driver.ray, "cluster_resources", lambda: {"CPU": 64.0})
    monkeypatch.setattr(driver, "start_control", lambda *args: (_ for _ in ()).throw(_Stop()))  # the first actor
    d = driver.Driver(validate(JobConfig, raw))
    with pytest.raises(_Stop):
        d.setup()
    assert sorted(r.prompt for r in d.rows.values()) == sorted([QUESTIONS[0], QUESTIONS[2]])

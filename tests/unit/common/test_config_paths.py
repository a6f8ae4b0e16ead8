"""Config errors a user can type back: every line starts with the dotted path an override spells
(never the union member pydantic tried: ``task.reward.timeout_s``, not ``task.gsm8k.reward...``),
a misspelled key or choice gets the closest valid one at any depth, and swapping a recipe's data
source is an override of its fields."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from stabledrl.common.config import schema
from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.job import JobConfig, load_job_config

ROOT = Path(__file__).resolve().parents[3]
GSM8K = ROOT / "deploy/configs/recipe_stabledrl_llada8b_gsm8k.yaml"  # a Hugging Face source
FILE_RECIPE = ROOT / "deploy/configs/llada8b_1node.yaml"  # a file source
TINY = ROOT / "tests/e2e/tiny_job.yaml"


def error_lines(config: Path, overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_job_config(config, overrides)
    return [line.strip() for line in str(info.value).splitlines()[1:]]


# (config, bad overrides, the path the first line starts with, an override that fixes it)
TYPED_BACK = [
    (GSM8K, ["task.reward.timeout_s=-1"], "task.reward.timeout_s", "task.reward.timeout_s=5"),
    (GSM8K, ["task.source.split=7"], "task.source.split", "task.source.split=test"),
    (GSM8K, ["task.held_out=1.5"], "task.held_out", "task.held_out=0.5"),
    (GSM8K, ["loss.clip_max=abc"], "loss.clip_max", "loss.clip_max=4"),
    (GSM8K, ["estimator.num_draws=0"], "estimator.num_draws", "estimator.num_draws=2"),
    (TINY, ["task.name=countdown", "task.min_numbers=5"], "task.min_numbers", "task.min_numbers=3"),
    (TINY, ["loss.clip_min=9"], "loss.clip_min", "loss.clip_min=0.1"),
    (TINY, ["model.preset_shape={num_attention_heads: 3}"], "model.preset_shape.num_attention_heads",
     "model.preset_shape.num_attention_heads=4"),
    (TINY, ["task.held_out_source={path: x.jsonl}"], "task.held_out", "task.held_out=0"),
    (TINY, ["rollout.num_workers=3", "rollout.max_workers=2"], "rollout.num_workers", "rollout.num_workers=2"),
    (TINY, ["cluster.learner.resources={CPU: 1}"], "cluster.learner.resources.CPU", "cluster.learner.resources={}"),
    (TINY, ["learner.deepspeed.offload_params=cpu"], "learner.deepspeed.offload_params",
     "learner.deepspeed.offload_params=none"),
    (TINY, ["eval.protocol={name: d1, gen_lengths: [0, 3]}"], "eval.protocol.gen_lengths",
     "eval.protocol.gen_lengths=[256]"),
    (TINY, ["task.name=chess"], "task.name", "task.name=arithmetic"),
    (TINY, ["task.source.kind=nope"], "task.source.kind", "task.source.kind=generated"),
]


@pytest.mark.parametrize("config, bad, path, fix", TYPED_BACK, ids=[t[2] for t in TYPED_BACK])
def test_an_error_names_the_path_an_override_spells_and_that_override_fixes_it(config, bad, path, fix):
    lines = error_lines(config, bad)
    assert lines[0].startswith(path) and lines[0][len(path)] in ": (=", lines
    for line in lines:
        lead = re.match(r"[A-Za-z_][\w.]*", line).group(0)
        assert schema.resolves(JobConfig, lead), (lead, line)
        assert not re.match(r"task\.(arithmetic|countdown|gsm8k|math|sudoku4|generic)\b", line), line
    load_job_config(config, [*bad, fix])  # the path, typed back with a good value, is accepted


# (config, overrides, every fragment of the message)
SUGGESTED = [
    (TINY, ["task.reward.sandbox.memroy_mb=2"], ["task.reward.sandbox.memroy_mb: unknown key",
                                                 "did you mean memory_mb"]),
    (TINY, ["task.rewrd.timeout_s=3"], ["task.rewrd: unknown key", "did you mean reward?"]),
    (TINY, ["algorithm.lr=3"], ["algorithm.lr: unknown key", "did you mean learner.optimizer.lr"]),
    (TINY, ["task.name=arithmtic"], ["task.name: 'arithmtic' is not one of", "did you mean 'arithmetic'"]),
    (TINY, ["sampler.remasking=low_confidance"], ["sampler.remasking", "did you mean 'low_confidence'"]),
    (TINY, ["loss.name=stabledlr"], ["loss.name", "did you mean 'stabledrl'"]),
    (TINY, ["task.source.pth=x"], ["task.source.pth: unknown key", "did you mean path?",
                                   "task.source.kind=file"]),
    (GSM8K, ["task.source.path=x.jsonl"], ["task.source.path: unknown key",
                                            "path is a key of task.source.kind=file"]),
]


@pytest.mark.parametrize("config, overrides, fragments", SUGGESTED, ids=[s[1][0] for s in SUGGESTED])
def test_a_misspelled_key_or_choice_gets_the_closest_valid_one(config, overrides, fragments):
    message = "\n".join(error_lines(config, overrides))
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_a_misspelled_key_in_the_yaml_file_gets_the_same_suggestion(tmp_path):
    data = yaml.safe_load(TINY.read_text())
    data["task"]["reward"]["timout_s"] = 3
    data["learner"]["optimizer"]["learning_rate"] = 1e-3
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    message = "\n".join(error_lines(path, []))
    assert "task.reward.timout_s: unknown key (got 3); did you mean timeout_s?" in message
    assert "learner.optimizer.learning_rate: unknown key" in message


def test_a_recipes_data_source_is_swapped_by_overriding_its_fields():
    file_recipe = load_job_config(FILE_RECIPE, ["task.source.path=data/mine.parquet"])
    assert str(file_recipe.task.source.path) == "data/mine.parquet"
    assert file_recipe.task.source.columns == {"prompt": "question"}  # the rest of the dict is kept
    hub_recipe = load_job_config(GSM8K, ["task.source.kind=file", "task.source.path=data/mine.jsonl"])
    assert hub_recipe.task.source.kind == "file" and hub_recipe.task.source.path == "data/mine.jsonl"
    assert hub_recipe.task.source.columns == {"prompt": "question"}  # dataset, config, split dropped
    other_split = load_job_config(GSM8K, ["task.source.split=test"])
    assert (other_split.task.source.dataset, other_split.task.source.split) == ("openai/gsm8k", "test")


def test_switching_a_union_member_keeps_the_keys_an_override_sets():
    staircase = load_job_config(TINY, ["estimator.name=staircase", "estimator.t_min=0.2"])
    assert staircase.estimator.name == "staircase" and staircase.estimator.t_min == 0.2
    lines = error_lines(TINY, ["estimator.name=staircase", "estimator.block_length=4"])
    assert lines[0].startswith("estimator.block_length: unknown key")  # set by the user: not dropped silently


def test_schema_walk_drops_union_tags_and_keeps_dict_keys():
    walked = schema.walk(JobConfig, ("task", "gsm8k", "source", "hf", "columns", "prompt"))
    assert walked.dotted == "task.source.columns.prompt"
    assert schema.walk(JobConfig, ("eval", "protocol", "gen_lengths", 1)).items == [1]
    assert schema.resolves(JobConfig, "cluster.learner.resources.learner_node")
    assert not schema.resolves(JobConfig, "task.gsm8k.source")

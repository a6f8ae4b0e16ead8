"""Job-config YAML: a key given twice in one mapping is refused naming the key and both lines (plain
YAML keeps the last silently); merge keys still override; unreadable files name the file."""
from __future__ import annotations

import pytest

from stabledrl.common.config.base import ConfigError, load_yaml
from stabledrl.common.config.job import load_job_config

QUICKSTART = open("deploy/configs/quickstart.yaml").read()


def test_a_section_given_twice_is_refused_with_its_lines(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(QUICKSTART + "run: {steps: 3}\n")
    first = QUICKSTART.splitlines().index(next(line for line in QUICKSTART.splitlines() if line.startswith("run:"))) + 1
    last = len(QUICKSTART.splitlines()) + 1
    with pytest.raises(
        ConfigError, match=rf"{path}: key 'run' appears twice in one mapping \(line {first} and line {last}\)"
    ):
        load_job_config(path)


def test_nested_and_flow_duplicates_are_refused(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("loss:\n  name: stabledrl\n  clip_max: 5.0\n  name: grpo\n")
    with pytest.raises(ConfigError, match=r"key 'name' appears twice in one mapping \(line 2 and line 4\)"):
        load_yaml(path)
    path.write_text("sampler: {steps: 4, gen_length: 8, steps: 8}\n")
    with pytest.raises(ConfigError, match="key 'steps' appears twice"):
        load_yaml(path)


def test_merge_keys_still_override(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("base: &b {steps: 4, gen_length: 8}\nsampler:\n  <<: *b\n  steps: 2\n")
    assert load_yaml(path)["sampler"] == {"steps": 2, "gen_length": 8}


def test_unreadable_yaml_names_the_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes(b"run: {name: caf\xe9}\n")
    with pytest.raises(ConfigError, match=rf"config file {path} is not UTF-8"):
        load_yaml(path)
    path.write_text("run: {steps: 3\n")
    with pytest.raises(ConfigError, match=rf"(?s)config file {path}: .*line 2"):
        load_yaml(path)

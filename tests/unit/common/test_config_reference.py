"""The config reference (docs/config.md, `stabledrl config`): generated from the models, so the
committed page is never stale; every key it lists is a path an override takes, with a type, a
default and a description."""
from __future__ import annotations

import re
from pathlib import Path

import stabledrl.cli.main as cli
from stabledrl.common.config import schema
from stabledrl.common.config.job import JobConfig
from stabledrl.common.config.reference import reference

PAGE = Path(__file__).resolve().parents[3] / "docs" / "config.md"


def test_the_committed_page_is_the_generated_one():
    assert PAGE.read_text() == reference(JobConfig), "docs/config.md is stale: run `stabledrl config > docs/config.md`"


def test_every_key_of_every_section_is_listed_with_a_description():
    text = reference(JobConfig)
    listed = set(re.findall(r"^\| `([^`]+)` \|", text, re.M))
    pointers = dict(re.findall(r"^#+ `([^`]+)`\n\nThe same keys as `([^`]+)`", text, re.M))
    for path in schema.field_paths(JobConfig):
        walked = schema.walk(JobConfig, path.split("."))
        members = walked.models()
        tag = schema.tag_field(schema.union_members(JobConfig, ".".join(path.split(".")[:-1])))
        if path.rsplit(".", 1)[-1] == tag or members and not any(
                not schema.is_model(c) for c in schema.leaves(walked.candidates[0])):
            continue  # a union's tag (its kinds are listed) or a section (a heading of its own)
        same = [(p, q) for p, q in pointers.items() if path.startswith(f"{p}.")]  # "The same keys as q"
        assert path in listed or any(q + path[len(p):] in listed for p, q in same), path
    for row in re.findall(r"^\| `[^`]+` \|.*\|$", text, re.M):
        key, kind, default, description = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:5]]
        assert kind and description, row
        assert default or kind == "section", row
    assert {"task.reward.custom", "task.reward.custom_weights", "task.correct_at", "run.progress_every_s",
            "task.source.path", "eval.protocol.benchmarks.<key>.num_prompts"} <= listed


def test_listed_keys_are_override_paths():
    for key in set(re.findall(r"^\| `([^`<]+)` \|", reference(JobConfig), re.M)):
        assert schema.resolves(JobConfig, key), key


def test_the_command_prints_the_reference_one_section_or_one_key(capsys):
    assert cli.main(["config"]) == 0
    assert capsys.readouterr().out == reference(JobConfig)
    assert cli.main(["config", "task.reward.sandbox"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#### `task.reward.sandbox`")
    assert "| `task.reward.sandbox.memory_mb` | int (>= 64, <= 1048576) | 4096 |" in out
    assert cli.main(["config", "task.reward.timeout_s"]) == 0
    assert capsys.readouterr().out.count("| `task.reward.timeout_s` |") == 1
    assert cli.main(["config", "task.rewrd"]) == 2
    assert "no section 'task.rewrd'; did you mean task.reward?" in capsys.readouterr().err

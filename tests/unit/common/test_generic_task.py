"""The generic task: any prompt column (or chat messages) and any columns, the user's reward decides,
nothing is added to the prompt unless the config says so, held-out evaluation judges by the reward
against task.correct_at; and the built-in math task's instruction is explicit in the config."""
from __future__ import annotations

import io
import json
import textwrap

import pytest
import torch
import yaml

from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.job import load_job_config
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.config.task import parse_task_config
from stabledrl.common.sandbox.scorer import RewardScorer
from stabledrl.common.tasks import build_task, load_task_data
from stabledrl.common.tokenizer import build_char_tokenizer
from stabledrl.rollout.evaluate import evaluate
from stabledrl.rollout.sampling import GenerationOutput

TOK = build_char_tokenizer()
RECORDS = [
    {"question": "Is the sky blue?", "label": "yes", "source": "quiz", "extra": {"level": 1}},
    {"question": "Is fire cold?", "label": "no", "source": "quiz", "extra": {"level": 2}},
    {"question": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Is ice cold?"}],
     "label": "yes", "source": "chat"},
]
REWARD = textwrap.dedent(
    """
    def match(prompts, completions, label, **kwargs):
        texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
        return [1.0 if t.strip() == l else 0.5 if t.strip() in ("yes", "no") else 0.0 for t, l in zip(texts, label)]
    """
)


@pytest.fixture
def data_dir(tmp_path):
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    (tmp_path / "rewards.py").write_text(REWARD)
    return tmp_path


def generic(data_dir, **fields):
    return parse_task_config({
        "name": "generic", "source": {"kind": "file", "path": str(data_dir / "data.jsonl"),
                                      "columns": {"prompt": "question"}},
        "reward": {"custom": f"{data_dir / 'rewards.py'}:match", "isolation": "inline"}, **fields})


def test_any_prompt_column_or_chat_messages_and_every_column_reach_the_reward_unchanged(data_dir):
    data = load_task_data(generic(data_dir))
    rows, task = data.train, data.task
    assert [task.render_prompt(r) for r in rows[:2]] == ["Is the sky blue?", "Is fire cold?"]  # nothing appended
    assert task.messages(rows[2]) == RECORDS[2]["question"]  # the data's own conversation
    assert rows[0].record == RECORDS[0] and rows[0].answer == ""  # every column; no answer needed
    with RewardScorer(generic(data_dir), task) as scorer:
        got = scorer.score_batch(["yes", "yes", "yes"], rows)
    assert [r.total for r in got] == [1.0, 0.5, 1.0]


def test_an_instruction_is_added_only_when_the_config_writes_one(data_dir):
    task = build_task(generic(data_dir, template="{prompt}\n\nAnswer yes or no."))
    rows = load_task_data(generic(data_dir, template="{prompt}\n\nAnswer yes or no.")).train
    assert task.render_prompt(rows[0]) == "Is the sky blue?\n\nAnswer yes or no."


class Answering:
    """An engine that answers every prompt with the text ``answers`` gives it (then EOS)."""

    policy_version, eos_token_id, pad_token_id, vocab_size = 0, TOK.eos_token_id, TOK.pad_token_id, len(TOK)

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers

    def generate(self, prompts, seeds, cfg) -> GenerationOutput:
        ids = torch.full((len(prompts), cfg.gen_length), self.eos_token_id, dtype=torch.long)
        lengths = torch.zeros(len(prompts), dtype=torch.long)
        for b, prompt in enumerate(prompts):
            text = self.answers[TOK.decode(prompt.tolist())]
            ids[b, : len(text)] = torch.tensor(TOK.encode(text, add_special_tokens=False))
            lengths[b] = len(text) + 1
        return GenerationOutput(completion_ids=ids, completion_length=lengths, decode_step=torch.zeros_like(ids),
                                policy_version=0, tokens_generated=0, num_forwards=0, time_s=0.0)


@pytest.mark.parametrize("correct_at, pass_at_1", [(2.0, 0.5), (1.0, 1.0)])
def test_held_out_evaluation_counts_a_completion_correct_when_its_reward_reaches_correct_at(
        data_dir, correct_at, pass_at_1):
    cfg = generic(data_dir, correct_at=correct_at)
    cfg.reward.correctness_weight = 2.0  # the whole reward (2 x match) judges, not the function's own value
    data = load_task_data(cfg)
    rows = data.train[:2]
    engine = Answering({"Is the sky blue?": "yes", "Is fire cold?": "yes"})  # right, then wrong but well-formed
    sampler = SamplerConfig(gen_length=4, block_length=4, steps=4, temperature=0.0)
    with RewardScorer(cfg, data.task) as scorer:
        result = evaluate(engine, rows, data.task, TOK, sampler, scorer=scorer)
    assert result.pass_at[1] == pass_at_1 and result.mean_correctness == 1.5


def test_the_generic_task_needs_a_reward_and_has_no_format_part_or_warm_start(data_dir, tmp_path):
    source = {"kind": "file", "path": "x.jsonl"}
    with pytest.raises(ConfigError, match=r"task.reward.custom: the generic task has no checker"):
        parse_task_config({"name": "generic", "source": source})
    with pytest.raises(ConfigError, match=r"task.reward.format_weight: the generic task has no format check"):
        parse_task_config({"name": "generic", "source": source, "reward": {"custom": "r.py:f", "format_weight": 0.1}})
    job = tmp_path / "job.yaml"
    job.write_text(f"model: {{preset: tiny-llada}}\ntask: {{name: generic, source: {json.dumps(source)}, "
                   "reward: {custom: 'r.py:f'}}\nestimator: {name: elbo_mc}\nloss: {name: stabledrl}\n"
                   "warmstart: {steps: 1}\nlearner: {num_ranks: 1}\n")
    with pytest.raises(ConfigError, match=r"warmstart: the generic task has no reference completions"):
        load_job_config(job)
    assert load_job_config(job, ["warmstart=null"]).task.name == "generic"


def test_a_built_in_tasks_instruction_is_in_the_config_and_the_dry_run(tmp_path):
    from stabledrl.cli.dry_run import dry_run

    cfg = load_job_config("deploy/configs/llada8b_multinode.yaml")  # math, no template of its own
    assert cfg.task.model_dump()["template"].endswith("put your final answer in \\boxed{}.")
    out = io.StringIO()
    dry_run(cfg, out=out)
    assert yaml.safe_load(out.getvalue())["task"]["template"] == cfg.task.template  # the resolved config shows it
    assert "#   prompts: task.template '{prompt}\\nReason step by step and put your final answer in" in out.getvalue()
    bare = load_job_config("deploy/configs/llada8b_multinode.yaml", ["task.template='{prompt}'"])
    out = io.StringIO()
    dry_run(bare, out=out)
    assert "#   prompts: the data's prompt as it is, nothing added (task.template '{prompt}')" in out.getvalue()

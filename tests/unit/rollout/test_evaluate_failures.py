"""A held-out evaluation whose reward fails on every call stops as a job's rollouts do: scoring
ends once the failures make the verdict certain (task.reward.max_failed_fraction), the result says
why, the coordinator stops the job naming the reward, and `stabledrl eval` exits 1 with that line.
Before, the failure-rate stop covered training only: a reward that timed out on every call held the
job in its step-0 evaluation, silent, for every one of its calls."""
from __future__ import annotations

from pathlib import Path

from stabledrl.common.config.task import parse_task_config
from stabledrl.common.sandbox.scorer import RewardScorer
from stabledrl.common.tasks import build_task
from stabledrl.common.types import EvalResult
from stabledrl.rollout.evaluate import evaluate
from tests.unit.rollout.test_evaluate import SAMPLER, TOK, OracleEngine, arithmetic

SLOW = "import time\n\ndef score(completion, row):\n    time.sleep(60)\n    return 1.0\n"


def slow_task(tmp_path: Path, **reward):
    path = tmp_path / "slow.py"
    path.write_text(SLOW)
    return parse_task_config({"name": "arithmetic", "digits": 2, "held_out": 0, "source": {"kind": "generated",
                              "n": 40}, "reward": {"custom": f"{path}:score", "isolation": "process",
                                                   "format_weight": 0.0, "timeout_s": 0.1, **reward}})


def test_scoring_stops_once_the_failures_make_the_verdict_certain(tmp_path):
    cfg = slow_task(tmp_path)
    rows = arithmetic(40).train[:40]
    task = build_task(cfg)
    with RewardScorer(cfg) as scorer:
        engine = OracleEngine(task, rows, lambda row, seed: row.answer)
        result = evaluate(engine, rows, task, TOK, SAMPLER, samples_per_prompt=2, seed=1, scorer=scorer,
                          failure_check=cfg)
        # a prompt's 2 samples are scored as one batch; after 17 prompts, 34 timeouts of 80 calls: more
        # than 0.5 of 64, certain
        assert scorer.stats.calls == 34 < 80
    assert "failed on 34 of 34 calls (34 timeout), more than task.reward.max_failed_fraction = 0.5" in result.stopped
    assert result.reward_calls["timeout"] == 34 and result.reward_calls["calls"] == 34
    assert result.num_prompts == 17 and len(result.correct) == 17  # the prompts scored before it stopped


def test_without_the_check_or_under_the_fraction_it_scores_everything(tmp_path):
    rows = arithmetic(40).train[:10]
    cfg = slow_task(tmp_path)
    task = build_task(cfg)
    never = slow_task(tmp_path, max_failed_fraction=1.0)
    with RewardScorer(cfg) as scorer:
        engine = OracleEngine(task, rows, lambda row, seed: row.answer)
        result = evaluate(engine, rows, task, TOK, SAMPLER, samples_per_prompt=1, seed=1, scorer=scorer,
                          failure_check=never)
    assert not result.stopped and result.num_prompts == 10 and result.scoring_failures == 10


def test_the_coordinator_stops_the_job_at_the_first_part_that_stopped():
    from stabledrl.coordinator.decisions import events as ev
    from stabledrl.coordinator.decisions.evaluation import Evaluation
    from tests.unit.coordinator.test_control_machines import ROWS, fleet, job

    cfg = job(eval={"num_prompts": 4})
    evaluation = Evaluation(cfg, ROWS[:4], fleet())
    out, _ = evaluation.evaluate(step=0, first=True)
    ok = EvalResult(2, 1, {1: 0.5}, 0.5, [1, 0], reward_calls={"calls": 2.0, "ok": 2.0})
    assert evaluation.eval_done(ev.EvalDone(out[0].call, 0, ok)) == []
    stopped = EvalResult(1, 1, {1: 0.0}, 0.0, [0], reward_calls={"calls": 33.0, "failed": 33.0, "timeout": 33.0},
                         stopped="custom reward r.py:score failed on 33 of 33 calls (33 timeout)")
    (stop,) = evaluation.eval_done(ev.EvalDone(out[1].call, 0, stopped))
    assert isinstance(stop, ev.Stop) and stop.reason.startswith("held-out evaluation at step 0: custom reward r.py")


def test_the_coordinator_sums_the_parts_calls_too():
    """Parts that each stay under the verdict (20 failures of 20 calls) stop the job together."""
    from stabledrl.coordinator.decisions import events as ev
    from stabledrl.coordinator.decisions.evaluation import Evaluation
    from tests.unit.coordinator.test_control_machines import ROWS, fleet, job

    cfg = job(eval={"num_prompts": 4})
    evaluation = Evaluation(cfg, ROWS[:4], fleet())
    out, _ = evaluation.evaluate(step=0, first=True)
    part = EvalResult(2, 10, {1: 0.0}, 0.0, [0, 0], reward_calls={"calls": 20.0, "failed": 20.0, "exception": 20.0})
    assert evaluation.eval_done(ev.EvalDone(out[0].call, 0, part)) == []
    (stop,) = evaluation.eval_done(ev.EvalDone(out[1].call, 0, part))
    assert "failed on 40 of 40 calls (40 exception)" in stop.reason


def test_stabledrl_eval_exits_1_naming_the_reward(tmp_path, capsys, monkeypatch):
    import yaml

    import stabledrl.cli.main as cli

    monkeypatch.setenv("STABLEDRL_KEY_FILE", str(tmp_path / "key"))
    (tmp_path / "slow.py").write_text(SLOW)
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"preset": "tiny-llada"},
        "task": {"name": "arithmetic", "held_out": 40, "source": {"kind": "generated", "n": 80},
                 "reward": {"custom": f"{tmp_path / 'slow.py'}:score", "format_weight": 0.0, "timeout_s": 0.1}},
        "sampler": {"gen_length": 4, "block_length": 4, "steps": 4}, "estimator": {"name": "block_random",
                                                                                 "block_length": 4},
        "loss": {"name": "stabledrl"}, "algorithm": {"group_size": 4, "groups_per_step": 2},
        "eval": {"num_prompts": 40}}))
    from stabledrl.common.models.export import write_preset
    from stabledrl.common.config.model import ModelConfig

    model = write_preset(ModelConfig(preset="tiny-llada"), tmp_path / "model", fmt="hf")
    assert cli.main(["eval", "--config", str(config), "--model", str(model)]) == 1
    err = capsys.readouterr().err
    assert f"stabledrl: eval failed: custom reward {tmp_path / 'slow.py'}:score failed on 33 of 33 calls " \
           "(33 timeout)" in err, err

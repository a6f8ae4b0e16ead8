"""Hangs on real Ray actors: a rollout worker that freezes (SIGSTOP, as a deadlock would look from
outside) is killed once its call runs past rollout.request_timeout_s and replaced like a dead one,
in the protocol evaluation (eval.protocol) and the held-out evaluation as during training. The job
runs to the end through ``Driver.run``: the frozen worker's protocol units and evaluation part run
again on another worker (BEFORE and AFTER cover every benchmark and held-out prompt), its prompts
are re-queued, and every prompt is trained exactly once."""
from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest

ray = pytest.importorskip("ray")

import harness  # noqa: E402
from stabledrl.common.metrics import read_metrics  # noqa: E402
from stabledrl.coordinator.driver import Driver  # noqa: E402
from stabledrl.recipes.stages import JOB_STAGES  # noqa: E402
from harness import append, job_config, read_records  # noqa: E402

pytestmark = pytest.mark.e2e
TIMEOUT_S = 10.0  # rollout.request_timeout_s: a request or step of this tiny model takes well under a second
HUNG = f"hung (no answer within {TIMEOUT_S:.0f} s (rollout.request_timeout_s); killed)"


def freezing_rollout(records):
    """Worker 0 freezes its own process (SIGSTOP) in its first protocol unit, worker 1 in its first
    held-out evaluation (both before training, in that order: protocol units come first), and the
    first worker to start its third rollout request in it, whichever worker that is (the two that
    froze were replaced by then); the frozen pids are kept in marker files."""

    class FreezingRollout(harness.InspectedRollout):
        def __init__(self, index, *args, **kwargs):
            super().__init__(index, *args, **kwargs)
            self.calls = 0

        def freeze(self, what: str) -> None:
            marker = records / f"froze_{what}"
            if not marker.exists():
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGSTOP)

        def complete(self, prompts, seeds, sampler):
            if self.index == 0:
                self.freeze("protocol")
            return super().complete(prompts, seeds, sampler)

        def evaluate(self, rows, *args, **kwargs):
            append(
                records / f"rollout_{os.getpid()}.jsonl", {"worker": self.index, "pid": os.getpid(), "eval": len(rows)}
            )
            if self.index == 1:
                self.freeze("eval")
            return super().evaluate(rows, *args, **kwargs)

        def generate(self, requests):
            self.calls += 1
            if self.calls == 3:
                self.freeze("rollout")
            episodes = super().generate(requests)
            append(records / f"rollout_{os.getpid()}.jsonl",
                   {"worker": self.index, "pid": os.getpid(), "uids": [r.uid for r in requests]})
            return episodes

    return FreezingRollout


def protocol_section(directory) -> dict:
    """eval.protocol: 4 GSM8K-style questions of a file, one unit each."""
    gsm = directory / "gsm.jsonl"
    gsm.write_text(
        "".join(json.dumps({"question": f"Ann has {i} pens.", "answer": f"#### {i}"}) + "\n" for i in range(4))
    )
    return {
        "benchmarks": {"gsm8k": {"source": {"kind": "file", "path": str(gsm), "columns": {"prompt": "question"}}}},
        "gen_lengths": [8],
        "block_length": 4,
        "batch_size": 1,
    }


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().split()[2] != "Z"


def test_a_frozen_worker_is_killed_and_replaced_in_each_evaluation_and_in_training(cluster, tmp_path, job_log):
    records = tmp_path / "records"
    records.mkdir()
    cfg = job_config(tmp_path / "run", task={"held_out": 6, "source": {"kind": "generated", "n": 22}},
                     learner={"num_ranks": 1}, rollout={"request_timeout_s": TIMEOUT_S, "max_restarts": 2},
                     eval={"num_prompts": 6, "protocol": protocol_section(tmp_path)}, run={"steps": 4})
    lines = job_log
    driver = Driver(cfg, rollout_cls=freezing_rollout(records), learner_cls=harness.InspectedLearner,
                    stages=JOB_STAGES, record_batches=True)
    t0 = time.monotonic()
    result = driver.run()
    assert time.monotonic() - t0 < 600

    frozen = [int((records / f"froze_{what}").read_text()) for what in ("protocol", "eval", "rollout")]
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in frozen) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(alive(pid) for pid in frozen), "a frozen process was left running"

    last = driver.history[-1]
    assert last["faults/rollout_worker_hangs"] == 3 and last["faults/rollout_workers_replaced"] == 3
    assert last["faults/rollout_worker_deaths"] == 0
    hung = [line for line in lines if HUNG in line]
    assert len(hung) == 3, lines
    assert any("unit(s) run again after their worker was lost" in line for line in lines), lines
    assert any("1 part(s) run again after their worker was lost" in line for line in lines), lines
    # both evaluations covered every benchmark prompt and every held-out prompt; the run's own line compares them
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in metrics if "protocol/gsm8k@8" in r] == [0, 4]  # BEFORE and AFTER, all 4 prompts
    graded = [json.loads(line) for line in (tmp_path / "run" / "protocol" / "step0" / "results.jsonl").read_text()
              .splitlines()]
    assert sorted(r["prompt_id"] for r in graded) == sorted({r["prompt_id"] for r in graded}) and len(graded) == 4
    assert result.before.num_prompts == result.after.num_prompts == 6
    assert any(line.startswith("held-out accuracy:") for line in lines)
    # every prompt admitted was trained exactly once, the frozen request's ones included
    trained = Counter(e.uid for batch in driver.batches for e in batch)
    assert sorted(trained) == list(range(16)) and set(trained.values()) == {1}
    calls = read_records(records, "rollout_")
    assert {c["worker"] for c in calls if "uids" in c} == {0, 1}  # both workers' replacements took work of their own

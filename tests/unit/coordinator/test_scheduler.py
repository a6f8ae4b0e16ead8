"""The scheduler's fault and elasticity paths, driven by scripted events (scheduler_sim.py): no Ray,
no model, milliseconds each. Each test scripts what the runtime would report and checks the
commands that come back and the accounting of prompt uids."""
from __future__ import annotations

from stabledrl.coordinator.decisions import events as ev
from stabledrl.coordinator.decisions.snapshot import WorkerView
from scheduler_sim import ROWS, Sim, job, result


def test_the_scheduler_imports_no_ray_anywhere_in_its_import_graph():
    """Every module of stabledrl that stabledrl.coordinator.decisions.scheduler reaches, through any
    import (also one inside a function), and every outside package they name: no ray."""
    import ast
    import importlib.util
    from pathlib import Path

    def module_file(name: str):
        """(module, its file) for the longest prefix of ``name`` that is a stabledrl module."""
        parts = name.split(".")
        while parts:
            try:
                spec = importlib.util.find_spec(".".join(parts))
            except ModuleNotFoundError:
                spec = None
            if spec is not None and spec.origin:
                return ".".join(parts), Path(spec.origin)
            parts.pop()
        raise AssertionError(f"{name} is not a module of stabledrl")

    seen, todo, outside = set(), ["stabledrl.coordinator.decisions.scheduler"], {}
    while todo:
        module, path = module_file(todo.pop())
        if module in seen:
            continue
        seen.add(module)
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] + [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) \
                and node.module else []
            for name in names:
                if name.split(".")[0] == "stabledrl":
                    todo.append(name)
                else:
                    outside.setdefault(name.split(".")[0], module)
    # the walk reached the scheduler's parts
    assert "stabledrl.coordinator.decisions.events" in seen and "stabledrl.common.tasks.stream" in seen
    assert "ray" not in outside, f"{outside.get('ray')} imports ray"


def test_a_synchronous_step_admits_a_batch_trains_it_then_pushes_before_admitting_more():
    sim = Sim(job())
    first = sim.begin("train")
    generates = [c for c in first if isinstance(c, ev.Generate)]
    assert [(c.worker, [r.uid for r in c.requests]) for c in generates] == [(0, [0]), (1, [1]), (0, [2]), (1, [3])]
    sim.finish_rollouts()
    assert sim.trained() == [[0, 1, 2, 3]]
    after_step = sim.step_done()
    assert [type(c) for c in after_step][:1] == [ev.Push] and not any(isinstance(c, ev.Generate) for c in after_step)
    loads = sim.pending(ev.LoadWeights)
    assert sorted(c.worker for c in loads) == [0, 1] and {c.version for c in loads} == {1}
    after_push = sim.push_done()
    records = [c for c in after_push if isinstance(c, ev.Record)]
    assert [r.step for r in records] == [1] and records[0].batch is not None
    assert any(isinstance(c, ev.PollControl) for c in after_push)
    assert [r.uid for c in after_push if isinstance(c, ev.Generate) for r in c.requests] == [4, 5, 6, 7]
    assert sim.scheduler.fleet.versions() == [1, 1]


def test_a_worker_that_dies_mid_request_has_its_prompts_requeued_by_uid_and_is_replaced():
    sim = Sim(job())
    sim.begin("train")
    dead = sim.take(ev.Generate, worker=1)
    sim.send(ev.CallFailed(dead[0].call, "died", "The actor died unexpectedly"))
    (start,) = sim.pending(ev.StartWorker)
    assert start.worker == 1 and start.replaces
    snap = sim.scheduler.snapshot()
    assert snap.requeued == (1, 3) and snap.outstanding == (0, 1, 2, 3)  # nothing lost
    assert "rollout worker 1 died (The actor died unexpectedly); prompts 1, 3 re-queued; replacement 1 of at most 2" \
        in sim.logs()[-1]
    assert sim.scheduler.snapshot().worker_metrics["rollout/workers"] == 1.0  # the dead one is not counted
    sim.finish_rollouts(worker=0)  # worker 0 finishes its two and takes the re-queued prompts
    regenerated = [r.uid for c in sim.pending(ev.Generate) for r in c.requests]
    assert regenerated == [1, 3] and {c.worker for c in sim.pending(ev.Generate)} == {0}
    sim.started(start)
    assert sim.scheduler.snapshot().workers[1] == WorkerView(1, "active", restarts=1, version=0)
    sim.finish_rollouts()
    assert sim.trained() == [[0, 1, 2, 3]]
    counts = sim.scheduler.snapshot().counts
    assert counts["faults/rollout_worker_deaths"] == 1 and counts["faults/rollout_workers_replaced"] == 1


def test_a_worker_that_keeps_dying_stops_the_job_after_its_restart_budget():
    sim = Sim(job(rollout={"max_restarts": 1}))
    sim.begin("train")
    sim.send(ev.CallFailed(sim.take(ev.Generate, worker=1)[0].call, "died", "killed"))
    sim.started(sim.pending(ev.StartWorker)[0])
    sim.finish_rollouts(worker=0)
    again = sim.take(ev.Generate, worker=1) or sim.take(ev.Generate)
    sim.send(ev.CallFailed(again[0].call, "died", "killed again"))
    reason = sim.stop() or ""
    assert reason.startswith("rollout worker") and "died 2 times, the last time: killed again; giving up " \
        "(rollout.max_restarts = 1)" in reason and "stabledrl train --resume /tmp/sim-run" in reason
    assert sim.scheduler.done


def test_a_result_from_a_replaced_process_is_ignored_not_counted_twice():
    sim = Sim(job())
    sim.begin("train")
    first, second = sim.take(ev.Generate, worker=1)
    sim.send(ev.CallFailed(first.call, "died", "killed"))  # both calls of worker 1 are forgotten
    sim.rollout_done(second)  # the old process's second answer arrives anyway (it was already on the wire)
    assert not sim.scheduler.snapshot().delivered and sim.scheduler.snapshot().reward_calls == {}
    sim.started(sim.pending(ev.StartWorker)[0])
    for _ in range(3):
        sim.finish_rollouts()
    assert sim.trained() == [[0, 1, 2, 3]]
    snap = sim.scheduler.snapshot()
    assert snap.duplicates == 0 and snap.reward_calls["reward_calls/calls"] == 4 * 2  # every trained sample scored once


def test_a_hung_worker_is_killed_replaced_and_its_prompts_requeued():
    sim = Sim(job())
    sim.begin("train")
    hung = sim.take(ev.Generate, worker=0)
    commands = sim.send(ev.CallFailed(hung[0].call, "timed_out", "5 s"))
    (start,) = [c for c in commands if isinstance(c, ev.StartWorker)]
    assert start.worker == 0 and start.replaces  # the runtime kills the old process and starts another
    assert sim.scheduler.snapshot().requeued == (0, 2)
    assert "rollout worker 0 hung (no answer within 5 s (rollout.request_timeout_s); killed); prompts 0, 2 " \
           "re-queued; replacement 1 of at most 2 starting" in sim.logs()
    counts = sim.scheduler.snapshot().counts
    assert counts["faults/rollout_worker_hangs"] == 1 and counts["faults/rollout_worker_deaths"] == 0


def test_a_stale_group_is_dropped_and_counted():
    sim = Sim(job(algorithm={"max_staleness": 1, "groups_per_step": 1}, rollout={"requests_per_worker": 1},
                  learner={"num_ranks": 1}))
    sim.begin("train")
    slow = sim.take(ev.Generate, worker=1)[0]  # uid 1, sampled at version 0, comes back last
    sim.finish_rollouts(worker=0)
    for _ in range(2):  # two steps on worker 0's groups while uid 1 is out
        sim.step_done()
        sim.push_done()
        sim.poll_done()
        sim.finish_rollouts(worker=0)
    assert sim.scheduler.staleness.version == 2
    sim.rollout_done(slow, version=0)  # 2 - 0 > η = 1: too old for the learner once it takes a batch
    sim.step_done()  # step 3 (already running) ends; the next take drops the old group
    sim.push_done()
    sim.poll_done()
    assert sim.scheduler.staleness.dropped_total == 1 and 1 not in sum(sim.trained(), [])
    sim.finish_rollouts()
    sim.step_done()
    sim.push_done()
    record = [c for c in sim.commands if isinstance(c, ev.Record) and c.batch is not None][-1]
    assert record.step == 4 and record.metrics["staleness/dropped_total"] == 1.0
    assert sum(r.metrics["staleness/dropped"] for r in sim.commands if isinstance(r, ev.Record) and r.batch) == 1.0


def test_a_learner_failure_stops_the_job_naming_the_rank_and_how_to_resume():
    sim = Sim(job())
    sim.begin("train")
    sim.finish_rollouts()
    sim.take(ev.Train)
    sim.send(ev.LearnerFailed("step 1", [ev.RankOutcome(0, "raised", "RuntimeError: gloo connection closed"),
                                         ev.RankOutcome(1, "died", "The actor died unexpectedly")]))
    reason = sim.stop()
    assert reason.startswith("learner rank 1 (step 1) died (The actor died unexpectedly); learner rank 0 (step 1) "
                             "failed: RuntimeError: gloo connection closed. The job stops; "
                             "`stabledrl train --resume /tmp/sim-run` continues")
    hung = Sim(job())
    hung.begin("train")
    hung.finish_rollouts()
    hung.take(ev.Train)
    hung.send(ev.LearnerFailed("step 1", [ev.RankOutcome(0, "ok"), ev.RankOutcome(1, "running")], timeout_s=5))
    assert hung.stop().startswith("no answer within 5 s from learner rank 1 (step 1). The job stops")


def test_scale_out_and_scale_in_follow_the_requested_size():
    sim = Sim(job(rollout={"max_workers": 3}))
    sim.begin("train")
    sim.finish_rollouts()
    sim.step_done()
    sim.push_done()
    added = [c for c in sim.poll_done(requested=3) if isinstance(c, ev.StartWorker)]
    assert [(c.worker, c.replaces) for c in added] == [(2, False)]
    commands = sim.started(added[0])
    setup, load = [c for c in commands if isinstance(c, (ev.SetupWorkerPush, ev.LoadWeights))]
    assert setup.worker == load.worker == 2 and load.version == 1  # the newest weights, before any request
    assert commands.index(setup) < commands.index(load)
    assert sim.scheduler.snapshot().counts["elastic/workers_added"] == 1
    sim.send(ev.WeightsLoaded(sim.take(ev.LoadWeights, worker=2)[0].call, 1))
    sim.finish_rollouts()
    sim.step_done()
    sim.push_done()
    sim.poll_done(requested=1)  # the two newest retire once their calls are back
    fleet = sim.scheduler.fleet
    assert [w.state for w in fleet.workers.values()] == ["active", "retiring", "retiring"]
    sim.finish_rollouts()
    assert sorted(c.worker for c in sim.commands if isinstance(c, ev.RemoveWorker)) == [1, 2]
    assert list(fleet.workers) == [0] and sim.scheduler.snapshot().counts["elastic/workers_retired"] == 2


def test_scale_in_during_a_collective_push_waits_for_the_push():
    sim = Sim(job(rollout={"num_workers": 3, "max_workers": 3}), collective=True)
    sim.begin("train")
    sim.finish_rollouts()
    sim.step_done()
    (push,) = sim.pending(ev.Push)
    assert push.barrier and push.receivers == (0, 1, 2)
    stale_poll = sim.scheduler.fleet.call("poll", "the job's control actor")  # a late answer to an earlier poll
    sim.send(ev.ControlPolled(stale_poll, 1, False))  # scale to 1 while the push is out
    assert not any(isinstance(c, ev.RemoveWorker) for c in sim.commands)  # the receivers stay in the broadcast
    sim.push_done()
    assert sorted(c.worker for c in sim.commands if isinstance(c, ev.RemoveWorker)) == [1, 2]
    assert sim.scheduler.fleet.versions() == [1]
    sim.poll_done()
    assert {c.worker for c in sim.pending(ev.Generate)} == {0}


def test_a_receiver_that_dies_during_a_collective_push_is_replaced_and_the_push_repeated_without_it():
    sim = Sim(job(), collective=True)
    sim.begin("train")
    sim.finish_rollouts()
    sim.step_done()
    sim.take(ev.Push)
    commands = sim.send(ev.PushFailed(1, (1,), "rollout worker 1 died: killed"))
    again = [c for c in commands if isinstance(c, ev.Push)]
    assert [c.receivers for c in again] == [(0,)] and again[0].version == 1
    assert any(isinstance(c, ev.StartWorker) and c.worker == 1 for c in commands)
    sim.push_done()
    sim.poll_done()
    (start,) = sim.pending(ev.StartWorker)
    sim.started(start)
    assert sim.scheduler.fleet[1].state == "syncing"  # joins the next push
    failed_twice = Sim(job(), collective=True)
    failed_twice.begin("train")
    failed_twice.finish_rollouts()
    failed_twice.step_done()
    failed_twice.take(ev.Push)
    failed_twice.send(ev.PushFailed(1, (), "learner rank 0 raised: weight push timed out"))
    assert failed_twice.stop() == "weights version 1: learner rank 0 raised: weight push timed out"
    # a failure after which the group is built over another transport (auto's peer pull fell back): pushed again,
    # to the same receivers; the same failure without it stops the job (above)
    fell_back = Sim(job(), collective=True)
    fell_back.begin("train")
    fell_back.finish_rollouts()
    fell_back.step_done()
    (first,) = fell_back.take(ev.Push)
    commands = fell_back.send(ev.PushFailed(1, (), "rollout worker 0 raised: CUDA IPC refused", retry=True))
    again = [c for c in commands if isinstance(c, ev.Push)]
    assert [(c.version, c.receivers) for c in again] == [(1, first.receivers)]
    assert not any(isinstance(c, ev.Stop) for c in commands)


def test_a_worker_lost_during_evaluation_is_replaced_and_its_part_runs_again():
    rows = ROWS[:6]
    sim = Sim(job(), held_out=rows)
    commands = sim.begin("evaluate")
    parts = [c for c in commands if isinstance(c, ev.Evaluate)]
    assert [(c.worker, [r.prompt_id for r in c.rows]) for c in parts] == [
        (0, ["p0", "p2", "p4"]),
        (1, ["p1", "p3", "p5"]),
    ]
    again = sim.send(ev.CallFailed(sim.take(ev.Evaluate, worker=1)[0].call, "timed_out", "5 s"))
    rerun = [c for c in again if isinstance(c, ev.Evaluate)]
    assert [(c.worker, [r.prompt_id for r in c.rows]) for c in rerun] == [(0, ["p1", "p3", "p5"])]
    assert any(isinstance(c, ev.StartWorker) and c.worker == 1 for c in again)
    for part in sim.take(ev.Evaluate):
        sim.send(ev.EvalDone(part.call, 0, result(part.rows, correct=1)))
    last = sim.scheduler.snapshot().last_eval
    assert sim.scheduler.done and last.num_prompts == 6
    assert last.pass_at_1 == 2 / 6  # one correct prompt in each part of three
    assert "1 part(s) run again after their worker was lost" in sim.logs()[-1]


def test_an_evaluation_whose_only_worker_died_waits_for_the_replacement():
    sim = Sim(job(rollout={"num_workers": 1}), held_out=ROWS[:3])
    (part,) = [c for c in sim.begin("evaluate") if isinstance(c, ev.Evaluate)]
    sim.take(ev.Evaluate)
    sim.send(ev.CallFailed(part.call, "died", "killed"))
    assert not sim.pending(ev.Evaluate) and not sim.scheduler.done
    (start,) = sim.pending(ev.StartWorker)
    commands = sim.started(start)
    (rerun,) = [c for c in commands if isinstance(c, ev.Evaluate)]
    assert rerun.worker == 0 and rerun.rows == part.rows
    sim.send(ev.EvalDone(rerun.call, 0, result(rerun.rows)))
    assert sim.scheduler.done and sim.scheduler.snapshot().last_eval.num_prompts == 3


def test_an_in_order_checkpoint_waits_for_the_admitted_rollouts_and_saves_what_the_buffer_holds():
    sim = Sim(job(algorithm={"max_staleness": 1, "in_order": True}, run={"checkpoint_every": 1, "steps": 4}))
    sim.begin("train")  # in order: all 8 admitted prompts are sent at once
    for command in sim.pending(ev.Generate):
        if command.requests[0].uid < 4:
            sim.rollout_done(command)
    sim.step_done()
    sim.push_done()
    assert not any(isinstance(c, ev.Checkpoint) for c in sim.commands)  # prompts 4..7 are still out
    sim.finish_rollouts()
    (checkpoint,) = [c for c in sim.commands if isinstance(c, ev.Checkpoint)]
    assert checkpoint.step == 1 and checkpoint.state["next_uid"] == 8 and checkpoint.state["requeue"] == []
    assert [e.uid for e in checkpoint.episodes] == [4, 5, 6, 7]
    sim.send(ev.CheckpointDone("/tmp/sim-run/checkpoints/step1"))
    assert "checkpoint: /tmp/sim-run/checkpoints/step1" in sim.logs()


def test_a_checkpoint_out_of_order_saves_the_admitted_requests_to_sample_again_and_does_not_wait():
    sim = Sim(job(algorithm={"max_staleness": 1}, run={"checkpoint_every": 1, "steps": 4}))
    sim.begin("train")
    sim.finish_rollouts()
    sim.step_done()  # at η = 1 the next batch's prompts are out while the step trains
    sim.push_done()
    (checkpoint,) = [c for c in sim.commands if isinstance(c, ev.Checkpoint)]  # at once, prompts 4..7 still out
    assert checkpoint.step == 1 and checkpoint.state["next_uid"] == 8 and checkpoint.episodes == []
    assert [uid for uid, _ in checkpoint.state["requeue"]] == [4, 5, 6, 7]
    sim.send(ev.CheckpointDone("/tmp/sim-run/checkpoints/step1", background=True))
    assert "checkpoint: /tmp/sim-run/checkpoints/step1 (written in the background)" in sim.logs()
    sim.send(ev.CheckpointWritten("/tmp/sim-run/checkpoints/step1", 2.0))
    assert sim.logs()[-1] == "checkpoint: /tmp/sim-run/checkpoints/step1 complete (2.0 s after it started)"
    sim.poll_done()
    sim.finish_rollouts()  # the rollouts out during the save are trained on as usual
    assert sim.trained()[-1] == [4, 5, 6, 7]


def test_a_staged_collective_push_is_applied_by_a_load_on_each_receiver_before_its_next_request():
    sim = Sim(job(algorithm={"max_staleness": 1}), collective=True)
    sim.begin("train")
    sim.finish_rollouts()
    sim.step_done()
    (push,) = sim.take(ev.Push)
    after = sim.send(ev.PushDone(push.version, 0.01, at=1.0, staged=True))
    kinds = [(type(c).__name__, c.worker) for c in after if isinstance(c, (ev.LoadWeights, ev.Generate))]
    for worker in (0, 1):  # each receiver's load comes before any new request to it
        mine = [k for k, w in kinds if w == worker]
        assert mine and mine[0] == "LoadWeights" and mine.count("LoadWeights") == 1
    assert sim.scheduler.fleet.versions() == [0, 0]  # held only once the worker applied it
    for load in sim.take(ev.LoadWeights):
        sim.send(ev.WeightsLoaded(load.call, load.version))
    assert sim.scheduler.fleet.versions() == [1, 1]
    unstaged = Sim(job(), collective=True)  # a push the runtime did not stage (a rebuilt group): held at once
    unstaged.begin("train")
    unstaged.finish_rollouts()
    unstaged.step_done()
    unstaged.push_done()
    assert unstaged.scheduler.fleet.versions() == [1, 1] and not any(
        isinstance(c, ev.LoadWeights) for c in unstaged.commands)


def test_a_replacement_that_starts_while_a_push_is_out_loads_that_push():
    sim = Sim(job())
    sim.begin("train")
    sim.finish_rollouts()
    sim.step_done()  # version 1 is being pushed
    (load,) = sim.take(ev.LoadWeights, worker=1)
    sim.send(ev.CallFailed(load.call, "died", "killed"))  # worker 1 dies before it loaded version 1
    commands = sim.started(sim.pending(ev.StartWorker)[0])
    assert [(c.worker, c.version) for c in commands if isinstance(c, ev.LoadWeights)] == [(1, 1)]
    sim.push_done()
    assert sim.scheduler.fleet.versions() == [1, 1]


def test_the_protocol_runs_before_the_held_out_rows_and_a_lost_workers_units_run_again():
    sim = Sim(job(eval={"protocol": {}}), held_out=ROWS[:4])
    assert [type(c) for c in sim.begin("evaluate")] == [ev.StartProtocol]  # the held-out rows wait
    sim.take(ev.StartProtocol)
    commands = sim.send(ev.ProtocolStarted(3, "protocol eval: 2 of 8 completions already graded"))
    assert [(c.worker, c.unit) for c in commands if isinstance(c, ev.Complete)] == [(0, 0), (1, 1), (0, 2)]
    assert "protocol eval: 2 of 8 completions already graded" in sim.logs() and not sim.pending(ev.Evaluate)
    hung = sim.take(ev.Complete, worker=0)[0]
    again = sim.send(ev.CallFailed(hung.call, "timed_out", "5 s"))  # its process is killed: units 0 and 2 rerun
    assert [(c.worker, c.unit) for c in again if isinstance(c, ev.Complete)] == [(1, 0), (1, 2)]
    assert any(isinstance(c, ev.StartWorker) and c.worker == 0 for c in again)
    assert sim.scheduler.snapshot().counts["faults/rollout_worker_hangs"] == 1
    for unit in sim.take(ev.Complete):
        done = sim.send(ev.UnitDone(unit.call))
    assert [c.step for c in done if isinstance(c, ev.FinishProtocol)] == [0]
    sim.take(ev.FinishProtocol)
    after = sim.send(ev.ProtocolDone({"protocol/gsm8k@128": 0.5, "protocol/time_s": 3.0}, "step 0: protocol d1: ..."))
    records = [c for c in after if isinstance(c, ev.Record)]
    assert records[0].step == 0 and records[0].metrics["protocol/gsm8k@128"] == 0.5
    assert "step 0: protocol d1: ...; 2 unit(s) run again after their worker was lost" in sim.logs()
    assert [c.worker for c in after if isinstance(c, ev.Evaluate)] == [1]  # then the held-out rows, on the live one
    assert not sim.scheduler.done


def test_the_protocol_runs_every_eval_every_steps_and_a_step_with_nothing_left_ends_at_once():
    sim = Sim(job(eval={"protocol": {}, "every": 2}))
    sim.begin("train")
    for _ in range(2):
        sim.step()
    (start,) = sim.take(ev.StartProtocol)
    assert start.step == 2 and not sim.pending(ev.Generate)  # nothing admitted while it runs
    finish = sim.send(ev.ProtocolStarted(0))  # a resumed run graded every unit of this step already
    assert [c.step for c in finish if isinstance(c, ev.FinishProtocol)] == [2]
    sim.take(ev.FinishProtocol)
    resumed = sim.send(ev.ProtocolDone({"protocol/gsm8k@128": 0.25}, "step 2: protocol d1: gsm8k@128 25.0%"))
    assert any(isinstance(c, ev.Record) and c.step == 2 for c in resumed)
    kinds = [type(c) for c in resumed if isinstance(c, (ev.PollControl, ev.Generate))]
    assert kinds[0] is ev.PollControl and ev.Generate in kinds  # then the poll, and training goes on


def test_what_the_bound_admits_is_spread_over_the_workers_not_given_to_the_first():
    """η = 0, 4 groups a step, 4 prompts a request, 2 workers: each worker gets 2 (one worker with all
    4 would leave the other's GPU idle for the whole step); with room for every worker's full
    request the requests keep their size."""
    sim = Sim(job(algorithm={"groups_per_step": 4, "max_staleness": 0},
                  rollout={"num_workers": 2, "prompts_per_request": 4, "requests_per_worker": 1}))
    generates = [c for c in sim.begin("train") if isinstance(c, ev.Generate)]
    assert [(c.worker, [r.uid for r in c.requests]) for c in generates] == [(0, [0, 1]), (1, [2, 3])]

    sim = Sim(job(algorithm={"groups_per_step": 8, "max_staleness": 0},
                  rollout={"num_workers": 2, "prompts_per_request": 4, "requests_per_worker": 1}))
    generates = [c for c in sim.begin("train") if isinstance(c, ev.Generate)]
    assert [(c.worker, len(c.requests)) for c in generates] == [(0, 4), (1, 4)]

    sim = Sim(job(algorithm={"groups_per_step": 5, "max_staleness": 0},
                  rollout={"num_workers": 2, "prompts_per_request": 4, "requests_per_worker": 2}))
    generates = [c for c in sim.begin("train") if isinstance(c, ev.Generate)]
    assert sorted(len(c.requests) for c in generates) == [2, 3] and {c.worker for c in generates} == {0, 1}

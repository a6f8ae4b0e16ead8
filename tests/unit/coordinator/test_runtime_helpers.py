"""The runtime's small helpers that need no cluster: how an actor's error becomes one line of a
job's message, and how a loop that hears nothing tells a gone Ray head from a quiet one."""
from __future__ import annotations

import socket

from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig
from stabledrl.common.transport.plan import PushInputs
from stabledrl.coordinator.runtime.actors import first_line
from stabledrl.coordinator.runtime.pool import gcs_alive


def test_an_error_becomes_its_first_line_cut_between_words():
    error = RuntimeError("learner rank 0 of 2: the step at version 3 failed; a collective that ends after "
                         "learner.dist_timeout_s = 120 s means another rank stalled or died (RuntimeError: gloo)\n"
                         "Traceback (most recent call last):\n  File ...")
    assert first_line(error) == str(error).splitlines()[0]
    cut = first_line(error, limit=90)
    assert cut.endswith(" …") and len(cut) <= 92 and "=." not in cut and not cut[:-2].endswith("=")
    assert str(error).startswith(cut[:-2])
    assert first_line(RuntimeError("")) == "RuntimeError"


def test_the_gcs_probe_tells_a_listening_head_from_a_gone_one():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    address = f"127.0.0.1:{server.getsockname()[1]}"
    assert gcs_alive(address)
    server.close()
    assert not gcs_alive(address)


class _Actor:
    """Stands in for an actor handle: every ``x.method.remote(...)`` is recorded and returns a token."""

    def __init__(self, name: str, calls: list) -> None:
        self.name, self.calls = name, calls

    def __getattr__(self, method: str):
        actor = self

        class _Method:
            @staticmethod
            def remote(*args, **kwargs):
                actor.calls.append((actor.name, method, args))
                return (actor.name, method, len(actor.calls))

        return _Method


def test_a_collective_push_is_staged_unless_it_rebuilds_the_group_and_the_load_applies_that_version(monkeypatch):
    from stabledrl.common.transport import WeightHandle, WeightPushConfig
    from stabledrl.coordinator.runtime import weight_sync
    from stabledrl.coordinator.runtime.actors import Actors

    monkeypatch.setattr(weight_sync, "wait", lambda refs, timeout_s, what: [("127.0.0.1", 29500)])
    calls: list = []
    actors = Actors([_Actor("learner0", calls)], [_Actor("worker0", calls), _Actor("worker1", calls)])
    gloo = PushInputs(WeightPushConfig(backend="gloo"), LearnerConfig(), keep_order=True)
    sync = weight_sync.WeightSync(gloo, actors, 5.0)
    _, receives, staged = sync.push(1, [0, 1])  # the first push builds the group: received in order
    assert not staged and [c[1] for c in calls if c[0] != "learner0"][-2:] == ["receive_weights"] * 2
    calls.clear()
    _, receives, staged = sync.push(2, [0, 1])
    assert staged and [(c[0], c[1], c[2]) for c in calls if c[0] != "learner0"] == [
        ("worker0", "stage_weights", (WeightHandle(2, "gloo"), True)),
        ("worker1", "stage_weights", (WeightHandle(2, "gloo"), True))]
    sync.load(1, 2)
    assert calls[-1] == ("worker1", "receive_weights", (WeightHandle(2, "gloo"),))
    _, _, staged = sync.push(3, [0])  # a receiver left: the group is rebuilt
    assert not staged
    off = weight_sync.WeightSync(PushInputs(WeightPushConfig(backend="gloo", staging=False), LearnerConfig()),
                                 actors, 5.0)
    off.push(1, [0, 1])
    assert not off.push(2, [0, 1])[2]


def test_an_object_store_load_takes_the_handle_of_the_version_it_names_and_refuses_another():
    import pytest

    from stabledrl.common.transport import WeightPushConfig
    from stabledrl.coordinator.runtime import weight_sync
    from stabledrl.coordinator.runtime.actors import Actors

    calls: list = []
    actors = Actors([_Actor("learner0", calls)], [_Actor("worker0", calls)])
    sync = weight_sync.WeightSync(PushInputs(WeightPushConfig(backend="object_store"), LearnerConfig()), actors, 5.0)
    learner_calls, _, _ = sync.push(4, [])
    sync.load(0, 4)
    assert calls[-1] == ("worker0", "receive_weights", (learner_calls[0][1],))  # rank 0's handle of version 4
    with pytest.raises(ValueError, match="weights version 3 was not pushed"):
        sync.load(0, 3)


def test_an_auto_group_on_one_host_is_pulled_over_peer_and_one_that_spans_hosts_is_broadcast(monkeypatch, job_log):
    """The transport is chosen at each build of the group: peer while every learner rank and
    member runs on the learner's node, nccl once a member runs elsewhere (a worker added by
    scaling), peer again when it has left; every member's end and the load's handle follow it,
    and the job's log says which, once per change."""
    from stabledrl.common.transport import WeightHandle, WeightPushConfig
    from stabledrl.coordinator.runtime import weight_sync
    from stabledrl.coordinator.runtime.actors import Actors

    monkeypatch.setattr(weight_sync, "wait", lambda refs, timeout_s, what: [("127.0.0.1", 29500)])
    calls: list = []
    actors = Actors([_Actor("learner0", calls), _Actor("learner1", calls)],
                    [_Actor("worker0", calls), _Actor("worker1", calls)],
                    info={"learners": [{"node_id": "a"}] * 2, "rollouts": [{"node_id": "a"}] * 2})
    zero3, lines = LearnerConfig(num_ranks=2, deepspeed=DeepSpeedConfig(zero_stage=3)), job_log
    auto = PushInputs(WeightPushConfig(), zero3, gpus=True)  # the broadcast, pulled on one host (2 sources)
    sync = weight_sync.WeightSync(auto, actors, 5.0)

    def built(receivers, nodes):
        calls.clear()
        sync.push(1, receivers, nodes)
        setups = {c[0]: c[2][0].backend for c in calls if c[1] == "setup_weight_push"}
        assert setups.keys() == {"learner0", "learner1", *(f"worker{i}" for i in receivers)}
        assert len(set(setups.values())) == 1, setups  # every end of the group over one transport
        return setups["learner0"]

    assert built([0], {0: "a"}) == "peer"
    assert lines[-1] == "weights: the push group of rollout workers [0] is built over peer (auto: every learner rank " \
                        "and rollout worker runs on one host)"
    sync.load(0, 10)
    assert calls[-1] == ("worker0", "receive_weights", (WeightHandle(10, "peer"),))
    assert built([0, 1], {0: "a", 1: "b"}) == "nccl"  # worker 1 started on another host
    assert "built over nccl (auto: the learner ranks and rollout workers run on more than one host)" in lines[-1]
    sync.load(1, 11)
    assert calls[-1] == ("worker1", "receive_weights", (WeightHandle(11, "nccl"),))
    calls.clear()
    sync.push(12, [0, 1], {0: "a", 1: "a"})  # the same members: the group stands, whatever the nodes say now
    assert not [c for c in calls if c[1] == "setup_weight_push"]
    sync.failed()  # a failed push: rebuilt
    assert built([0, 1], {0: "a", 1: None}) == "nccl"  # a node not known is not the learner's
    assert built([0], {0: "a"}) == "peer"
    assert len(lines) == 3  # one line per change of transport (the rebuild after the failure: none)
    # a group built with the members of the job's start (the driver's setup, with the runtime's nodes)
    sync.members, calls[:] = None, []
    sync.setup({0: "a", 1: "a"})
    assert {c[2][0].backend for c in calls if c[1] == "setup_weight_push"} == {"peer"}
    # the learner ranks' nodes not reported (actors started elsewhere): never assumed to be the workers'
    blind = weight_sync.WeightSync(auto, Actors(actors.learners, [_Actor("worker0", calls)]), 5.0)
    calls.clear()
    blind.push(1, [0], {0: "a"})
    assert {c[2][0].backend for c in calls if c[1] == "setup_weight_push"} == {"nccl"}
    assert lines[3:] == ["weights: the push group of rollout workers [0] is built over nccl (auto: the learner ranks "
                         "and rollout workers run on more than one host)"]
    # nothing offered for one host (the user chose nccl, or auto would not pull): always the one given, unlogged
    plain = weight_sync.WeightSync(PushInputs(WeightPushConfig(backend="nccl"), zero3, gpus=True), actors, 5.0)
    calls.clear()
    plain.push(1, [0], {0: "a"})
    assert {c[2][0].backend for c in calls if c[1] == "setup_weight_push"} == {"nccl"} and len(lines) == 4


def test_a_failed_pull_of_a_group_auto_built_over_peer_falls_back_to_the_broadcast_once(monkeypatch, job_log):
    """CUDA IPC refused (containers apart, GPUs without peer access): the push fails, ``failed``
    says to push again, and every later group is broadcast, on one host too; a failure over the
    broadcast after that, or of a group the user's own choice built, is not retried this way."""
    from stabledrl.common.transport import WeightPushConfig
    from stabledrl.coordinator.runtime import weight_sync
    from stabledrl.coordinator.runtime.actors import Actors

    monkeypatch.setattr(weight_sync, "wait", lambda refs, timeout_s, what: [("127.0.0.1", 29500)])
    calls: list = []
    actors = Actors([_Actor("learner0", calls)], [_Actor("worker0", calls)],
                    info={"learners": [{"node_id": "a"}], "rollouts": [{"node_id": "a"}]})
    lines = job_log
    sync = weight_sync.WeightSync(PushInputs(WeightPushConfig(), LearnerConfig(), gpus=True), actors,
                                  5.0)  # ZeRO-2: rank 0 sends its parameters as they lie
    sync.push(1, [0], {0: "a"})
    assert sync.plan.backend == "peer"
    assert not sync.failed("rollout worker 0 died", died=True)  # a death: retried without it, still over peer
    calls.clear()
    sync.push(1, [0], {0: "a"})
    assert {c[2][0].backend for c in calls if c[1] == "setup_weight_push"} == {"peer"} and not lines[1:]
    assert sync.failed("rollout worker 0 raised: RuntimeError: weight push (peer): could not map ...")
    assert lines[-1] == ("weights: the push over peer failed (rollout worker 0 raised: RuntimeError: weight push "
                         "(peer): could not map ...); auto builds every push group over nccl from now on")
    calls.clear()
    sync.push(1, [0], {0: "a"})  # the push again: rebuilt over the broadcast, on one host as it is
    assert {c[2][0].backend for c in calls if c[1] == "setup_weight_push"} == {"nccl"}
    assert not sync.failed("learner rank 0 raised: timed out")  # over the broadcast: the job stops (the scheduler)
    chosen = weight_sync.WeightSync(PushInputs(WeightPushConfig(backend="peer"), LearnerConfig()), actors, 5.0)
    chosen.push(1, [0], {0: "a"})
    assert not chosen.failed("refused") and chosen.members is None  # named outright: rebuilt, not replaced

"""A receiver stages a broadcast push while its model is in use and swaps it in between requests
(common/transport/staging.py: StagedWeights): the model never changes before ``apply``, a
staged version lands whole, and in order (``keep_order``) a newer push waits for the older one to
be applied, while otherwise it replaces it. Gloo, sender and receiver as threads of this process."""
from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

from stabledrl.common.transport import WeightHandle, WeightPushConfig, setup_weight_push
from stabledrl.common.transport.staging import StagedWeights
from stabledrl.learner.group import reserve_port

torch.set_num_threads(1)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))


def versions(n: int) -> list[dict[str, torch.Tensor]]:
    names = [name for name, _ in model().named_parameters()]
    shapes = [p.shape for p in model().parameters()]
    return [{name: torch.full(shape, float(v)) for name, shape in zip(names, shapes)} for v in range(1, n + 1)]


def run(keep_order: bool):
    cfg = WeightPushConfig(backend="gloo", timeout_s=30, bucket_mb=200 / 2**20)  # 200 B: several buckets
    port, source = reserve_port(), versions(2)
    errors: list[BaseException] = []

    def sender() -> None:
        try:
            push = setup_weight_push(cfg, rank=0, world_size=2, master_addr="127.0.0.1", master_port=port)
            for v, weights in enumerate(source, start=1):
                push.send(iter(weights.items()), v)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threading.Thread(target=sender, daemon=True).start()
    receiver = model()
    initial = {n: p.detach().clone() for n, p in receiver.named_parameters()}
    push = setup_weight_push(cfg, rank=1, world_size=2, master_addr="127.0.0.1", master_port=port)
    staged = StagedWeights(receiver)
    done: list[int] = []

    def stage_both() -> None:
        try:
            for v in (1, 2):
                done.append(staged.receive(push, WeightHandle(v, "gloo"), keep_order=keep_order, timeout_s=30))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    stager = threading.Thread(target=stage_both, daemon=True)
    stager.start()
    return receiver, initial, source, staged, stager, done, errors


def params(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in module.named_parameters()}


def wait_for(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_in_order_a_staged_version_waits_for_its_apply_and_the_model_changes_only_there():
    receiver, initial, source, staged, stager, done, errors = run(keep_order=True)
    wait_for(lambda: done == [1])
    time.sleep(0.3)  # version 2 is on its way but must not be staged over the unapplied version 1
    assert done == [1] and not errors
    assert all(torch.equal(params(receiver)[n], initial[n]) for n in initial)  # nothing applied yet
    assert staged.apply() == 1
    assert all(torch.equal(params(receiver)[n], source[0][n]) for n in initial)
    stager.join(30)
    assert done == [1, 2] and not errors
    assert all(torch.equal(params(receiver)[n], source[0][n]) for n in initial)  # still version 1 until apply
    assert staged.apply() == 2 and staged.apply() is None
    assert all(torch.equal(params(receiver)[n], source[1][n]) for n in initial)


def test_without_order_a_newer_push_replaces_the_unapplied_one():
    receiver, initial, source, staged, stager, done, errors = run(keep_order=False)
    stager.join(30)
    assert done == [1, 2] and not errors
    assert all(torch.equal(params(receiver)[n], initial[n]) for n in initial)
    assert staged.apply() == 2  # version 1 was never applied: the model goes straight to 2
    assert all(torch.equal(params(receiver)[n], source[1][n]) for n in initial)
    assert staged.apply() is None


def test_a_partial_push_stages_and_applies_only_what_it_carries():
    """A LoRA learner pushes only the adapted matrices: only those are staged (and allocated) and
    applied; the other parameters keep the weights the worker loaded."""
    cfg = WeightPushConfig(backend="gloo", timeout_s=30, bucket_mb=200 / 2**20)
    port = reserve_port()
    receiver = model()
    initial = {n: p.detach().clone() for n, p in receiver.named_parameters()}
    pushed = {n: torch.full_like(t, 5.0) for n, t in initial.items() if n.endswith("weight")}
    threading.Thread(target=lambda: setup_weight_push(cfg, rank=0, world_size=2, master_addr="127.0.0.1",
                                                      master_port=port).send(iter(pushed.items()), 1),
                     daemon=True).start()
    push = setup_weight_push(cfg, rank=1, world_size=2, master_addr="127.0.0.1", master_port=port)
    staged = StagedWeights(receiver)
    assert staged.receive(push, WeightHandle(1, "gloo"), keep_order=True, timeout_s=30, partial=True) == 1
    assert set(staged.tensors) == set(pushed)
    assert staged.apply() == 1
    for n, p in params(receiver).items():
        assert torch.equal(p, pushed[n] if n in pushed else initial[n])


def push_with_one_end_late(late: str, delay_s: float = 0.4) -> tuple[float, float]:
    """(sender's, receiver's) ``waited_s`` of one gloo transfer whose ``late`` end joins ``delay_s``
    after the other is set up and about to transfer (a slow set-up under load cannot hide the delay)."""
    cfg = WeightPushConfig(backend="gloo", timeout_s=30, bucket_mb=200 / 2**20)
    port, weights = reserve_port(), versions(1)[0]
    ends: dict[str, object] = {}
    errors: list[BaseException] = []
    sending, receiving = threading.Event(), threading.Event()

    def sender() -> None:
        try:
            push = ends["sender"] = setup_weight_push(cfg, rank=0, world_size=2, master_addr="127.0.0.1",
                                                      master_port=port)
            if late == "sender":
                assert receiving.wait(30)
                time.sleep(delay_s)
            sending.set()
            push.send(iter(weights.items()), 1)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    receiver = ends["receiver"] = setup_weight_push(cfg, rank=1, world_size=2, master_addr="127.0.0.1",
                                                    master_port=port)
    if late == "receiver":
        assert sending.wait(30)
        time.sleep(delay_s)
    staged = StagedWeights(model())
    receiving.set()
    staged.receive(receiver, WeightHandle(1, "gloo"), keep_order=False, timeout_s=30)
    thread.join(30)
    assert not errors, errors
    return ends["sender"].waited_s, ends["receiver"].waited_s


def test_each_end_reports_how_long_it_waited_for_the_other_before_a_byte_moved():
    """What a job's clocks show as push_wait (learner) and push_stage_wait (worker): the time an
    end waited for the other to join, apart from the transfer."""
    sender_waited, receiver_waited = push_with_one_end_late("receiver")
    assert sender_waited >= 0.3 and receiver_waited < 0.3
    sender_waited, receiver_waited = push_with_one_end_late("sender")
    assert receiver_waited >= 0.3 and sender_waited < 0.3


def test_a_staged_receive_runs_with_a_short_switch_interval_and_puts_the_interval_back():
    """Each call of the receiving thread that gives Python's GIL up waits to take it back until the
    request thread gives it up or the switch interval forces it (common/gil.py): the receive runs
    with the interval at most SWITCH_S, and the interval found is back after it."""
    import sys

    from stabledrl.common.gil import SWITCH_S

    seen = []

    class Push:
        def receive(self, handle, loader):
            seen.append(sys.getswitchinterval())
            loader([(name, torch.full_like(p, 7.0)) for name, p in model().named_parameters()])

    before = sys.getswitchinterval()
    staged = StagedWeights(model())
    assert staged.receive(Push(), WeightHandle(3, "peer"), keep_order=False, timeout_s=5) == 3
    assert seen == [pytest.approx(min(before, SWITCH_S))] and sys.getswitchinterval() == pytest.approx(before)



def test_a_deferring_push_keeps_only_the_mirrors_it_wrote_and_apply_puts_the_parameters_together():
    """A push that defers (as the peer pull does) copies spans into the staged copy's mirrors and
    hands over each parameter's rows there; ``apply`` puts them together into the model. A later
    push that needs fewer spans leaves only its own mirrors held."""
    from stabledrl.common.transport.shards import Piece, Round

    net = model()
    names = [(n, tuple(p.shape)) for n, p in net.named_parameters()]

    class Push:
        def __init__(self, value: float, keys):
            self.value, self.keys = value, keys

        def receive(self, handle, loader):
            for key in self.keys:  # a span each; the first holds every parameter, whole (one source)
                span = loader.mirror(key, 4 * sum(torch.Size(s).numel() for _, s in names), torch.device("cpu"))
                span.view(torch.float32).fill_(self.value)
            offset = 0
            for name, shape in names:
                n = torch.Size(shape).numel()
                loader.defer([(self.keys[0], 4 * offset, 4 * n)], Round(torch.float32, n, (Piece(name, shape, 0),)), 1)
                offset += n

    staged = StagedWeights(net)
    before = [p.detach().clone() for p in net.parameters()]
    staged.receive(Push(3.0, ["a", "b"]), WeightHandle(1, "peer"), keep_order=False, timeout_s=5)
    assert set(staged.mirrors) == {"a", "b"} and not staged.tensors
    assert all(torch.equal(p.detach(), b) for p, b in zip(net.parameters(), before))  # staged, not applied
    assert staged.apply() == 1
    assert all(torch.equal(p.detach(), torch.full_like(p, 3.0)) for p in net.parameters())
    staged.receive(Push(5.0, ["a"]), WeightHandle(2, "peer"), keep_order=False, timeout_s=5)
    assert set(staged.mirrors) == {"a"}
    assert staged.apply() == 2
    assert all(torch.equal(p.detach(), torch.full_like(p, 5.0)) for p in net.parameters())

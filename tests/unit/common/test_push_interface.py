"""The transport interface (common/transport/base.py): every transport is built by
``setup_weight_push`` and has ``send_weights`` (a learner rank), ``receive`` (a rollout worker),
``close`` and the turn hooks (``begin_update``, ``check_turn``: acting only where the worker reads the
rank's parameters in place); ``send_weights`` reads the learner's weights the way the transport sends
them."""
from __future__ import annotations

import torch

from stabledrl.common.transport import WeightPushConfig, setup_weight_push
from stabledrl.common.transport.base import ParameterLoader, SendsWeights, WeightHandle
from stabledrl.common.transport.broadcast import BroadcastPush
from stabledrl.common.transport.ipc import IpcPush
from stabledrl.common.transport.object_store import ObjectStorePush
from stabledrl.common.transport.peer import PeerPush
from stabledrl.common.transport.views import ViewPush

WEIGHTS = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3)}


class Source:
    """A learner rank's weights as a transport reads them (LearnerEngine's three members)."""

    def __init__(self, holders: int = 1) -> None:
        self.partition_holders, self.read = holders, []

    def named_parameters_for_push(self, all_ranks: bool = False):
        self.read.append(("gathered", all_ranks))
        return iter(list(WEIGHTS.items()))

    def partitions_for_push(self, sources: int):
        self.read.append(("partitions", sources))
        return iter([(name, tuple(t.shape), t.flatten()) for name, t in WEIGHTS.items()])


def test_every_transport_fills_the_interface():
    hooks = ("send_weights", "receive", "close", "begin_update", "check_turn")
    for cls in (ObjectStorePush, BroadcastPush, PeerPush, IpcPush, ViewPush):
        assert all(callable(getattr(cls, name, None)) for name in hooks), cls
    # only the views act on a turn: a copying transport's worker holds its own weights whatever the rank does
    for cls in (ObjectStorePush, BroadcastPush, PeerPush, IpcPush):
        assert cls.begin_update is SendsWeights.begin_update and cls.check_turn is SendsWeights.check_turn, cls
    assert ViewPush.begin_update is not SendsWeights.begin_update and ViewPush.check_turn is not SendsWeights.check_turn
    copying = setup_weight_push(WeightPushConfig(backend="ipc", ipc="copy"))
    try:
        copying.begin_update()
        copying.check_turn(7, "after")  # any version: nothing is read in place
    finally:
        copying.close()


def test_a_gathered_push_reads_the_full_parameters_and_the_worker_loads_them():
    cfg = WeightPushConfig(backend="ipc", ipc="copy")
    sender, receiver, source = setup_weight_push(cfg), setup_weight_push(cfg), Source()
    try:
        handle = sender.send_weights(source, 4)
        assert source.read == [("gathered", True)] and handle.version == 4
        model = {name: torch.zeros_like(t) for name, t in WEIGHTS.items()}
        loader = ParameterLoader(model)
        assert receiver.receive(handle, loader) == 4
        loader.finish()
        assert all(torch.equal(model[name], t) for name, t in WEIGHTS.items())
    finally:
        receiver.close()
        sender.close()


def test_a_sharded_push_reads_this_ranks_partitions_and_a_view_push_every_holders():
    class Sharded(SendsWeights):
        sources = 3

        def send_shards(self, partitions, version):
            self.sent = [name for name, _, _ in partitions]
            return WeightHandle(version, "gloo")

    source, sharded = Source(), Sharded()
    assert sharded.send_weights(source, 2).version == 2 and source.read == [("partitions", 3)]
    assert sharded.sent == ["w", "b"]
    view, source = ViewPush(WeightPushConfig(backend="ipc", ipc="view")), Source(holders=2)
    view.send_views = lambda parts, version: WeightHandle(version, "ipc", [name for name, _, _ in parts])
    try:
        assert view.send_weights(source, 5).ref == ["w", "b"] and source.read == [("partitions", 2)]
    finally:
        view.close()

"""The sharded weight push (common/transport/shards.py): ZeRO-3's partition rule, the plan, and
S learner ranks broadcasting their partitions over gloo (ranks as threads of this process) to
receivers that put the full parameters together bit for bit: element counts not divisible by S,
ranks that hold only padding, several dtypes and rounds, partitions back to back in one flat
buffer (sent with no copy) or scattered (packed), into a ParameterLoader, a staging copy and a
plain function."""
from __future__ import annotations

import threading
import time
from typing import Callable

import pytest
import torch

from stabledrl.common.transport import ParameterLoader, WeightHandle, WeightPushConfig, setup_weight_push
from stabledrl.common.transport.shards import (assemble, decode_plan, encode_plan, partition_numel, plan_rounds,
                                     segment_view)
from stabledrl.common.transport.staging import StagedWeights
from stabledrl.learner.group import reserve_port

torch.set_num_threads(1)

SHAPES = [(7, 5), (301,), (3, 3), (1000,), (1,), (2, 40), (5,), (13, 3), (250,), (100, 2)]
DTYPES = [torch.float32, torch.float32, torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.float32,
          torch.float32, torch.float16, torch.float16, torch.float32]


def full_weights(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(f"layer{i}.w", (torch.randn(s, generator=g) * 10).to(d)) for i, (s, d) in enumerate(zip(SHAPES, DTYPES))]


def partitions(full: list[tuple[str, torch.Tensor]], rank: int, sources: int, flat: bool):
    """Rank ``rank``'s ZeRO-3 partitions (DeepSpeed's rule: ceil(n/S) elements from rank·ceil(n/S),
    the padding garbage), back to back in one buffer per dtype run (``flat``) or scattered."""
    out = []
    for name, t in full:
        n = t.numel()
        part = partition_numel(n, sources)
        piece = torch.full((part,), 1e4, dtype=t.dtype)  # padding: must never reach a receiver
        lo, hi = min(n, rank * part), min(n, (rank + 1) * part)
        piece[: hi - lo] = t.reshape(-1)[lo:hi]
        out.append((name, tuple(t.shape), piece))
    if flat:  # one flat buffer per run of one dtype, the partitions views into it (as DeepSpeed keeps them)
        views, i = [], 0
        while i < len(out):
            j = i
            while j < len(out) and out[j][2].dtype == out[i][2].dtype:
                j += 1
            buf, offset = torch.cat([p for _, _, p in out[i:j]]), 0
            for name, shape, p in out[i:j]:
                views.append((name, shape, buf[offset: offset + p.numel()]))
                offset += p.numel()
            i = j
        out = views
    return out


def test_partition_rule_and_plan():
    assert [partition_numel(n, 3) for n in (1, 2, 3, 4, 9, 10)] == [1, 1, 1, 2, 3, 4]
    params = [(n, tuple(t.shape), t.dtype) for n, t in full_weights(0)]
    rounds = plan_rounds(params, 2, bucket_bytes=1200)
    assert [p.name for r in rounds for p in r.pieces] == [n for n, _, _ in params]  # every one, in order
    for r in rounds:
        assert len({torch.empty((), dtype=r.dtype).element_size()} | {r.dtype}) == 2
        itemsize = torch.empty((), dtype=r.dtype).element_size()
        assert r.segment * itemsize * 2 <= 1200 or len(r.pieces) == 1
        ends = [p.offset + partition_numel(p.numel, 2) for p in r.pieces]
        assert [p.offset for p in r.pieces] == [0] + ends[:-1] and ends[-1] == r.segment
    assert len(rounds) >= 5
    sources, decoded = decode_plan(encode_plan(rounds, 2), "test")
    assert sources == 2 and decoded == rounds


def test_a_plan_whose_partition_overruns_its_segment_is_refused():
    bad = b'[2, [["float32", 4, [["w", [9], 0]]]]]'  # 9 elements in 2 partitions of 5 > 4
    with pytest.raises(ValueError, match="does not fit"):
        decode_plan(bad, "test")
    with pytest.raises(ValueError, match="malformed round"):
        decode_plan(b'[1, [["pickle", 4, []]]]', "test")


def test_segment_view_only_over_back_to_back_partitions():
    buf = torch.arange(10.0)
    assert torch.equal(segment_view([buf[0:3], buf[3:7]], torch.float32, torch.device("cpu")), buf[:7])
    assert segment_view([buf[0:3], buf[4:7]], torch.float32, torch.device("cpu")) is None  # a gap
    assert segment_view([buf[0:3], torch.zeros(2)], torch.float32, torch.device("cpu")) is None  # two storages
    assert segment_view([buf[0:3]], torch.float64, torch.device("cpu")) is None  # another dtype


@pytest.mark.parametrize("sources", [1, 2, 3])
def test_assemble_puts_every_parameter_together(sources):
    full = full_weights(1)
    params = [(n, tuple(t.shape), t.dtype) for n, t in full]
    expected = dict(full)
    for rnd in plan_rounds(params, sources, bucket_bytes=1 << 20):
        rows = torch.zeros(sources, rnd.segment, dtype=rnd.dtype)
        for r in range(sources):
            mine = {n: p for n, _, p in partitions(full, r, sources, flat=False)}
            for piece in rnd.pieces:
                part = partition_numel(piece.numel, sources)
                rows[r, piece.offset: piece.offset + part] = mine[piece.name]
        got: dict[str, torch.Tensor] = {}
        assemble(rows, rnd, sources, lambda items, got=got: got.update({n: t.clone() for n, t in items}))
        dest = {p.name: torch.zeros(p.shape, dtype=rnd.dtype) for p in rnd.pieces}
        loader = ParameterLoader(dest, partial=True)
        assemble(rows, rnd, sources, loader)
        for piece in rnd.pieces:
            assert torch.equal(got[piece.name], expected[piece.name]), piece.name
            assert torch.equal(dest[piece.name], expected[piece.name]), piece.name
        assert loader.loaded == {p.name for p in rnd.pieces}


def run_ends(cfg: WeightPushConfig, sources: int, receivers: int, send, loaders, versions=(1, 2), names=None):
    """``max(sources, 1)`` learner ranks (threads; ``sources`` 0: rank 0 sends gathered weights)
    push ``versions`` to ``receivers`` ends built here, each sender through ``send(push, rank,
    version)``; ``loaders(version, rank)`` gives each receiver's loader. Returns (the errors by
    rank, in the order they happened; each sender's times when its sends returned)."""
    port, first = reserve_port(), max(sources, 1)
    world = first + receivers
    errors: dict[int, BaseException] = {}
    sent: dict[int, list[float]] = {}

    ends = []  # closed once every thread is done, failed ones too: no store stays listening in this process

    def source(rank: int) -> None:
        try:
            push = setup_weight_push(cfg, rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port,
                                     sources=sources, peer_names=names)
            ends.append(push)
            for version in versions:
                send(push, rank, version)
                sent.setdefault(rank, []).append(time.perf_counter())
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors[rank] = e

    def receiver(rank: int) -> None:
        try:
            push = setup_weight_push(cfg, rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port,
                                     sources=sources)
            ends.append(push)
            for version in versions:
                loader = loaders(version, rank)
                assert push.receive(WeightHandle(version, cfg.backend), loader) == version
                getattr(loader, "finish", lambda: None)()
        except BaseException as e:  # noqa: BLE001
            errors[rank] = e

    threads = [threading.Thread(target=source, args=(r,)) for r in range(first)]
    threads += [threading.Thread(target=receiver, args=(first + i,)) for i in range(receivers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    for push in ends:
        push.close()
    return errors, sent


def run_sharded(sources: int, receivers: int, flat: bool, bucket_bytes: int, loaders, versions=(1, 2),
                dtype: str = "keep"):
    """``sources`` learner ranks (threads) push ``versions`` (other weights each time) over gloo to
    ``receivers`` ends built here; ``loaders(version)`` gives each receiver's loader. Returns
    whether each source packed its partitions (instead of sending them as they lie)."""
    cfg = WeightPushConfig(backend="gloo", timeout_s=60, bucket_mb=bucket_bytes / 2**20, dtype=dtype)
    packed: list[bool] = []

    def send(push, rank: int, version: int) -> None:
        push.send_shards(partitions(full_weights(version), rank, sources, flat), version)
        if version == versions[-1]:
            packed.append(any(b is not None for b in push._shards.packs))

    errors, _ = run_ends(cfg, sources, receivers, send, loaders, versions)
    if errors:
        raise next(iter(errors.values()))
    return packed


@pytest.mark.parametrize("sources,flat", [(1, True), (2, True), (2, False), (3, False)])
def test_gloo_sharded_push_is_bit_identical(sources, flat):
    models = {}  # receiver rank -> its parameters (a ParameterLoader's module), checked after each version
    got_fn: dict[int, dict[str, torch.Tensor]] = {}

    def loaders(version, rank):
        if rank == sources:  # the first receiver: into its parameters
            models.setdefault(rank, {n: torch.zeros_like(t) for n, t in full_weights(0)})
            return ParameterLoader(models[rank])
        got_fn[rank] = {}
        return lambda items: got_fn[rank].update({n: t.clone() for n, t in items})

    packed = run_sharded(sources, 2, flat, bucket_bytes=1500, loaders=loaders)
    assert packed == [not flat] * sources  # back to back: sent from the partitions, no pack buffer
    expected = dict(full_weights(2))
    for name, t in expected.items():
        assert torch.equal(models[sources][name], t), name
        assert torch.equal(got_fn[sources + 1][name], t), name


def test_each_source_sends_over_its_own_group_without_waiting_for_the_others():
    """Source 0 finishes its push while source 1 has not started: it takes no part in source 1's
    broadcasts (each source has a group of its own with the receivers), and the receivers, which
    belong to every source's group, still put the weights together bit for bit."""
    cfg = WeightPushConfig(backend="gloo", timeout_s=20, bucket_mb=1.0)
    full = [(n, t.float()) for n, t in full_weights(3)]  # one dtype, under a bucket: one round, posted at once
    port, sources, world = reserve_port(), 2, 4
    first_done = threading.Event()
    errors: list[BaseException] = []
    members: dict[int, list[int]] = {}
    got: dict[int, dict[str, torch.Tensor]] = {2: {}, 3: {}}

    def source(rank: int) -> None:
        try:
            push = setup_weight_push(cfg, rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port,
                                     sources=sources)
            if rank == 1:  # in its group (gloo forms a group when every member builds it), then waits
                push._connect()
                assert first_done.wait(30), "source 0 never finished on its own"
            push.send_shards(partitions(full, rank, sources, flat=True), 3)
            assert push.stats["rounds"] == 1
            members[rank] = sorted(push.groups)
            if rank == 0:
                first_done.set()
            push.close()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def receiver(rank: int) -> None:
        try:
            push = setup_weight_push(cfg, rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port,
                                     sources=sources)
            push.receive(WeightHandle(3, "gloo"), lambda items: got[rank].update({n: t.clone() for n, t in items}))
            members[rank] = sorted(push.groups)
            push.close()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=source, args=(r,)) for r in range(sources)]
    threads += [threading.Thread(target=receiver, args=(r,)) for r in range(sources, world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert members == {0: [0], 1: [1], 2: [0, 1], 3: [0, 1]}
    for rank in (2, 3):
        for name, t in full:
            assert torch.equal(got[rank][name], t), (rank, name)


def holder(weights: list[tuple[str, torch.Tensor]]) -> torch.nn.Module:
    """A module whose parameters are ``weights`` by name ("layerI.w"), zeroed."""
    module = torch.nn.Module()
    for name, t in weights:
        sub = torch.nn.Module()
        sub.w = torch.nn.Parameter(torch.zeros_like(t))
        module.add_module(name.split(".")[0], sub)
    return module


def sharded_into_staging(staged: StagedWeights, late: str = "", delay_s: float = 0.0, backend: str = "gloo",
                         timeout_s: float = 60.0, before_receive: Callable[[], None] = lambda: None):
    """Version 5 (``full_weights(5)``) from 2 sources (``backend``), threads of this process, staged into
    ``staged`` by the receiver (rank 2); ``late``: "sources" or "receiver" join ``delay_s`` after the
    other end is set up and about to transfer (so a slow set-up under load cannot hide the delay);
    ``before_receive`` runs once the receiver's end is set up, just before it receives.
    Returns (the version staged, the receiver's end, {source rank: its end's ``waited_s``})."""
    cfg = WeightPushConfig(backend=backend, timeout_s=timeout_s, bucket_mb=1500 / 2**20)
    port = reserve_port()
    errors: list[BaseException] = []
    waited: dict[int, float] = {}
    sources_set_up, receiving = [threading.Event(), threading.Event()], threading.Event()
    pushes = []  # closed once every end is done: rank 0 holds the store the others still poll

    def source(rank: int) -> None:
        try:
            push = setup_weight_push(cfg, rank=rank, world_size=3, master_addr="127.0.0.1", master_port=port,
                                     sources=2)
            pushes.append(push)
            sources_set_up[rank].set()
            if late == "sources":
                assert receiving.wait(60)
                time.sleep(delay_s)
            push.send_shards(partitions(full_weights(5), rank, 2, flat=True), 5)
            waited[rank] = push.waited_s
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=source, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    end = setup_weight_push(cfg, rank=2, world_size=3, master_addr="127.0.0.1", master_port=port, sources=2)
    if late == "receiver":
        assert all(e.wait(60) for e in sources_set_up)
        time.sleep(delay_s)
    before_receive()
    receiving.set()
    try:
        version = staged.receive(end, WeightHandle(5, backend), keep_order=False, timeout_s=60)
    finally:  # a failed receive: the sources give up waiting for it within their timeout
        for t in threads:
            t.join(timeout_s + 30)
        for push in [end, *sorted(pushes, key=lambda p: -p.rank)]:
            push.close()
    assert not errors, errors
    return version, end, waited


@pytest.mark.parametrize("backend,defer", [("gloo", True), ("peer", True), ("peer", False)])
def test_sharded_push_into_a_staging_copy(backend, defer):
    """gloo: the sources' broadcast; peer: the receiver pulls both sources' partitions, as a worker
    takes it: copied whole into the staged copy's mirrors, one span per source, and put together
    when applied (``defer``), or row by row into the staging tensors."""
    module = holder(full_weights(0))
    staged = StagedWeights(module, defer=defer)
    version, end, _ = sharded_into_staging(staged, backend=backend)
    assert version == 5
    assert all(torch.equal(p, torch.zeros_like(p)) for p in module.parameters())  # staged, not applied yet
    if backend == "peer":  # where the pull's time went: a worker's push_stage_<part> clocks
        assert set(end.parts_s) == {"map", "gil", "check", "issue", "copy", "cpu"} and min(end.parts_s.values()) >= 0
    mirrored = backend == "peer" and defer
    assert (len(staged.mirrors), len(staged.tensors)) == ((2, 0) if mirrored else (0, len(full_weights(5))))
    assert staged.apply() == 5
    params = dict(module.named_parameters())
    for name, t in full_weights(5):
        assert torch.equal(params[name].detach(), t), name


@pytest.mark.parametrize("defer", [True, False])
def test_the_pull_into_a_staging_copy_issues_a_copy_per_source_span_not_per_row(monkeypatch, defer):
    """Each copy the receiving thread issues gives Python's GIL up and takes it back, which beside a
    worker busy in Python costs a switch interval each: the deferred pull issues one copy per
    source (its span), the parameters are put together by ``apply`` on the applying thread."""
    module = holder(full_weights(0))
    staged = StagedWeights(module, defer=defer)
    receiving, copies = threading.get_ident(), {"receiving": 0, "applying": 0}
    real = torch.Tensor.copy_

    def counted(self, *args, **kwargs):
        if threading.get_ident() == receiving:
            copies["applying" if applying else "receiving"] += 1
        return real(self, *args, **kwargs)

    applying = False
    monkeypatch.setattr(torch.Tensor, "copy_", counted)
    sharded_into_staging(staged, backend="peer")
    applying = True
    staged.apply()
    rows = sum(-(-t.numel() // -(-t.numel() // 2)) for _, t in full_weights(5))  # the rows that hold any of it
    assert copies == ({"receiving": 2, "applying": rows} if defer else
                      {"receiving": rows, "applying": len(full_weights(5))})


@pytest.mark.parametrize("defer,when", [(True, "before"), (False, "before"), (True, "while")])
def test_a_pull_whose_header_holds_another_version_fails_and_stages_nothing(monkeypatch, defer, when):
    """The deferred pull reads each rank's header before and after its copies and checks both once
    they are done (only the staging copy's own memory was written); the row-by-row pull checks
    first. Either way a header that holds another version fails the receive, names both versions,
    and nothing is staged or applied."""
    from stabledrl.common.transport.peer import PeerPush

    real = PeerPush._read_versions
    slot_of = {"before": 0, "while": 1}[when]

    def stale(self, headers, slot):
        held = real(self, headers, slot)
        return [v + 1 for v in held] if slot == slot_of else held

    monkeypatch.setattr(PeerPush, "_read_versions", stale)
    module = holder(full_weights(0))
    staged = StagedWeights(module, defer=defer)
    with pytest.raises(Exception) as failed:
        sharded_into_staging(staged, backend="peer", timeout_s=2)
    assert "version 6" in str(failed.value) and "version 5" in str(failed.value), failed.value
    assert staged.apply() is None
    assert all(torch.equal(p, torch.zeros_like(p)) for p in module.parameters())


def test_the_pulls_gil_probe_shows_a_thread_that_holds_the_gil():
    """``push_stage_gil``: the pull gives Python's GIL up once before its first read; a thread of
    the worker inside one long C call (here ``sum`` over ~10^6 numbers, tens of ms) makes it wait
    for the call's end, which a wait for the GPU or for a lock would not. Without another thread it
    takes its 0.1 ms sleep. The holding thread starts once the ends are set up (it would slow
    their set-up down, not the probe)."""
    stop = threading.Event()

    def hold() -> None:
        while not stop.is_set():
            sum(range(2 * 10**6))  # one C call: the GIL is not given up inside it

    busy = threading.Thread(target=hold, daemon=True)

    def start_holding() -> None:  # at the first pull's receive
        if busy.ident is None:
            busy.start()

    waits = []
    try:
        # a probe: a busy machine may not run the holder while the pull sleeps; up to 5 pulls
        while len(waits) < 5 and max(waits, default=0.0) < 0.003:
            _, end, _ = sharded_into_staging(StagedWeights(holder(full_weights(0))), backend="peer",
                                             before_receive=start_holding)
            waits.append(end.parts_s["gil"])
    finally:
        stop.set()
        if busy.ident is not None:
            busy.join(30)
    assert max(waits) >= 0.003, waits


@pytest.mark.parametrize("defer", [True, False])
def test_the_deferred_pull_calls_into_torch_a_few_times_per_source_whatever_the_parameters(defer):
    """Every call into torch on the receiving thread (a view as much as a copy) gives Python's GIL
    up and waits to take it back beside a busy request thread: the deferred pull's calls there are
    a handful per source (its header, its span), however many parameters it carries; read row by
    row, they grow with the parameters."""
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.calls += getattr(func, "__name__", "") != "__get__"  # a property (a shape) keeps the GIL
            return func(*args, **(kwargs or {}))

    module = holder(full_weights(0))
    staged = StagedWeights(module, defer=defer)
    with Count():  # modes are per thread: the receive runs on this one, the sources on their own
        sharded_into_staging(staged, backend="peer")
    staged.apply()
    params = dict(module.named_parameters())
    assert all(torch.equal(params[name].detach(), t) for name, t in full_weights(5))
    if defer:
        assert Count.calls <= 16 * 2, Count.calls  # 2 sources
    else:
        assert Count.calls >= 2 * 2 * len(full_weights(5)), Count.calls


def test_the_group_the_driver_builds_puts_the_sending_ranks_first(monkeypatch):
    from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig
    from stabledrl.common.transport.plan import PushInputs
    from stabledrl.coordinator.runtime import weight_sync
    from stabledrl.coordinator.runtime.actors import Actors

    calls: list = []

    class Actor:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getattr__(self, method: str):
            name = self.name

            class Method:
                @staticmethod
                def remote(*args, **kwargs):
                    calls.append((name, method, kwargs))
                    return (name, method)

            return Method

    monkeypatch.setattr(weight_sync, "wait", lambda refs, timeout_s, what: [("127.0.0.1", 29500)])
    actors = Actors([Actor(f"learner{r}") for r in range(3)], [Actor("worker0"), Actor("worker1")])
    zero3 = LearnerConfig(num_ranks=3, deepspeed=DeepSpeedConfig(zero_stage=3))  # 3 sources (test_push_plan.py)
    sync = weight_sync.WeightSync(PushInputs(WeightPushConfig(backend="gloo"), zero3), actors, 5.0)
    sync.push(1, [0, 1])
    setups = {name: kw for name, method, kw in calls if method == "setup_weight_push"}
    assert {kw["world_size"] for kw in setups.values()} == {5} and {kw["sources"] for kw in setups.values()} == {3}
    assert setups["worker0"]["rank"] == 3 and setups["worker1"]["rank"] == 4  # after the 3 sources
    assert [name for name, method, _ in calls if method == "push_weights"] == ["learner0", "learner1", "learner2"]


@pytest.mark.parametrize("backend", ["gloo", "peer"])
def test_a_missing_receiver_fails_every_source_in_time_naming_it(backend):
    """gloo: the sources' broadcast; peer: the sources offering their buffers (common/transport/peer.py)."""
    import time

    cfg = WeightPushConfig(backend=backend, timeout_s=2)
    port = reserve_port()
    errors: dict[int, BaseException] = {}

    ends = []

    def source(rank: int) -> None:
        push = setup_weight_push(cfg, rank=rank, world_size=3, master_addr="127.0.0.1", master_port=port, sources=2,
                                 peer_names=["rollout worker 7"])
        ends.append(push)
        try:
            push.send_shards(partitions(full_weights(1), rank, 2, flat=True), 1)
        except BaseException as e:  # noqa: BLE001
            errors[rank] = e

    t0 = time.perf_counter()
    threads = [threading.Thread(target=source, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for push in ends:  # after both: no store stays listening in this process (test_store_binding)
        push.close()
    assert time.perf_counter() - t0 < 15
    assert set(errors) == {0, 1}
    assert all(isinstance(e, TimeoutError) and "never joined: rollout worker 7" in str(e) for e in errors.values())


def test_a_partition_that_does_not_match_the_plan_is_refused_before_anything_is_sent():
    from stabledrl.common.transport.shards import iter_segments

    full = full_weights(0)
    rounds = plan_rounds([(n, tuple(t.shape), t.dtype) for n, t in full], 2, 1 << 20)
    parts = partitions(full, 0, 2, flat=False)
    parts[3] = (parts[3][0], parts[3][1], parts[3][2][:-1])  # one element short
    with pytest.raises(ValueError, match="layer3.w"):
        list(iter_segments(rounds, iter(parts), 2))


def test_a_wire_dtype_other_than_the_partitions_is_packed_and_cast():
    got: dict[str, torch.Tensor] = {}

    def loaders(version, rank):
        got.clear()
        return lambda items: got.update({n: t.clone() for n, t in items})

    packed = run_sharded(2, 1, True, bucket_bytes=1500, loaders=loaders, dtype="bf16")
    assert packed == [True, True]  # fp32 partitions cannot go out as bf16 where they lie
    for name, t in full_weights(2):
        assert got[name].dtype == torch.bfloat16 and torch.equal(got[name], t.to(torch.bfloat16)), name


@pytest.mark.parametrize("late", ["receiver", "sources"])
def test_the_sharded_ends_report_their_wait_for_the_other_end(late):
    """``waited_s`` (the job's push_wait on a learner rank, push_stage_wait on a worker): the seconds an
    end of a sharded transfer waited for the other to join before a byte moved, apart from the transfer."""
    delay = 0.4
    _, end, waited = sharded_into_staging(StagedWeights(holder(full_weights(0))), late, delay)
    if late == "receiver":
        assert min(waited.values()) >= delay - 0.05 and end.waited_s < delay - 0.05
    else:
        assert end.waited_s >= delay - 0.05 and max(waited.values()) < delay - 0.05

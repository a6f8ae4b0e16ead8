"""The pull push (``weights.backend: peer``, common/transport/peer.py) on the CPU, each learner rank's
buffer a set of shared-memory blocks, the ranks and the receivers threads of this process: every
receiver loads bit for bit what the ranks sent, gathered or as ZeRO-3 partitions (padding that must
never arrive, several dtypes, element counts not divisible by the ranks), into its parameters or a
plain function; a sender returns only once every receiver has read its buffer,
and a receiver that never finishes fails the senders in time, named (one that never joins, and the
pull into a staging copy: tests/unit/common/test_sharded_push.py, with the broadcast's). (On GPUs the
same code maps the ranks' device memory through CUDA IPC: tests/gpu/test_ipc_push_gpu.py.)"""
from __future__ import annotations

import time

import pytest
import torch

from stabledrl.common.transport import ParameterLoader, WeightPushConfig
from stabledrl.common.transport.peer import PeerPush
from tests.unit.common.test_sharded_push import full_weights, partitions, run_ends

torch.set_num_threads(1)


def run_peer(sources: int, receivers: int, loaders, versions=(1, 2), timeout_s: float = 60, names=None):
    """``run_ends`` over the pull push: ``sources`` learner ranks (0: rank 0 sends the gathered
    weights; the sources' partitions alternately back to back and scattered) push ``versions`` to
    ``receivers`` ends. Returns (errors by rank, each sender's return times)."""
    def send(push, rank: int, version: int) -> None:
        assert isinstance(push, PeerPush)
        if sources:
            push.send_shards(partitions(full_weights(version), rank, sources, flat=rank % 2 == 0), version)
        else:
            push.send(iter(full_weights(version)), version)

    return run_ends(WeightPushConfig(backend="peer", timeout_s=timeout_s), sources, receivers, send, loaders,
                    versions, names)


@pytest.mark.parametrize("sources", [0, 1, 2, 3])
def test_every_receiver_loads_exactly_what_the_ranks_sent(sources):
    first = max(sources, 1)
    models: dict[int, dict[str, torch.Tensor]] = {}
    got: dict[int, dict[str, torch.Tensor]] = {}

    def loaders(version, rank):
        if rank == first:  # into its parameters
            models.setdefault(rank, {n: torch.zeros_like(t) for n, t in full_weights(0)})
            return ParameterLoader(models[rank])
        got[rank] = {}  # a plain function: tensors valid while it runs
        return lambda items: got[rank].update({n: t.clone() for n, t in items})

    errors, _ = run_peer(sources, 2, loaders)
    assert not errors, errors
    for name, t in full_weights(2):
        assert torch.equal(models[first][name], t), name
        assert torch.equal(got[first + 1][name], t), name


def test_a_sender_returns_only_once_every_receiver_has_read_its_buffer():
    """The buffer is written again at the next push: a sender must not return (and its learner
    step on) while a receiver still reads it. Receiver 3 takes 0.5 s over its reading."""
    finished: dict[int, float] = {}

    def loaders(version, rank):
        def slow(items):
            time.sleep(0.5 if rank == 3 else 0.0)
            for _ in items:
                pass
            finished[rank] = time.perf_counter()  # this receiver's last read of the buffer
        return slow

    errors, sent = run_peer(2, 2, loaders, versions=(1,))
    assert not errors, errors
    assert min(t for times in sent.values() for t in times) >= finished[3]


def test_a_receiver_whose_read_fails_fails_every_sender_at_once_naming_it_and_why():
    """Not at the senders' timeout: the receiver's failure is in the store, and each sender raises
    with its name and error once every receiver has answered."""
    def loaders(version, rank):
        def broken(items):
            raise OSError("the worker's device went away\nmore detail")
        return broken

    t0 = time.perf_counter()
    errors, _ = run_peer(2, 1, loaders, versions=(1,), timeout_s=60, names=["rollout worker 7"])
    assert time.perf_counter() - t0 < 30  # far from the 60 s timeout
    assert isinstance(errors.pop(2), OSError)
    assert set(errors) == {0, 1}
    assert all(isinstance(e, RuntimeError) and str(e).endswith(
        "rollout worker 7 failed: OSError: the worker's device went away") for e in errors.values()), errors


@pytest.mark.parametrize("sources", [0, 2])
def test_a_rank_that_cannot_offer_its_weights_fails_every_receiver_and_rank_at_once(sources):
    """A learner rank whose buffer cannot be filled or exported (its gather or its CUDA IPC export
    failed) writes its error where the receivers wait for its offer: each receiver fails naming the
    rank and why, and tells the other ranks, which fail naming the receiver; none waits out the 60 s
    timeout."""
    failing = max(sources, 1) - 1

    def send(push, rank: int, version: int) -> None:
        if rank == failing:
            def broken(*args):
                raise OSError("cannot export the partition\nmore detail")
            push.buffer.send = push.buffer.send_shards = broken
        if sources:
            push.send_shards(partitions(full_weights(version), rank, sources, flat=True), version)
        else:
            push.send(iter(full_weights(version)), version)

    t0 = time.perf_counter()
    errors, _ = run_ends(WeightPushConfig(backend="peer", timeout_s=60), sources, 2, send,
                         lambda version, rank: lambda items: None, (1,), ["rollout worker 7", "rollout worker 8"])
    assert time.perf_counter() - t0 < 30
    assert isinstance(errors.pop(failing), OSError)
    first = max(sources, 1)
    for rank in (first, first + 1):
        assert isinstance(errors[rank], RuntimeError) and str(errors.pop(rank)) == (
            f"weight push (peer) of version 1: learner rank {failing} failed: OSError: cannot export the partition")
    assert set(errors) == set(range(failing)), errors  # the other ranks: named receivers, their error quoted
    assert all("rollout worker 7 failed: RuntimeError: weight push (peer) of version 1: learner rank 1 failed: "
               "OSError" in str(e) for e in errors.values()), errors


def test_a_receiver_that_never_finishes_fails_every_sender_in_time_naming_it():
    def loaders(version, rank):
        slept = []

        def stuck(items):  # called once a round: the first call outlasts the senders' timeout
            if not slept:
                slept.append(time.sleep(6))
        return stuck

    t0 = time.perf_counter()
    errors, _ = run_peer(2, 1, loaders, versions=(1,), timeout_s=2, names=["rollout worker 7"])
    assert time.perf_counter() - t0 < 20
    assert set(errors) == {0, 1}
    assert all(isinstance(e, TimeoutError) and "still reading: rollout worker 7" in str(e) for e in errors.values())


def test_a_worker_that_cannot_map_the_ranks_gpu_memory_says_so_and_names_nccl():
    """CUDA IPC refused between the worker and its learner rank (processes in containers apart, GPUs
    without peer access): the pull fails naming the host and the way out, not with the bare CUDA error."""
    import socket

    from stabledrl.common.transport.ipc import IpcPush

    def refused(*args):
        raise RuntimeError("CUDA error: invalid device context\nCUDA kernel errors might be reported ...")

    end = IpcPush(WeightPushConfig(backend="peer"), pull=True)
    block = {"key": 7, "kind": "cuda", "host": socket.gethostname(), "rebuild": refused, "args": ()}
    with pytest.raises(RuntimeError, match=r"could not map its learner rank's GPU memory on .*\(CUDA IPC: CUDA "
                                           r"error: invalid device context\); set weights.backend to nccl") as err:
        end.map_blocks([block])
    assert "kernel errors" not in str(err.value) and isinstance(err.value.__cause__, RuntimeError)

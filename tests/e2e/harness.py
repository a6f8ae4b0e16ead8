"""What the reliability tests share: a tiny job config, workers that record what they did (and
die, stall or corrupt on cue), a driver run that keeps the learner's final weights, and the
receiving end of a weight push for the transport tests (``PushReceiver``).

Workers write JSON lines under a record directory, one file per process, so that what a killed
process did before it died is still there: the rollout side one line per request (worker index,
pid, uids), the learner side one line per finished step (rank, version, the sample ids it
trained on, a checksum of its weights after the step)."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import ray
import torch

from stabledrl.common.config.base import validate
from stabledrl.common.config.job import JobConfig
from stabledrl.coordinator.driver import Driver
from stabledrl.learner.async_checkpoint import marker_name
from stabledrl.learner.worker import LearnerWorker
from stabledrl.rollout.worker import RolloutWorker

REWARD = f"{Path(__file__).with_name('rewards.py')}:digit_fraction"


@contextmanager
def local_ray(module: str, num_cpus: int = 4) -> Iterator[None]:
    """Ray on this machine for one test module's fixture. The module and this harness are pickled
    by value: the actors' classes are defined there, and the workers cannot import them. Its worker
    processes are forked from one that has imported torch, transformers and DeepSpeed already
    (tests/helpers/warm_workers.py): each then costs a fraction of a fresh process's start. The raylet
    starts each through tests/helpers/ray_setup/setup_worker.py, which hands it to the warm process
    without importing Ray as Ray's own setup script does (~0.4 CPU-seconds a worker). The instance
    starts without the log monitor (the workers' logs are not sent to this process), the
    autoscaler's monitor (one node, nothing to scale) and the dashboard's API server (no test asks
    it), which ``ray.init`` cannot switch off: about 3 CPU-seconds an instance."""
    from unittest import mock

    import warm_workers
    from ray._private import node, parameter, ray_constants

    ray.cloudpickle.register_pickle_by_value(sys.modules[module])
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    params_init = parameter.RayParams.__init__

    def without_monitors(params, *args, **kwargs) -> None:
        params_init(params, *args, **kwargs)
        params.include_log_monitor, params.no_monitor = False, True

    def without_api_server(ray_node, **_) -> None:  # no dashboard head: nothing of a test asks it
        ray_node._webui_url = None

    setup_worker = str(Path(warm_workers.__file__).parent / "ray_setup" / "setup_worker.py")
    # an absolute path replaces Ray's workers/ folder
    with mock.patch.object(ray_constants, "SETUP_WORKER_FILENAME", setup_worker), \
            mock.patch.object(parameter.RayParams, "__init__", without_monitors), \
            mock.patch.object(node.Node, "start_api_server", without_api_server):
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 runtime_env=warm_workers.runtime_env())
    try:
        yield
    finally:
        ray.shutdown()


def wait_until(condition: Callable[[], bool], what: str, events: dict, timeout_s: float = 240) -> bool:
    """An operator thread's wait on a running job: poll ``condition`` every 50 ms. After
    ``timeout_s``, or once the job recorded a "failure" in ``events``, return False with
    events["error"] naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline or "failure" in events:
            events["error"] = f"timed out waiting for {what}"
            return False
        time.sleep(0.05)
    return True


def job_config(output_dir: Path, **sections: dict) -> JobConfig:
    """tiny LLaDA, arithmetic (8 generated rows: an epoch is 2 steps of 4 groups), 2 learner ranks
    (ZeRO-2), 2 rollout workers, η = 0; ``sections`` update the sections key by key."""
    data = {
        "model": {"preset": "tiny-llada"},
        "task": {"name": "arithmetic", "held_out": 0, "source": {"kind": "generated", "n": 8},
                 "reward": {"custom": REWARD, "isolation": "inline", "format_weight": 0.0}},
        "sampler": {"gen_length": 4, "block_length": 4, "steps": 4, "temperature": 1.0},
        "estimator": {"name": "block_random", "block_length": 4, "num_draws": 2},
        "loss": {"name": "stabledrl"},
        "algorithm": {"group_size": 4, "groups_per_step": 4, "inner_iterations": 1, "micro_batch_size": 8},
        "rollout": {"num_workers": 2, "prompts_per_request": 1, "request_timeout_s": 120},
        "learner": {"num_ranks": 2, "dist_timeout_s": 120, "optimizer": {"lr": 1e-2},
                    "deepspeed": {"zero_stage": 2}},
        "cluster": {"learner": {"num_cpus": 0.5}, "rollout": {"num_cpus": 0.5}, "start_timeout_s": 240},
        "weights": {"timeout_s": 120},
        "run": {"steps": 4, "seed": 7, "output_dir": str(output_dir), "progress": False, "tensorboard": False,
                "save_final_checkpoint": False, "export_final": False},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return validate(JobConfig, data)


def bad_rows_task(directory: Path) -> dict:
    """A task section over a JSONL file of 8 good arithmetic rows and 3 bad ones (a missing prompt,
    an empty prompt, a prompt over max_prompt_tokens), skipped and counted, with a reward function
    that raises or returns a non-number on some completions (isolated, counted, scored 0)."""
    good = [(12, 7), (3, 45), (60, 21), (8, 8), (33, 19), (71, 2), (5, 50), (14, 86)]
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in good]
    rows[3:3] = [{"answer": "4"}]
    rows[6:6] = [{"prompt": "", "answer": "3"}]
    rows.append({"prompt": "1+" * 20 + "1=", "answer": "21"})
    path = directory / "arithmetic.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"name": "arithmetic", "held_out": 0, "source": {"kind": "file", "path": str(path)},
            "on_bad_row": "skip", "max_prompt_tokens": 16,
            "reward": {"custom": f"{Path(__file__).with_name('flaky_rewards.py')}:flaky", "isolation": "inline",
                       "format_weight": 0.0, "on_failure": "zero"}}


def append(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_records(directory: Path, prefix: str) -> list[dict]:
    """Every record of the files ``prefix*.jsonl``, in the order they were written where records
    carry a time ``t`` (one file per process, and file names order pids as strings: "10023" comes
    before "9923"), else file by file."""
    out = []
    for path in sorted(Path(directory).glob(f"{prefix}*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(out, key=lambda r: r.get("t", 0.0))


def wait_for(path: Path, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


class PushLearner(LearnerWorker):
    """``LearnerWorker``'s weight-push methods over a LearnerEngine the test builds (not the
    worker's own set-up, which needs a whole job's configs); a test subclasses it into an actor."""

    def __init__(self, rank: int, world: int) -> None:  # not super().__init__
        from stabledrl.common.actor_time import ActorClock

        torch.set_num_threads(1)
        self.rank, self.world_size = rank, world
        self.push, self.push_sources, self.clock, self.share_gpu = None, 0, ActorClock(), False

    def start_engine(self, addr: str, port: int, policy: Any, cfg: Any) -> None:
        """Join the learner's gloo group at ``addr:port`` and build ``LearnerEngine(policy, cfg)``."""
        from stabledrl.learner.engine import LearnerEngine
        from stabledrl.learner.group import init_learner_group

        init_learner_group(addr, port, self.rank, self.world_size, backend="gloo", timeout_s=60)
        self.cfg = cfg
        self.engine = LearnerEngine(policy, cfg)


class PushReceiver:
    """A weight push's receiving end behind the engine a rollout worker uses, over a policy of
    other weights than the learner's (``make_policy()``); a test makes it a Ray actor."""

    def __init__(self, make_policy: Callable[[], Any]) -> None:
        from stabledrl.rollout.engine import TorchRolloutEngine

        torch.set_num_threads(1)
        self.engine = TorchRolloutEngine(make_policy(), policy_version=-1)
        self.push_end = None

    def setup_push(self, cfg, **kwargs) -> None:
        from stabledrl.common.transport import setup_weight_push

        if self.push_end is not None:
            self.push_end.close()
        self.push_end = setup_weight_push(cfg, **kwargs)

    def receive_weights(self, handle) -> int:
        return self.engine.update_weights(self.push_end, handle)

    def stage_and_apply(self, handle) -> int:
        self.engine.stage_weights(self.push_end, handle, keep_order=False, timeout_s=60)
        return self.engine.update_weights(self.push_end, handle)

    def weights(self) -> tuple[int, dict]:
        return self.engine.policy_version, {n: p.detach().clone() for n, p in self.engine.policy.named_parameters()}


def assert_received(received: tuple[int, dict], expected: dict, version: int) -> None:
    """A PushReceiver's (version, weights) hold ``version`` and exactly the ``expected`` tensors."""
    got_version, got = received  # (the harness is not assertion-rewritten: the messages say what differs)
    assert got_version == version, f"the receiver holds version {got_version}, not {version}"
    assert got.keys() == expected.keys(), f"names differ: {sorted(set(got) ^ set(expected))}"
    for name in expected:
        assert torch.equal(got[name], expected[name]), f"{name} differs after push {version}"


def placement() -> dict:
    """Where this actor runs: its placement group, the resources Ray gave it, whether it shares its
    GPU; and the objects it left out of Python's collections after its set-up (common/gil.py)."""
    import gc

    context = ray.get_runtime_context()
    return {"group": context.get_placement_group_id(), "resources": context.get_assigned_resources(),
            "frozen_objects": gc.get_freeze_count()}


class InspectedLearner(LearnerWorker):
    def weights(self):
        return self.engine.state_dict_for_push()  # rank 0's full weights (collective)

    def exported(self):
        return self.engine.state_dict_for_export()  # rank 0's plain policy, adapters merged (collective)

    def placement(self):
        return {**placement(), "share_gpu": self.share_gpu, "push_sources": self.push_sources}

    def segments(self):
        """Where each parameter lies: (shared-memory segment or None, element offset in it) on the CPU."""
        return parameter_segments(self.engine.module)


class InspectedRollout(RolloutWorker):
    """A rollout worker a test can ask for its weights version and a copy of its weights (on the CPU)."""

    def weights(self):
        return self.version(), {n: p.detach().cpu().clone() for n, p in self.engine.policy.named_parameters()}

    def placement(self):
        return {**placement(), "share_gpu": self.share_gpu}

    def segments(self):
        """(this worker's index, where each of its parameters lies: ``parameter_segments``)."""
        return self.index, parameter_segments(self.engine.policy)

    def memory(self):
        """Bytes this process's allocator holds on its GPU now, and its parameters' bytes (GPU tests)."""
        import torch

        params = sum(p.numel() * p.element_size() for p in self.engine.policy.parameters())
        return {"allocated": torch.cuda.memory_allocated(), "parameters": params}


def parameter_segments(module) -> dict[str, tuple]:
    """name -> (the shared-memory segment the parameter lies in, None in private memory; its offset)."""
    from stabledrl.common.transport.views import segment_name

    return {n: (segment_name(p), p.storage_offset()) for n, p in module.named_parameters()}


def recording_rollout(records: Path, *, nan_uids: frozenset = frozenset(), die_on_call: Optional[int] = None,
                      die_index: int = 1, always_die: bool = False, hold_index: Optional[int] = None) -> type:
    """A rollout worker that records each request; the samples of ``nan_uids`` get a NaN behaviour
    estimate. Worker ``die_index`` SIGKILLs its own process in the middle of its ``die_on_call``-th
    request (after sampling, before returning), once per test (a marker file), or on every request
    with ``always_die``. Its replacement announces itself; worker ``hold_index`` then waits for it
    before each request, so that the replacement gets work of its own."""
    died, replaced = records / "rollout_died", records / "rollout_replaced"

    class RecordingRollout(InspectedRollout):
        def __init__(self, index, *args, **kwargs):
            super().__init__(index, *args, **kwargs)
            self.calls = 0
            if index == die_index and died.exists():
                replaced.touch()

        def generate(self, requests):
            if hold_index == self.index and died.exists():
                wait_for(replaced)
            episodes = super().generate(requests)
            self.calls += 1
            append(records / f"rollout_{os.getpid()}.jsonl",
                   {"worker": self.index, "pid": os.getpid(), "uids": [r.uid for r in requests],
                    "node": ray.get_runtime_context().get_node_id(), "t": time.time()})
            dies = always_die or (self.calls == die_on_call and not died.exists())
            if self.index == die_index and dies:
                died.touch()
                os.kill(os.getpid(), signal.SIGKILL)
            for e in episodes.episodes:  # a RolloutResult
                if e.uid in nan_uids:
                    for s in e.group.samples:
                        s.behaviour_logp = float("nan")
            return episodes

    return RecordingRollout


def recording_learner(records: Path, *, die_rank: Optional[int] = None, die_version: Optional[int] = None,
                      gates: Optional[dict[int, Path]] = None) -> type:
    """A learner rank that records every finished step; rank ``die_rank`` SIGKILLs itself when
    asked to train at ``die_version`` (once per test), once the files of the last checkpoint begun
    before it are durable on every rank (a background save's child ends with its rank, and the step
    between may be shorter than the write: the death then always follows a complete save); a step
    at version v waits for the file ``gates[v]`` first (the test's way to hold the learner while it
    acts on the cluster)."""
    died = records / "learner_died"

    class RecordingLearner(InspectedLearner):
        saved: Optional[Path] = None

        def save_checkpoint(self, directory, client_state, tag, background=False):
            self.saved = Path(directory) / tag if background else None  # a marker per rank: background saves
            return super().save_checkpoint(directory, client_state, tag, background)

        def train(self, groups, version, group_offset):
            if gates and version in gates:
                wait_for(gates[version])
            if self.rank == die_rank and version == die_version and not died.exists():
                if self.saved is not None:
                    for rank in range(self.world_size):
                        wait_for(self.saved / marker_name(rank))
                died.touch()
                os.kill(os.getpid(), signal.SIGKILL)
            out = super().train(groups, version, group_offset)
            checksum = sum(float(p.detach().double().sum()) for p in self.engine.module.parameters())
            append(
                records / f"learner_rank{self.rank}.jsonl",
                {
                    "rank": self.rank,
                    "version": version,
                    "checksum": checksum,
                    "skipped": out.metrics["train/skipped"],
                    "sample_ids": [s.sample_id for g in groups for s in g.samples],
                },
            )
            return out

    return RecordingLearner


def run_driver(cfg: JobConfig, rollout_cls: type = InspectedRollout, learner_cls: type = InspectedLearner, *,
               export: bool = False, workers: bool = False) -> tuple[Driver, dict, list]:
    """Set up, train to the end, let the rollouts land; returns the driver, rank 0's weights and,
    with ``workers`` (an InspectedRollout class), every rollout worker's (version, weights)."""
    driver = Driver(cfg, rollout_cls=rollout_cls, learner_cls=learner_cls, record_batches=True)
    driver.setup()
    try:
        driver.train()
        driver.drain()
        if export:
            driver.export()
        weights = ray.get([a.weights.remote() for a in driver.actors.learners], timeout=120)[0]
        held = ray.get([w.weights.remote() for w in driver.active_rollouts()], timeout=120) if workers else []
    finally:
        driver.close()
    return driver, weights, held


DETERMINISTIC = ("train/loss", "train/grad_norm", "train/skipped", "rollout/reward_mean", "rollout/samples",
                 "rollout/policy_version_min", "staleness/mean", "staleness/max", "learner/staleness_max", "version",
                 "rollout/reward_calls/calls", "rollout/reward_calls/failed")

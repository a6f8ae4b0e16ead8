"""``weights.stage_pause``: while a worker stages a push with it, the worker's request makes no
forward (it waits at its next denoising step) and goes on, unchanged, once the staging copy is
complete; without it the request runs beside the push. A push that fails hands the turn back.
The samplers call the pause before every forward, for every family."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from common.config.sampler import SamplerConfig
from common.config.weights import WeightPushConfig
from common.models import build_tiny_policy
from common.transport import WeightHandle
from common.transport.staging import StagedWeights
from rollout.engine import TorchRolloutEngine
from rollout.sampling import generate

torch.set_num_threads(1)
PROMPTS = [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([10, 11])]
SEEDS = torch.tensor([101, 202])
SAMPLER = SamplerConfig(gen_length=16, block_length=8, steps=16, temperature=0.9, stop_at_eos=False)


class HeldPush:
    """A push whose receive starts, then waits to be released before it loads (or fails)."""

    def __init__(self, module: torch.nn.Module, fail: bool = False) -> None:
        self.weights = {n: torch.full_like(p, 0.5) for n, p in module.named_parameters()}
        self.started, self.release, self.finished, self.fail = threading.Event(), threading.Event(), False, fail

    def receive(self, handle: WeightHandle, loader) -> int:
        self.started.set()
        assert self.release.wait(30)
        if self.fail:
            raise TimeoutError("weight push: the sender went away")
        loader(list(self.weights.items()))
        self.finished = True
        return handle.version


def staging(pause: bool, fail: bool = False):
    module = torch.nn.Linear(4, 4)
    staged, push = StagedWeights(module), HeldPush(module, fail)
    errors: list[BaseException] = []

    def stage() -> None:
        try:
            staged.receive(push, WeightHandle(1, "gloo"), keep_order=False, timeout_s=30, pause=pause)
        except BaseException as e:  # noqa: BLE001  (checked by the test)
            errors.append(e)

    stager = threading.Thread(target=stage, daemon=True)
    stager.start()
    assert push.started.wait(30)
    return staged, push, stager, errors


def turn_taken(staged: StagedWeights) -> threading.Event:
    """Set once a request's step (another thread) gets past ``wait_turn``."""
    taken = threading.Event()
    threading.Thread(target=lambda: (staged.wait_turn(), taken.set()), daemon=True).start()
    return taken


def test_with_pause_a_request_step_waits_until_the_staging_copy_is_complete():
    staged, push, stager, errors = staging(pause=True)
    taken = turn_taken(staged)
    assert not taken.wait(0.3)  # the push is under way: the request holds
    push.release.set()
    assert taken.wait(30) and push.finished  # the copy was complete before the request went on
    stager.join(30)
    assert not errors and staged.version == 1


def test_without_pause_a_request_runs_beside_the_push():
    staged, push, stager, errors = staging(pause=False)
    assert turn_taken(staged).wait(5) and not push.finished
    push.release.set()
    stager.join(30)
    assert not errors


def test_a_failed_push_hands_the_turn_back():
    staged, push, stager, errors = staging(pause=True, fail=True)
    push.release.set()
    stager.join(30)
    assert len(errors) == 1 and "sender went away" in str(errors[0])
    assert turn_taken(staged).wait(5) and staged.version is None  # nothing staged, the request goes on


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_the_sampler_calls_the_pause_before_every_forward(family):
    policy = build_tiny_policy(family)
    calls: list[int] = []
    block = policy.block_size if family == "sdar" else 8  # a block-diffusion family samples its own block
    cfg = SAMPLER.model_copy(update={"block_length": block})
    out = generate(policy, PROMPTS, SEEDS, cfg, pause=lambda: calls.append(1))
    assert len(calls) == out.num_forwards > 1


def test_a_request_started_during_a_pausing_stage_runs_no_forward_until_it_ends_and_samples_the_same():
    policy = build_tiny_policy("llada")
    engine = TorchRolloutEngine(policy)
    expected = engine.generate(PROMPTS, SEEDS, SAMPLER)
    engine.staged = StagedWeights(policy)
    engine.staged.idle.clear()  # a push staged with stage_pause is being received
    forwards: list[int] = []
    hook = policy.model.register_forward_pre_hook(lambda *_: forwards.append(1))
    result: list = []
    request = threading.Thread(target=lambda: result.append(engine.generate(PROMPTS, SEEDS, SAMPLER)), daemon=True)
    try:
        request.start()
        time.sleep(0.3)
        assert request.is_alive() and not forwards
        engine.staged.idle.set()  # the staging copy is complete
        request.join(60)
    finally:
        hook.remove()
    assert result and torch.equal(result[0].completion_ids, expected.completion_ids)
    assert len(forwards) == expected.num_forwards


def test_the_options_are_off_by_default_and_typed():
    cfg = WeightPushConfig()
    assert cfg.stage_pause is False and cfg.high_priority is False
    with pytest.raises(ValueError, match="stage_pause"):
        WeightPushConfig(stage_pause="sometimes")

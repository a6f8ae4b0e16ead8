"""The static cached steps of ``SamplerConfig.cuda_graph`` (rollout/sampling/graphs.py), run on the
CPU without capture: the graph only replays what this path computes, so these tests pin the tokens.

Block diffusion: the static in-block step gives exactly the reference path's tokens (fp32), over
several blocks, with padded prompts, with EOS stops, with threshold decoding. Full attention: the
static dual-cache step gives the eager dual cache's tokens. The engine keeps its static steps across
requests (reused, dropped when the weights move, bounded), and a bad combination is refused.
"""
from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace

import pytest
import torch

from stabledrl.common.config.base import ConfigError, validate
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.transport.base import WeightHandle
from stabledrl.rollout.engine import TorchRolloutEngine
from stabledrl.rollout.sampling import StepGraphs, generate, graphs as graphs_module

torch.set_num_threads(1)
SAME = [torch.arange(5, 11), torch.arange(20, 26), torch.arange(40, 46)]
MIXED = [torch.arange(5, 10), torch.arange(20, 22), torch.arange(40, 48)]
SEEDS = torch.tensor([3, 4, 5])


@pytest.fixture(scope="module")
def sdar():
    return build_tiny_policy("sdar", block_size=4)


def cfg(**kw) -> SamplerConfig:
    return SamplerConfig(
        **{**dict(gen_length=32, block_length=None, steps=32, temperature=0.9, stop_at_eos=False), **kw}
    )


def assert_same(got, ref) -> None:
    assert torch.equal(got.completion_ids, ref.completion_ids)
    assert torch.equal(got.decode_step, ref.decode_step)
    assert torch.equal(got.completion_length, ref.completion_length)
    assert got.num_forwards == ref.num_forwards


@pytest.mark.parametrize("prompts", [SAME, MIXED], ids=["unpadded", "padded"])
@pytest.mark.parametrize("kw", [dict(), dict(steps=16), dict(temperature=0.0), dict(remasking="random"),
                                dict(threshold=0.02)], ids=["1/step", "2/step", "greedy", "random", "threshold"])
def test_static_in_block_step_gives_the_reference_tokens(sdar, prompts, kw):
    graphs = StepGraphs()
    got = generate(sdar, prompts, SEEDS, cfg(cuda_graph=True, **kw), graphs)
    ref = generate(sdar, prompts, SEEDS, cfg(cache="none", **kw))
    assert_same(got, ref)
    if "threshold" not in kw:  # 8 blocks: every forward but the prefill runs static (entering steps too)
        steps = 32 // kw.get("steps", 32)
        assert graphs.calls == 8 * (4 // steps) - 1 and graphs.built == 1
    else:
        assert 0 < graphs.calls < got.num_forwards
    assert graphs.captures == 0 and graphs.replays == 0  # nothing is captured on a CPU


def test_entering_and_in_block_steps_share_one_cache_and_feed_their_own_widths(sdar):
    widths = []
    hook = sdar.model.register_forward_pre_hook(
        lambda m, a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    graphs = StepGraphs()
    try:
        generate(sdar, SAME, SEEDS, cfg(cuda_graph=True, gen_length=12, steps=12), graphs)
    finally:
        hook.remove()
    # prefill [prompt | block 0], then per block: [previous | current] once, [current] three times
    assert widths == [32 + 4, 4, 4, 4, 8, 4, 4, 4, 8, 4, 4, 4]
    (step,) = graphs._steps.values()
    inside, enter = step, step.companion(8, 4)
    assert enter.cache is inside.cache and (inside.run.calls, enter.run.calls) == (9, 2)


def test_compiled_static_steps_give_the_reference_tokens(sdar):
    """``compile``: the static steps through torch.compile (inductor's C++ kernels on a CPU); in fp32
    on this model the fused kernels round like the eager ones, so the tokens are the reference's."""
    from torch._dynamo.utils import counters

    graphs, before = StepGraphs(), counters["stats"]["unique_graphs"]
    c = cfg(cuda_graph=True, compile=True, gen_length=16, steps=16)
    got = generate(sdar, MIXED, SEEDS, c, graphs)
    assert counters["stats"]["unique_graphs"] >= before + 2  # the entering and the in-block step, compiled
    assert_same(got, generate(sdar, MIXED, SEEDS, cfg(cache="none", gen_length=16, steps=16)))
    (step,) = graphs._steps.values()
    assert step.compile and step.companion(8, 4).compile and graphs.calls == 15


def test_compile_needs_a_compiled_path():
    """The compiled paths are the graphed steps and the exact full forward (test_sampler_compile.py);
    an eager cached step or block diffusion's eager cache is refused, naming the field."""
    with pytest.raises(Exception, match="compile"):
        SamplerConfig(gen_length=32, cache="dual", compile=True)
    with pytest.raises(Exception, match="compile"):
        SamplerConfig(gen_length=32, cache="prefix", compile=True)
    with pytest.raises(ConfigError, match="compile=True"):  # block diffusion: auto is its eager exact cache
        SamplerConfig(gen_length=32, block_length=None, compile=True).resolved_cache(block_diffusion=True)


def test_static_step_stops_at_eos_like_the_reference():
    policy = build_tiny_policy("sdar", block_size=4)
    free = generate(policy, MIXED, SEEDS, cfg())
    policy.eos_token_id = int(free.completion_ids[0, 9])  # a token the model really emits: rows stop early
    got = generate(policy, MIXED, SEEDS, cfg(cuda_graph=True, stop_at_eos=True))
    ref = generate(policy, MIXED, SEEDS, cfg(cache="none", stop_at_eos=True))
    assert_same(got, ref)
    assert int(got.completion_length.min()) < 32  # some row stopped at its EOS, the others went on


def test_prompt_width_is_bucketed_and_padding_changes_no_token(sdar):
    lengths = []
    hook = sdar.model.register_forward_pre_hook(
        lambda m, a, kw: lengths.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        got = generate(sdar, MIXED, SEEDS, cfg(cuda_graph=True))
    finally:
        hook.remove()
    assert lengths[0] == graphs_module.PROMPT_BUCKET + 4  # [prompt padded to 32 | block 0]
    assert_same(got, generate(sdar, MIXED, SEEDS, cfg()))


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("kw", [dict(steps=16), dict(steps=32, threshold=0.012), dict(steps=16, temperature=0.0)])
def test_static_dual_step_gives_the_eager_dual_cache_tokens(family, kw):
    policy = build_tiny_policy(family)
    c = SamplerConfig(**{**dict(gen_length=32, block_length=8, temperature=0.9, stop_at_eos=False, cache="dual"), **kw})
    graphs = StepGraphs()
    got = generate(policy, MIXED, SEEDS, c.model_copy(update={"cuda_graph": True}), graphs)
    assert_same(got, generate(policy, MIXED, SEEDS, c))
    assert graphs.calls == got.num_forwards - 4  # every forward but the 4 refreshes


def test_engine_keeps_its_static_step_across_requests_and_weight_loads():
    policy = build_tiny_policy("sdar", block_size=4, seed=0)
    engine = TorchRolloutEngine(policy)
    c = cfg(cuda_graph=True, steps=16)
    first = engine.generate(MIXED, SEEDS, c)
    others = [torch.arange(50, 53), torch.arange(60, 70), torch.arange(70, 74)]
    second = engine.generate(others, SEEDS + 7, c)  # same rows, prompts in the same bucket: same shape
    assert (engine.graphs.built, engine.graphs.reuses) == (1, 1)
    assert_same(second, generate(policy, others, SEEDS + 7, cfg(cache="none", steps=16)))

    other = build_tiny_policy("sdar", block_size=4, seed=1)
    push = SimpleNamespace(receive=lambda handle, load: load(list(other.named_parameters())) or handle.version)
    engine.update_weights(push, WeightHandle(2, "test"))  # copied in place: the static step stays valid
    after = engine.generate(MIXED, SEEDS, c)
    assert (engine.graphs.built, engine.graphs.reuses) == (1, 2)
    assert_same(after, generate(other, MIXED, SEEDS, cfg(cache="none", steps=16)))
    assert not torch.equal(after.completion_ids, first.completion_ids)

    with torch.no_grad():  # a parameter with a new storage: the step is rebuilt (a graph would read the old one)
        policy.model.lm_head.weight = torch.nn.Parameter(policy.model.lm_head.weight.clone())
    engine.generate(MIXED, SEEDS, c)
    assert engine.graphs.built == 2


def test_static_steps_are_bounded_least_recently_used_first(sdar):
    graphs = StepGraphs(capacity=2)
    c = cfg(cuda_graph=True, steps=16, gen_length=16)
    for rows in (1, 2, 3, 1):  # three shapes, then the first again
        generate(sdar, MIXED[:rows], SEEDS[:rows], c, graphs)
    assert graphs.built == 4 and len(graphs._steps) == 2  # shape 1 was dropped before it came back
    assert graphs.calls == 4 * (4 * 4 - 1)  # 4 blocks of 4 steps: all static but the prefill, dropped steps counted
    with pytest.raises(ValueError, match="at least one"):
        StepGraphs(capacity=0)


def test_without_cuda_one_log_line_says_nothing_is_captured(sdar, caplog, monkeypatch):
    monkeypatch.setattr(graphs_module, "_announced", set())
    with caplog.at_level(logging.WARNING, logger="stabledrl.rollout.sampling.graphs"):
        for _ in range(2):
            generate(sdar, SAME, SEEDS, cfg(cuda_graph=True, gen_length=8, steps=4))
    lines = [r.getMessage() for r in caplog.records if r.name == "stabledrl.rollout.sampling.graphs"]
    assert len(lines) == 1 and "without CUDA graph capture" in lines[0]


def test_graphs_need_a_cached_step_of_static_shape(sdar):
    with pytest.raises(ConfigError) as err:
        validate(SamplerConfig, {"cache": "none", "cuda_graph": True}, source="rollout.sampler")
    assert "cuda_graph:" in str(err.value) and "static shape" in str(err.value)
    llada = build_tiny_policy("llada")
    for cache in ("auto", "prefix"):  # full attention resolves to the exact path or the prefix cache
        with pytest.raises(ConfigError, match="cuda_graph=True with cache="):
            generate(
                llada, SAME, SEEDS, SamplerConfig(gen_length=16, block_length=8, steps=8, cache=cache, cuda_graph=True)
            )
    assert SamplerConfig(cuda_graph=True).resolved_cache(block_diffusion=True) == "prefix"
    assert SamplerConfig().cuda_graph is False  # eager stays the default


def test_a_capture_frees_dropped_graphs_first_and_never_collects_inside(monkeypatch):
    """A dropped static step (a reference cycle) holding a CUDA graph must not be freed by the cyclic
    collector in the middle of another capture (a graph reset invalidates a capturing stream): the
    collector runs before the capture and stays off during it."""
    import gc

    events: list = []

    class DroppedStep:  # garbage in a cycle, as a StaticStep the pool dropped
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            events.append("dropped graph freed")

    DroppedStep()
    stream = SimpleNamespace(wait_stream=lambda s: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: SimpleNamespace(replay=lambda: events.append("replay")))

    @contextlib.contextmanager
    def capture(graph, **kw):
        events.append("capture begins")
        yield
        events.append("capture ends")

    monkeypatch.setattr(torch.cuda, "graph", capture)

    def forward() -> torch.Tensor:
        events.append(("collector on", gc.isenabled()))
        return torch.zeros(1)

    graphs_module.CapturedStep(forward, capture=True)()
    begins = events.index("capture begins")
    assert events.index("dropped graph freed") < begins
    assert events[begins + 1:] == [("collector on", False), "capture ends", "replay"]
    assert gc.isenabled()

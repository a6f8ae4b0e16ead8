"""``SamplerConfig.compile`` on the exact full-attention sampler (rollout/sampling/compiled.py): the
decoder layers run compiled while a generation runs (inductor's C++ kernels on a CPU). In fp32 at
the tiny shape the fused kernels round like the eager ones, so the tokens are the eager path's."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models import build_tiny_policy
from stabledrl.rollout.sampling import generate
from stabledrl.rollout.sampling.compiled import compiled_layers, decoder_layers

torch.set_num_threads(1)
MIXED = [torch.arange(5, 10), torch.arange(20, 22), torch.arange(40, 48)]
SEEDS = torch.tensor([3, 4, 5])


@pytest.fixture(scope="module")
def llada():
    return build_tiny_policy("llada")


def cfg(**kw) -> SamplerConfig:
    return SamplerConfig(**{**dict(gen_length=16, block_length=8, steps=16, temperature=0.9, stop_at_eos=False,
                                   cache="none"), **kw})


def test_compiled_exact_forward_gives_the_eager_tokens_and_hands_the_layers_back(llada):
    calls = []
    hook = decoder_layers(llada)[0].register_forward_hook(lambda *_: calls.append(1))
    before = counters["stats"]["unique_graphs"]
    try:
        got = generate(llada, MIXED, SEEDS, cfg(compile=True))
    finally:
        hook.remove()
    assert counters["stats"]["unique_graphs"] > before  # the layers went through torch.compile
    assert len(calls) == got.num_forwards == 16  # through the module call: hooks still run
    ref = generate(llada, MIXED, SEEDS, cfg())
    assert torch.equal(got.completion_ids, ref.completion_ids)
    assert torch.equal(got.decode_step, ref.decode_step)
    # outside a generation the layers run their own forward again (scoring passes stay eager)
    assert all("forward" not in layer.__dict__ for layer in decoder_layers(llada))


def test_compiled_layers_are_built_once_and_reused(llada):
    with compiled_layers(llada) as n:
        first = [layer.forward for layer in decoder_layers(llada)]
    with compiled_layers(llada):
        again = [layer.forward for layer in decoder_layers(llada)]
    assert n == len(decoder_layers(llada)) == 2
    assert all(a is b for a, b in zip(first, again))


def test_a_new_canvas_width_still_runs_compiled(llada):
    """Requests of other prompt widths and row counts recompile (dynamic sizes), never fall back."""
    wide = [torch.arange(5, 25), torch.arange(30, 33)]
    got = generate(llada, wide, SEEDS[:2], cfg(compile=True))
    ref = generate(llada, wide, SEEDS[:2], cfg())
    assert torch.equal(got.completion_ids, ref.completion_ids)


def test_a_graphed_dual_cache_refreshes_through_the_compiled_layers(llada, monkeypatch):
    """With ``cuda_graph`` and ``compile`` the dual cache's refresh at each block start (a full
    forward, never graphed) runs the compiled decoder layers as the exact path does; without
    ``compile`` it stays eager. The tokens are the eager dual cache's."""
    import contextlib

    import stabledrl.rollout.sampling.full_attention as full_attention

    entered, real = [], full_attention.compiled_layers

    @contextlib.contextmanager
    def spy(policy):
        with real(policy) as n:
            entered.append(n)
            yield n

    monkeypatch.setattr(full_attention, "compiled_layers", spy)
    dual = cfg(cache="dual", threshold=0.012)
    got = generate(llada, MIXED, SEEDS, dual.model_copy(update={"cuda_graph": True, "compile": True}))
    assert entered == [2, 2]  # one refresh a block (2 blocks), each over the 2 compiled layers
    ref = generate(llada, MIXED, SEEDS, dual)
    assert torch.equal(got.completion_ids, ref.completion_ids) and torch.equal(got.decode_step, ref.decode_step)
    generate(llada, MIXED, SEEDS, dual.model_copy(update={"cuda_graph": True}))
    assert entered == [2, 2]  # graphed without compile: the refreshes eager


def test_compile_is_refused_where_no_compiled_path_exists():
    with pytest.raises(Exception, match="compile"):
        SamplerConfig(gen_length=32, cache="dual", compile=True)
    with pytest.raises(Exception, match="no compile"):
        SamplerConfig(gen_length=32, steps=32, temperature=0.0, compat="d1", compile=True)
    sdar = build_tiny_policy("sdar", block_size=4)
    with pytest.raises(Exception, match="compile=True"):
        generate(sdar, MIXED, SEEDS, SamplerConfig(gen_length=16, block_length=None, steps=16, compile=True))


@pytest.mark.parametrize("noise", ["float64", "float32", "bfloat16", "float32_then_bfloat16"])
def test_fused_choice_picks_the_eager_tokens(noise):
    """The compiled token choice (``choose_tokens(fused=True)``) does the eager arithmetic in one pass:
    on bf16 logits (the sampler's) the same draws pick the same tokens at the same confidence,
    rows that do not draw included (their generators stay untouched)."""
    from stabledrl.common import compiling
    from stabledrl.rollout.sampling import decode

    logits = (torch.randn(3, 8, 3000, generator=torch.Generator().manual_seed(1)) * 4).bfloat16()
    out = []
    for fused in (False, True):
        gens = [torch.Generator().manual_seed(10 + i) for i in range(3)]
        x0, conf = decode.choose_tokens(logits.clone(), 0.9, gens, mask_token_id=7, noise_dtype=noise,
                                        rows=[0, 2], fused=fused)
        out.append((x0, conf, [g.get_state() for g in gens]))
    (x0, conf, states), (fx0, fconf, fstates) = out
    form = "product" if noise in decode._PRODUCT_FORMS else "gumbel"
    assert any(fn is decode._FUSED_FORMS[form] for fn, _ in compiling._COMPILED)  # it went through torch.compile
    assert torch.equal(x0[[0, 2]], fx0[[0, 2]])
    assert (fx0 != 7).all()  # never the mask token
    torch.testing.assert_close(fconf[[0, 2]], conf[[0, 2]], rtol=1e-5, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(states, fstates))


def test_a_compiled_cache_write_goes_into_the_buffer_in_place():
    """The graphed steps run the cache's write inside torch.compile (cuda_graph + compile). Written with
    scatter_, inductor computed each layer's whole [B, H, T + 1, D] buffer anew and copied it back,
    every layer and step; the write must land in the buffer itself, with the same values."""
    from torch._inductor.utils import run_and_get_code

    from stabledrl.rollout.sampling.cache import SlotKVCache

    cache = SlotKVCache(num_slots=12)
    g = torch.Generator().manual_seed(0)
    first = torch.randn(2, 3, 12, 8, generator=g)  # the prompt's 12 slots [B, H, T, D]
    cache.set_slots(torch.arange(12).expand(2, 12), 12)
    cache.update(first, first + 1, 0)
    fresh = torch.randn(2, 3, 4, 8, generator=g)  # 4 new entries a row, at different slots
    slots = torch.tensor([[4, 5, 6, 7], [8, 9, 10, 12]])  # row 1's last one to the scratch slot

    def step(k, v):
        cache.set_slots(slots, 12)
        keys, values = cache.update(k, v, 0)
        return keys.sum() + values.sum()

    buffer = cache.keys[0]
    with torch.inference_mode():
        _, code = run_and_get_code(torch.compile(step), fresh, fresh * 2)
    source = "\n".join(code)
    assert "copy_" not in source.replace("_to_copy", "")  # no copy of the buffer back into itself
    assert cache.keys[0] is buffer
    keys, values = first.clone(), first + 1  # what the prompt's write left, then each written slot
    for row in range(2):
        for j, slot in enumerate(slots[row].tolist()):
            if slot < 12:  # the scratch slot is never read
                keys[row, :, slot], values[row, :, slot] = fresh[row, :, j], 2 * fresh[row, :, j]
    assert torch.equal(cache.keys[0][:, :, :12], keys)
    assert torch.equal(cache.values[0][:, :, :12], values)


def test_a_stream_of_prompt_widths_compiles_the_graphed_step_twice(llada):
    """The graphed, compiled dual-cache step of each new prompt width is a new static step (widths
    rounded up to 32): the first compiles with static sizes, the second with dynamic ones, and every
    width after that reuses them: nothing new is compiled (before, one compilation a width)."""
    from stabledrl.rollout.sampling import StepGraphs

    graphed = cfg(cache="dual", threshold=0.012, cuda_graph=True, compile=True)
    graphs = StepGraphs(capacity=1)  # every new width a new static step, the one before dropped
    new = []
    for width in (5, 40, 70, 100, 130):
        prompts = [torch.arange(width) % 40 + 4, torch.arange(4, 6)]
        before = counters["stats"]["unique_graphs"]
        got = generate(llada, prompts, SEEDS[:2], graphed, graphs)
        new.append(counters["stats"]["unique_graphs"] - before)
        ref = generate(llada, prompts, SEEDS[:2], cfg(cache="dual", threshold=0.012))
        assert torch.equal(got.completion_ids, ref.completion_ids), width
    assert graphs.built == 5
    assert new[0] > 0 and new[2:] == [0, 0, 0], new


def test_a_compiled_refresh_compiles_once_for_all_its_layers():
    """The graphed dual cache's refresh runs every decoder layer through one compilation: the cache
    writes outside the graphs and the layer's index an input, so that the layers' count does not
    multiply the compilations (at LLaDA-8B's 32 it reached torch's recompile limit over two prompt
    widths, and the refreshes after it ran eager)."""
    import torch._dynamo

    from stabledrl.rollout.sampling import StepGraphs

    graphed = cfg(cache="dual", threshold=0.012, cuda_graph=True, compile=True)
    compilations = {}
    for layers in (2, 5):
        torch._dynamo.reset()  # nothing compiled for the other depth is reused
        policy, graphs = build_tiny_policy("llada", num_hidden_layers=layers), StepGraphs(capacity=2)
        before = counters["stats"]["unique_graphs"]
        for width in (16, 40, 70):
            prompts = [torch.arange(width) % 40 + 4, torch.arange(4, 6)]
            got = generate(policy, prompts, SEEDS[:2], graphed, graphs)
            ref = generate(policy, prompts, SEEDS[:2], cfg(cache="dual", threshold=0.012))
            assert torch.equal(got.completion_ids, ref.completion_ids), (layers, width)
        compilations[layers] = counters["stats"]["unique_graphs"] - before
    assert compilations[5] == compilations[2] > 0, compilations

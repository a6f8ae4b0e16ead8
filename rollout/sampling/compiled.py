"""``SamplerConfig.compile``: the sampler's forwards through ``torch.compile``.

Between the matrix products of a decoder layer sit a dozen elementwise passes over the whole
activation: RMSNorm's fp32 cast, square, mean, rsqrt and scale (twice a layer), rotary's halves,
SiLU and the gate product, residual adds. At a full forward over a canvas (the exact sampler:
32 rows of ~450 tokens at LLaDA-8B's width) each pass moves ~100-300 MB, so together they cost
about a quarter of the forward. Compiled, they fuse into a few kernels per layer. Measured on an
H100 at LLaDA-8B, 32 rows x 384 tokens: 371 ms -> 280 ms a forward; with the token choice fused as
well, the exact sampler's step goes from 62% to 83% of the card's measured matmul rate
(BENCHMARKS.md, "Sampler speed").

Two forms, one flag:

- the graphed steps (``cuda_graph``): each static step's forward is compiled before its capture
  (``compiled``; graphs.py), static sizes for the first shape, dynamic ones from the second on, so
  that a stream of prompt widths compiles twice in all;
- the exact full forward (full attention, ``cache`` none, and the refresh at each block start of a
  graphed dual cache): every decoder layer is compiled on its own ("regional" compilation,
  ``compiled_layers``). The layers share their code, so one
  compilation serves them all; a canvas of another width or row count recompiles once with
  dynamic sizes (seconds) and is then reused. The compiled forwards replace the layers' own only
  while a generation (or a refresh) runs, so scoring passes on the same policy stay eager.

Compiled kernels round differently from eager ones, so tokens match the eager path's in
distribution, not bit for bit (equal in fp32 at the tiny shape: tests/unit/rollout/test_sampler_compile.py).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Callable, Iterator

import torch

from stabledrl.common.compiling import raise_recompile_limit

_ATTR = "_sampler_compiled_forward"  # where a decoder layer keeps its compiled forward
log = logging.getLogger(__name__)


def compiled(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``fn`` (a static step's forward) through ``torch.compile``, compiled at its first call (the
    capture's warm-up). The first shape compiles with static sizes; the static steps share their
    code, so the first step of another shape (a new prompt width, another row count) recompiles once
    with dynamic sizes, and every later shape reuses that compilation: a stream of prompt widths
    costs two compilations, not one a width (at 8B over a minute each)."""
    raise_recompile_limit()
    return torch.compile(fn)


def decoder_layers(policy: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers of a full-attention policy's transformers model."""
    decoder = policy.model.get_decoder() if hasattr(policy.model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise ValueError(f"sampler.compile: {type(policy.model).__name__} has no decoder layers to compile")
    return layers


def forget_compiled(policy: torch.nn.Module) -> None:
    """Drop the compiled forwards ``compiled_layers`` kept on the layers of ``policy`` (its modules
    changed: the next generation compiles them again)."""
    for module in policy.modules():
        module.__dict__.pop(_ATTR, None)


@contextlib.contextmanager
def compiled_layers(policy: torch.nn.Module) -> Iterator[int]:
    """Inside: every decoder layer of ``policy`` runs its compiled forward (built at the first use and
    kept on the layer); yields the number of layers. On exit the layers' own forwards are back.

    One compilation serves every layer only if no graph depends on which layer it is. A layer's
    index (``layer_idx``, an int attribute of its attention) is a constant to torch.compile, which
    guards every graph that reads it on its value: a layer that writes a KV cache (the dual cache's
    refresh) would compile once per layer and shape, 64 compilations at LLaDA-8B over two canvas
    widths, the whole recompile limit (common/compiling.py), after which the rest run eager (seen
    in StableDRL's job at 24 layers: generation at 15% of the matmul rate). Inside, module ints
    are inputs of the graphs instead (``allow_unspec_int_on_nn_module``), and a caller writing a
    cache keeps the cache's update out of the graphs (``SlotKVCache.outside_graphs``)."""
    import torch._dynamo

    raise_recompile_limit()
    layers = list(decoder_layers(policy))
    if any(_ATTR not in layer.__dict__ for layer in layers):
        log.info("sampler.compile: %d decoder layers through torch.compile; the first forward compiles them "
                 "(seconds), a new canvas width recompiles once", len(layers))
    for layer in layers:
        if _ATTR not in layer.__dict__:
            # the class's forward bound to this layer: compiling it does not see the override below
            layer.__dict__[_ATTR] = torch.compile(type(layer).forward.__get__(layer))
        layer.forward = layer.__dict__[_ATTR]
    try:
        with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True):
            yield len(layers)
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)

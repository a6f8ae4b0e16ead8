"""Cached steps with static shapes, replayed as CUDA graphs (``SamplerConfig.cuda_graph``).

Why. At SDAR-8B shape, batch 128, block 4, an eager cached step takes ~54 ms of wall time for
~35 ms of GPU work: a Qwen3 forward of 36 layers issues ~7,800 aten ops and ~2,300 kernels, each
paying Python, dispatch and a launch (the profile 4c of tests/benchmarks/results/components-quick_h200x2.md).
A CUDA graph replays the whole forward's kernels with one launch (4d there: 1.57x, 3,744 tokens/s).

What is static. A graph replays fixed kernels on fixed addresses, so the replayed step keeps one
shape for the whole generation and reads its inputs from buffers it owns:

    block diffusion, steps of a lockstep batch (every working row in the same block), two shapes
    over one cache: the in-block step [current block] and the entering step [previous | current]:
      ids, positions, cache slots   [B, bs] / [B, 2 bs]        copied in before every replay
      keys and values               all T slots                the SlotKVCache buffers themselves
      mask                          [B, 1, bs or 2 bs, T]      block-causal: hides the slots of later
                                                               blocks; copied in once per block
    full attention, dual-cache step (Fast-dLLM):
      ids, positions, cache slots   [B, (1 +) Lb] copied in before every replay
      keys and values               all T slots
      mask                          [B, 1, Lq, T] the padding mask; copied in once per generation

The prompt prefill, the dual cache's refresh and the steps of rows that are not in lockstep
(threshold decoding) stay eager and write into the same cache buffers; the decode step (token
choice with per-row generators) stays eager. (The entering step is a quarter of the forwards at
one token per step and block 4; graphed and compiled, it takes 28-29% of a generation's time at
SDAR-8B: BENCHMARKS.md, "Sampler speed".)

Compiled (``SamplerConfig.compile``): a replayed graph still runs every kernel the eager forward
launches, ~2,500 per forward at SDAR-8B's 36 layers, most of them small elementwise kernels (fp32
RMSNorm's casts, powers and means, rotary's halves, residual adds). With ``compile`` each static
step's forward goes through ``torch.compile`` before its capture (static sizes for the first shape,
dynamic ones shared by every later shape: compiled.py), so the graph
replays inductor's fused kernels instead. Measured at SDAR-8B on an H100 it gains nothing (0.96x
the uncompiled graph; 2.2x at the tiny shape on a CPU): the replay is not bound by those kernels,
so it stays off by default. Reading all T slots through a
4-D mask, transformers' sdpa would copy the cache once per query-head group (``repeat_kv``) in
every layer: graphed generations run with the GQA fold (common/models/gqa_fold.py).

Kept across generations (``StepGraphs``): one static step per shape (rows, query length, canvas
slots, dtype, device) and policy, the least recently used dropped beyond ``capacity``; each holds
its KV cache buffers (SDAR-8B, 128 rows, 385 slots: 7.3 GB) and its graph's memory. A graphed
canvas has its prompt width rounded up to a multiple of ``PROMPT_BUCKET``, so requests with prompts
of similar length share a shape (left padding is invisible: a row's tokens do not depend on it).
The graph reads parameters where they are: weights loaded in place (``load_state_dict``, the
weight push) are used by the next replay; a parameter or buffer with a new storage invalidates the
step (checked at every generation), and it is captured again.

On a device without CUDA the same static steps run as plain calls (same tokens, nothing captured),
announced by one log line per process: CPU tests and CPU runs of a GPU config take this path.
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import logging
from collections import OrderedDict
from typing import Callable, ContextManager, Iterator, Optional

import torch

from stabledrl.common.models.gqa_fold import folded_attention
from stabledrl.rollout.sampling.base import forward_block_logits
from stabledrl.rollout.sampling.cache import SlotKVCache
from stabledrl.rollout.sampling.compiled import compiled

PROMPT_BUCKET = 32  # graphed canvases round the prompt width up to a multiple of this
log = logging.getLogger(__name__)
_announced: set[str] = set()  # device types whose uncaptured fallback was logged


class CapturedStep:
    """``fn()`` captured as one CUDA graph at its first call and replayed at every later call
    (``capture``), or called plainly (CPU)."""

    def __init__(self, fn: Callable[[], torch.Tensor], capture: bool) -> None:
        self.fn, self.capture = fn, capture
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.out: Optional[torch.Tensor] = None  # the graph's output buffer
        self.calls = 0
        self.replays = 0  # calls answered by a replay (the capturing call counts too)

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        if not self.capture:
            return self.fn()
        if self.graph is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.fn()  # warm-up: lazy initialisation (cuBLAS handles, workspaces) outside the capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # captured on the warm-up's stream, whose lazily created state already exists
            with no_collection(), torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                self.out = self.fn()
            self.graph = graph
        self.graph.replay()
        self.replays += 1
        return self.out


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """Python's cyclic garbage collector run before a capture and kept off during it. A static step
    sits in a reference cycle (its captured forward is its own bound method), so a step the pool
    dropped, and its CUDA graph, are freed by the collector, whenever it runs; freed in the middle
    of another capture, the graph's reset is an operation a capturing stream does not permit, and
    the capture fails (seen on an H100: "operation not permitted when stream is capturing
    (function reset)", then cuBLAS failing inside the capture)."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class StaticStep:
    """One cached step of fixed shape: its input buffers, the KV cache it reads and writes, and the
    captured forward. The mask buffer is the sampler's to fill (see the module docstring).
    ``cache``: share another static step's cache (a second query shape over the same slots,
    ``companion``) instead of allocating one. ``compile``: the forward through ``torch.compile``
    before it is captured (``SamplerConfig.compile``)."""

    def __init__(self, policy: torch.nn.Module, *, batch: int, query_length: int, num_slots: int,
                 logits_from: int, block_length: int, capture: bool, compile: bool = False,
                 cache: Optional[SlotKVCache] = None) -> None:
        dev = policy.device
        self.policy, self.logits_from, self.block_length = policy, logits_from, block_length
        self.capture, self.compile = capture, compile
        self.cache = cache if cache is not None else SlotKVCache(num_slots)
        self.ids = torch.zeros(batch, query_length, dtype=torch.long, device=dev)  # [B, Lq]
        self.positions = torch.zeros_like(self.ids)  # [B, Lq]
        self.slots = torch.zeros_like(self.ids)  # [B, Lq]
        self.mask = torch.zeros(batch, 1, query_length, num_slots, dtype=torch.bool, device=dev)  # [B, 1, Lq, T]
        self.run = CapturedStep(compiled(self._forward) if compile else self._forward, capture)
        self.weights = weights_fingerprint(policy)
        self._companions: dict[tuple[int, int], StaticStep] = {}

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Copy this step's inputs [B, Lq] into the buffers and run it -> [B, Lb, V] block logits."""
        self.ids.copy_(ids)
        self.positions.copy_(positions)
        self.slots.copy_(slots)
        self.cache.set_slots(self.slots, self.cache.num_slots)
        return self.run()

    def companion(self, query_length: int, logits_from: int) -> "StaticStep":
        """The static step of another query shape over this step's cache (built at the first ask,
        kept with this one): block diffusion's entering step [previous block | current block]."""
        key = (query_length, logits_from)
        if key not in self._companions:
            self._companions[key] = StaticStep(
                self.policy, batch=self.ids.shape[0], query_length=query_length, num_slots=self.cache.num_slots,
                logits_from=logits_from, block_length=self.block_length, capture=self.capture,
                compile=self.compile, cache=self.cache,
            )
        return self._companions[key]

    def runs(self) -> list[CapturedStep]:
        """This step's captured forward and its companions'."""
        return [self.run, *(c.run for c in self._companions.values())]

    def _forward(self) -> torch.Tensor:
        return forward_block_logits(
            self.policy, self.ids, attention_mask=self.mask, position_ids=self.positions,
            logits_from=self.logits_from, offsets=None, block_length=self.block_length, cache=self.cache,
        )


class StepGraphs:
    """The static steps of one engine, kept across generations (least recently used dropped
    beyond ``capacity``). ``captures`` / ``replays`` count over its lifetime."""

    def __init__(self, capacity: int = 2) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity}: keep at least one static step")
        self.capacity = capacity
        self._steps: OrderedDict[tuple, StaticStep] = OrderedDict()
        self.built = 0  # static steps built
        self.reuses = 0  # generations that found their static step already built
        self._retired = [0, 0, 0]  # static calls, captures and replays of the dropped steps

    @property
    def calls(self) -> int:
        """Steps run from a static step (captured or not)."""
        return self._retired[0] + sum(r.calls for r in self._runs())

    @property
    def captures(self) -> int:
        """CUDA graphs captured (0 on a CPU)."""
        return self._retired[1] + sum(r.graph is not None for r in self._runs())

    @property
    def replays(self) -> int:
        return self._retired[2] + sum(r.replays for r in self._runs())

    def _runs(self) -> list[CapturedStep]:
        return [r for s in self._steps.values() for r in s.runs()]

    def static_steps(self) -> list[StaticStep]:
        """Every kept static step and its companions (a benchmark replays them one by one)."""
        return [s for step in self._steps.values() for s in (step, *step._companions.values())]

    def step(self, policy: torch.nn.Module, *, kind: str, batch: int, query_length: int, num_slots: int,
             logits_from: int, block_length: int, compile: bool = False) -> StaticStep:
        """The static step of this shape for ``policy``: the kept one if its weights are where
        they were, else a new one (captured at its first call on CUDA; ``compile``: its forward
        compiled first)."""
        dev, dtype = policy.device, next(policy.parameters()).dtype
        key = (kind, id(policy), batch, query_length, num_slots, logits_from, block_length, dtype, str(dev), compile)
        kept = self._steps.get(key)
        if kept is not None and kept.weights == weights_fingerprint(policy):
            self._steps.move_to_end(key)
            self.reuses += 1
            return kept
        self._drop(key)
        while len(self._steps) >= self.capacity:
            self._drop(next(iter(self._steps)))
        capture = dev.type == "cuda"
        if not capture and dev.type not in _announced:
            _announced.add(dev.type)
            log.warning("cuda_graph=True on a %s device: the static cached steps run without CUDA graph capture "
                        "(same tokens, no speed-up)", dev.type)
        step = StaticStep(policy, batch=batch, query_length=query_length, num_slots=num_slots,
                          logits_from=logits_from, block_length=block_length, capture=capture, compile=compile)
        self._steps[key] = step
        self.built += 1
        return step

    def clear(self) -> None:
        """Drop every static step (their caches and graphs' memory)."""
        for key in list(self._steps):
            self._drop(key)

    def _drop(self, key: tuple) -> None:
        step = self._steps.pop(key, None)
        if step is not None:
            for run in step.runs():
                self._retired[0] += run.calls
                self._retired[1] += run.graph is not None
                self._retired[2] += run.replays


def weights_fingerprint(policy: torch.nn.Module) -> tuple[int, ...]:
    """Where every parameter and buffer lives: a graph reads these addresses."""
    return tuple(t.data_ptr() for t in itertools.chain(policy.parameters(), policy.buffers()))


def graph_prompt_width(prompts, minimum: int) -> int:
    """Prompt width of a graphed canvas: the longest prompt rounded up to ``PROMPT_BUCKET``."""
    longest = max(len(p) for p in prompts)
    return max(minimum, -(-longest // PROMPT_BUCKET) * PROMPT_BUCKET)


def graphed_generation(policy: torch.nn.Module) -> ContextManager[None]:
    """The context of a graphed generation: the GQA fold where it applies (common/models/gqa_fold.py)."""
    return folded_attention(policy)

"""Semi-autoregressive masked-diffusion sampling for full-attention dLLMs (LLaDA, Dream).

LLaDA (arXiv 2502.09992): canvas [prompt | [MASK] x gen_length], cut into blocks of
block_length decoded left to right; each block gets steps / num_blocks steps, each step one
forward over the canvas; the step rule is in decode.py. Only the current block's logits are
used, so positions outside it are never chosen (the reference sets their confidence to -inf).

Caches (Fast-dLLM, arXiv 2505.22618) are approximate for full attention, since every position's
keys depend on every other position: a full forward refreshes the cache when the batch starts a
new block (and is that step's forward), then
  - ``prefix``: each step feeds [current block | suffix] and reads the prefix K/V from the cache;
  - ``dual``:   each step feeds only the current block and reads prefix and suffix K/V from it.
``none`` is the exact baseline: a full forward every step.

With a cache the rows are block-synchronous (state.py, ``block_sync``): with threshold decoding a
row that has decoded its block waits for the others, so the cache is refreshed exactly once per
block (num_blocks full forwards per generation) instead of whenever some row starts a block.
A waiting row neither commits, nor draws randomness, nor counts a step, so every mode decodes a
row exactly as it would alone: its tokens do not depend on its batch neighbours (the price of
waiting is forwards: a block costs the batch as many steps as its slowest row needs). The exact
path keeps rows independent (no waiting).

Dream's shifted logits (token k predicted at k-1) are undone by ``DiffusionPolicy``; a cached step
therefore also feeds the token just before the block, whose logit predicts the block's first.

With ``cfg.cuda_graph`` (dual cache only) the cached step runs from static buffers and is replayed
as one CUDA graph (graphs.py); its shape is the same whatever the block, so it computes what the
eager dual step computes. Refreshes are not graphed (their width is the canvas's).

With ``cfg.compile`` the full forward's decoder layers run compiled (compiled.py): every step's
forward without a cache, and the refresh at each block start of a graphed dual cache (whose cached
step is compiled before its capture, graphs.py).
"""
from __future__ import annotations

import contextlib
from typing import Optional, Sequence

import torch

from stabledrl.common.attention import full_mask
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.rollout.sampling.base import GenerationOutput, HostView, forward_block_logits, run_denoising
from stabledrl.rollout.sampling.cache import SlotKVCache
from stabledrl.rollout.sampling.canvas import Canvas, build_canvas
from stabledrl.rollout.sampling.compiled import compiled_layers
from stabledrl.rollout.sampling.graphs import StepGraphs, graph_prompt_width, graphed_generation
from stabledrl.rollout.sampling.state import DecodeState


class FullAttentionLogits:
    """``block_logits`` for a full-attention policy under one cache mode ("none", "prefix", "dual");
    ``graphs``: the dual cache's cached step from a static step of that pool."""

    def __init__(self, policy: DiffusionPolicy, canvas: Canvas, block_length: int, mode: str,
                 graphs: Optional[StepGraphs] = None, compile: bool = False) -> None:
        self.policy, self.canvas, self.block_length, self.mode = policy, canvas, block_length, mode
        self.rows = self.fed = self.attended = 0  # what the forwards carried (``_count``)
        self.shift = int(policy.spec.shifted_logits)
        # [B, 1, T, T], fixed for the whole generation. The exact path of a canvas without padding
        # passes none: every row attends to every key, and sdpa takes its fused kernel without a mask
        # operand (LLaDA-8B's width at d1's canvas on an H200: attention 3.8 ms a forward, 7.1 with
        # the mask; BENCHMARKS.md). A cached forward keeps it: without one, transformers derives the
        # mask from the cache, which this cache does not describe.
        self.mask = None if mode == "none" and not canvas.padded else full_mask(canvas.valid)
        t = canvas.total_length
        self.cache = None if mode == "none" else SlotKVCache(t)
        self.all_slots = torch.arange(t, device=canvas.ids.device).expand(canvas.batch_size, t)
        self.static = None
        # a graphed, compiled dual cache: its refreshes through the compiled decoder layers too
        self.compiled_refresh = compile and graphs is not None
        if graphs is not None:
            if mode != "dual":
                raise ValueError(f"only the dual-cache step has a static shape, not cache={mode!r}")
            lq = block_length + self.shift
            self.static = graphs.step(policy, kind="dual", batch=canvas.batch_size, query_length=lq, num_slots=t,
                                      logits_from=self.shift, block_length=block_length, compile=compile)
            self.cache = self.static.cache
            self.static.mask.copy_(canvas.valid[:, None, None, :].expand_as(self.static.mask))  # [B, 1, Lq, T]

    def __call__(self, state: DecodeState, view: HostView) -> torch.Tensor:
        if self.cache is None or view.refresh:
            return self._full(state, view)
        return self._prefix(state, view) if self.mode == "prefix" else self._dual(state)

    def _count(self, query: int) -> None:
        """What a forward carries, from the host's view alone: every row feeds ``query`` tokens, each
        reading every key of the canvas (the GenerationOutput's forward_* totals)."""
        rows = self.canvas.batch_size
        self.rows += rows
        self.fed += rows * query
        self.attended += rows * query * self.canvas.total_length

    def _offsets(self, state: DecodeState, view: HostView) -> torch.Tensor | None:
        return None if view.lo == view.hi else state.block_start - view.lo

    def _full(self, state: DecodeState, view: HostView) -> torch.Tensor:
        c = self.canvas
        if self.cache is not None:
            self.cache.set_slots(self.all_slots, c.total_length)
        self._count(c.total_length)
        # a graphed, compiled dual cache: its refresh through the compiled layers, the cache's writes
        # outside their graphs (one compilation for every layer: compiled.py)
        with compiled_layers(self.policy) if self.compiled_refresh else contextlib.nullcontext(), \
                self.cache.outside_graphs() if self.compiled_refresh else contextlib.nullcontext():
            return forward_block_logits(
                self.policy, c.ids, attention_mask=self.mask, position_ids=c.position_ids,
                logits_from=c.prompt_width + view.lo, offsets=self._offsets(state, view),
                block_length=self.block_length, cache=self.cache,
            )

    def _prefix(self, state: DecodeState, view: HostView) -> torch.Tensor:
        c, cache = self.canvas, self.cache
        start = c.prompt_width + view.lo - self.shift
        slot = torch.arange(start, c.total_length, device=c.ids.device)  # [Lq]
        # a row ahead of the slowest keeps its cached prefix: its tokens before its block go to scratch
        keep = slot[None, :] < (c.prompt_width + state.block_start)[:, None]  # [B, Lq]
        cache.set_slots(torch.where(keep, cache.scratch_slot, slot[None, :]), c.total_length)
        self._count(c.total_length - start)
        return forward_block_logits(
            self.policy,
            c.ids[:, start:],
            attention_mask=self.mask[:, :, start:],
            position_ids=c.position_ids[:, start:],
            logits_from=self.shift,
            offsets=self._offsets(state, view),
            block_length=self.block_length,
            cache=cache,
        )

    def _dual(self, state: DecodeState) -> torch.Tensor:
        c, cache = self.canvas, self.cache
        query = state.block_positions()  # [B, Lb] canvas indices
        slots = query
        if self.shift:
            query = torch.cat([query[:, :1] - 1, query], dim=1)  # [B, 1 + Lb]
            slots = torch.cat([torch.full_like(query[:, :1], cache.scratch_slot), slots], dim=1)
        self._count(query.shape[1])
        if self.static is not None:
            return self.static(c.ids.gather(1, query), c.position_ids.gather(1, query), slots)
        cache.set_slots(slots, c.total_length)
        lq = query.shape[1]
        attend = c.valid[:, None, None, :].expand(c.batch_size, 1, lq, c.total_length)  # [B, 1, Lq, T]
        return forward_block_logits(
            self.policy, c.ids.gather(1, query), attention_mask=attend, position_ids=c.position_ids.gather(1, query),
            logits_from=self.shift, offsets=None, block_length=self.block_length, cache=cache,
        )


def generate_full_attention(
    policy: DiffusionPolicy, prompts: Sequence[torch.Tensor], seeds: torch.Tensor, cfg: SamplerConfig,
    graphs: Optional[StepGraphs] = None,
) -> GenerationOutput:
    """Generate ``cfg.gen_length`` tokens after each prompt (1-D int tensors, no padding);
    ``seeds`` [B] seeds each row's own generator. With ``cfg.cuda_graph`` (dual cache) the cached
    steps replay a static step of ``graphs`` (kept across calls; None: a pool for this call only)."""
    if policy.is_block_diffusion:
        raise ValueError(f"{policy.spec.name} is a block-diffusion family; use generate_block_diffusion")
    block_length, _, steps_per_block = cfg.layout(policy.block_size)
    mode = cfg.resolved_cache(block_diffusion=False)
    width = 1
    if cfg.cuda_graph:
        graphs = graphs if graphs is not None else StepGraphs()
        width = graph_prompt_width(prompts, 1)
    if cfg.cuda_graph:
        context = graphed_generation(policy)
    elif cfg.compile:  # mode "none" (resolved_cache refuses the rest): the full forward's layers compiled
        context = compiled_layers(policy)
    else:
        context = contextlib.nullcontext()
    with torch.inference_mode(), context:
        canvas = build_canvas(
            prompts, cfg.gen_length, mask_token_id=policy.mask_token_id, pad_token_id=policy.pad_token_id,
            device=policy.device, min_prompt_width=width,
        )
        block_logits = FullAttentionLogits(policy, canvas, block_length, mode, graphs if cfg.cuda_graph else None,
                                           compile=cfg.compile)
        out = run_denoising(
            canvas, seeds, cfg, block_length=block_length, steps_per_block=steps_per_block,
            mask_token_id=policy.mask_token_id, eos_token_id=policy.eos_token_id,
            block_logits=block_logits, block_sync=mode != "none",
        )
    out.forward_rows, out.forward_tokens, out.forward_attended = block_logits.rows, block_logits.fed, \
        block_logits.attended
    return out

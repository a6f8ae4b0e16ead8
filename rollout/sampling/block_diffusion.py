"""Block-diffusion sampling (SDAR, TraDo; docs/algorithms.md §5) with an exact KV cache.

log pi(y) = sum_b log pi(y_b | q, y_<b): blocks of ``policy.block_size`` are generated left to
right, each by masked diffusion over its own positions (decode.py's step rule), attending to
the prompt and the finished blocks through the block-causal mask of common/attention.py. Since
a finished block's keys depend only on blocks at or before it, caching them is exact.

Cached path, one forward per denoising step and nothing else:
  - first step: [prompt | block 0] (the prompt prefill rides along with block 0's first step);
  - a step where some row has just entered a new block: [previous block | current block]; the
    previous block is clean and final, so the forward writes its exact K/V into the cache while
    denoising the current block (the "run it once more clean to append it" pass of SDAR, fused
    into the next block's first step; rows that entered earlier rewrite identical values, which
    lets each row move to its next block on its own);
  - every other step: [current block] alone, reading the prompt and finished blocks from the
    cache (half the tokens of the two-block form; with fixed steps per block, all but one step
    of each block).
The reference path (``cache="none"``) runs the whole canvas with the block-causal mask each step;
the two give the same tokens and the same number of forwards.

Attention masks of the cached path. An in-block step of a batch in lockstep (every working row in
the same block: fixed steps, or threshold decoding while the rows happen to agree) whose canvas
has no left padding reads *every* visible slot: [prompt | finished blocks | own block], so it
needs no mask at all. That step (3 of every 4 forwards at one token per step and block 4) runs
with none: sdpa can then take its flash kernel with grouped-query attention (no ``repeat_kv``
copy of the K/V cache for every query-head group, no boolean mask converted per layer). The
attention modules are made non-causal for the generation (transformers would otherwise apply
``is_causal``, or crop the keys, when no mask is given). Other steps keep the block-causal mask,
built once per block while the batch is in lockstep (its query and visible slots do not change
inside a block).

With ``cfg.cuda_graph`` the entering and in-block steps of a lockstep batch run from static buffers
instead, over all canvas slots behind the block-causal mask, each shape replayed as one CUDA graph
over one shared cache (graphs.py); the prefill and the steps of rows out of lockstep stay as above
(with a mask: the graphed canvas may be padded) and write into the same cache. The tokens are the
reference path's (fp32). ``cfg.compile`` compiles both static steps before their capture.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence

import torch

from stabledrl.common.attention import block_causal_mask, block_ids
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.models.flex_staircase import is_sdpa
from stabledrl.rollout.sampling.base import GenerationOutput, HostView, forward_block_logits, run_denoising
from stabledrl.rollout.sampling.cache import SlotKVCache
from stabledrl.rollout.sampling.canvas import Canvas, build_canvas
from stabledrl.rollout.sampling.graphs import StepGraphs, graph_prompt_width, graphed_generation
from stabledrl.rollout.sampling.state import DecodeState


def chunk_block_mask(blocks: torch.Tensor, valid: torch.Tensor, query: torch.Tensor, visible: int) -> torch.Tensor:
    """Block-causal mask for the query slots ``query`` [B, Lq] against slots [0, visible):
    [B, 1, Lq, visible], a query sees valid keys of its own and earlier blocks; padding sees itself."""
    key_blocks, key_valid = blocks[:, :visible], valid[:, :visible]  # [B, K]
    query_blocks, query_valid = blocks.gather(1, query), valid.gather(1, query)  # [B, Lq]
    allowed = (key_blocks[:, None, :] <= query_blocks[:, :, None]) & key_valid[:, None, :]
    itself = torch.arange(visible, device=query.device)[None, None, :] == query[:, :, None]
    return torch.where(query_valid[:, :, None], allowed, itself)[:, None]


def mask_free_attention(policy: DiffusionPolicy) -> Optional[dict]:
    """The ``attention_mask`` that makes a transformers decoder attend to every key it is given
    (``{layer type: None}``, passed through as prepared masks), or None where that cannot be
    expressed: an attention backend other than sdpa, or a model without ``layer_types``."""
    config = policy.model.config
    layer_types = getattr(config, "layer_types", None)
    if not is_sdpa(config) or not layer_types:
        return None
    return {kind: None for kind in set(layer_types)}


@contextlib.contextmanager
def non_causal(module: torch.nn.Module) -> Iterator[None]:
    """Every attention module with an ``is_causal`` flag set to False inside the block (restored
    after). Only forwards without a mask read the flag; masked forwards are unchanged."""
    flipped = [m for m in module.modules() if getattr(m, "is_causal", None) is True]
    for m in flipped:
        m.is_causal = False
    try:
        yield
    finally:
        for m in flipped:
            m.is_causal = True


class BlockDiffusionLogits:
    """``block_logits`` for a block-diffusion policy, with the exact cache or without a cache;
    ``graphs``: the entering and in-block steps of a lockstep batch from static steps of that pool
    (exact cache only; ``compile``: compiled before capture)."""

    def __init__(self, policy: DiffusionPolicy, canvas: Canvas, block_size: int, use_cache: bool,
                 graphs: Optional[StepGraphs] = None, compile: bool = False) -> None:
        self.policy, self.canvas, self.block_size = policy, canvas, block_size
        self.blocks = block_ids(canvas.prompt_mask, canvas.gen_length, block_size)  # [B, T]
        self.cache = SlotKVCache(canvas.total_length) if use_cache else None
        self.mask = None if use_cache else block_causal_mask(self.blocks, canvas.valid)  # [B, 1, T, T]
        # in-block steps of a lockstep batch read every visible slot: no mask when nothing is padding
        padded = bool((~canvas.valid).any())
        self.mask_free = None if (padded or not use_cache) else mask_free_attention(policy)
        self._mask_key: Optional[tuple] = None  # (block start, query kind, visible) of the kept mask
        self._block_mask: Optional[torch.Tensor] = None
        self.static = None
        if graphs is not None:
            if not use_cache:
                raise ValueError("a graphed block-diffusion step needs the exact cache")
            self.static = graphs.step(policy, kind="block_inside", batch=canvas.batch_size, query_length=block_size,
                                      num_slots=canvas.total_length, logits_from=0, block_length=block_size,
                                      compile=compile)
            # [previous block | current block] over the same cache, its logits from the second half
            self.static_enter = self.static.companion(2 * block_size, block_size)
            self.cache, self.mask_free = self.static.cache, None  # the static step always carries its mask
            self._static_block = -1  # block start the static masks hold (this generation)

    def __call__(self, state: DecodeState, view: HostView) -> torch.Tensor:
        c, bs = self.canvas, self.block_size
        if self.static is not None and view.forward > 0 and view.lo == view.hi:
            return self._static_lockstep(state, view)
        if self.cache is None:
            offsets = None if view.lo == view.hi else state.block_start - view.lo
            return forward_block_logits(
                self.policy, c.ids, attention_mask=self.mask, position_ids=c.position_ids,
                logits_from=c.prompt_width + view.lo, offsets=offsets, block_length=bs,
            )
        if view.forward == 0:  # [prompt | block 0]: every row is in block 0
            n = c.prompt_width + bs
            query = torch.arange(n, device=c.ids.device).expand(c.batch_size, n)
            logits_from, kind = c.prompt_width, "prefill"
            visible = n
        else:
            current = state.block_positions()  # [B, bs]
            if view.refresh:  # some row entered a new block: [previous block | current block]
                query = torch.cat([current - bs, current], dim=1)  # [B, 2 bs]
                logits_from, kind = bs, "enter"
            else:  # every row's previous block is already in the cache: [current block]
                query, logits_from, kind = current, 0, "inside"
            visible = min(c.prompt_width + view.hi + bs, c.total_length)
        self.cache.set_slots(query, visible)
        return forward_block_logits(
            self.policy, c.ids.gather(1, query), attention_mask=self._attention(query, visible, kind, view),
            position_ids=c.position_ids.gather(1, query), logits_from=logits_from, offsets=None,
            block_length=bs, cache=self.cache,
        )

    def _static_lockstep(self, state: DecodeState, view: HostView) -> torch.Tensor:
        """A step of a lockstep batch from the static steps, against all T slots with later blocks
        hidden by the block-causal mask (built once per block): the entering step feeds
        [previous block | current block] (the previous one enters the cache), the others the
        current block."""
        c, bs = self.canvas, self.block_size
        current = state.block_positions()  # [B, bs]
        if self._static_block != view.lo:
            query = torch.cat([current - bs, current], dim=1)  # [B, 2 bs]
            enter = chunk_block_mask(self.blocks, c.valid, query, c.total_length)  # [B, 1, 2 bs, T]
            self.static_enter.mask.copy_(enter)
            self.static.mask.copy_(enter[:, :, bs:])  # the current block's rows: [B, 1, bs, T]
            self._static_block = view.lo
        step, query = self.static, current
        if view.refresh:
            step, query = self.static_enter, torch.cat([current - bs, current], dim=1)
        return step(c.ids.gather(1, query), c.position_ids.gather(1, query), query)

    def _attention(self, query: torch.Tensor, visible: int, kind: str, view: HostView):
        """The cached step's mask: none for an in-block step of an unpadded lockstep batch, else
        the block-causal mask of the chunk, rebuilt only when the block or the chunk changes."""
        lockstep = view.lo == view.hi
        if kind == "inside" and lockstep and self.mask_free is not None:
            return self.mask_free
        key = (view.lo, kind, visible) if lockstep else None
        if key is None or key != self._mask_key:
            self._block_mask = chunk_block_mask(self.blocks, self.canvas.valid, query, visible)
            self._mask_key = key
        return self._block_mask


def generate_block_diffusion(
    policy: DiffusionPolicy, prompts: Sequence[torch.Tensor], seeds: torch.Tensor, cfg: SamplerConfig,
    graphs: Optional[StepGraphs] = None,
) -> GenerationOutput:
    """Generate ``cfg.gen_length`` tokens after each prompt with a block-diffusion policy;
    ``cfg.cache``: "prefix"/"auto" = exact KV cache, "none" = the reference path. With
    ``cfg.cuda_graph`` the in-block steps replay a static step of ``graphs`` (kept across calls;
    None: a pool for this call only)."""
    if not policy.is_block_diffusion:
        raise ValueError(f"{policy.spec.name} is a full-attention family; use generate_full_attention")
    block_size, _, steps_per_block = cfg.layout(policy.block_size, block_diffusion=True)
    use_cache = cfg.resolved_cache(block_diffusion=True) == "prefix"
    # at least one block of prompt slots, so [previous block | block 0] is always inside the canvas
    width = block_size
    if cfg.cuda_graph:
        graphs = graphs if graphs is not None else StepGraphs()
        width = graph_prompt_width(prompts, block_size)
    with torch.inference_mode():
        canvas = build_canvas(
            prompts, cfg.gen_length, mask_token_id=policy.mask_token_id, pad_token_id=policy.pad_token_id,
            device=policy.device, min_prompt_width=width,
        )
        block_logits = BlockDiffusionLogits(policy, canvas, block_size, use_cache, graphs if cfg.cuda_graph else None,
                                            compile=cfg.compile)
        if cfg.cuda_graph:
            context = graphed_generation(policy)
        elif block_logits.mask_free is not None:
            context = non_causal(policy)
        else:
            context = contextlib.nullcontext()
        with context:
            return run_denoising(
                canvas, seeds, cfg, block_length=block_size, steps_per_block=steps_per_block,
                mask_token_id=policy.mask_token_id, eos_token_id=policy.eos_token_id, block_logits=block_logits,
            )

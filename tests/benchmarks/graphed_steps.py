"""An experiment for both samplers: the cached step as one replayed CUDA graph.

The first GPU run measured 81 ms per forward at SDAR-8B shape, batch 128, block 4, where the
matrix products need ~10-20 ms, and the same 80 ms per forward with 4 rows instead of 128: the
forward is bound by the host. A Qwen3 forward of 36 layers issues ~3,000 aten ops (RMSNorm alone
is 8 kernels, 145 times), each paying Python, dispatch and a kernel launch. A CUDA graph replays
the whole forward's kernels with one launch.

A graph needs static shapes and static buffers, so the in-block step of a lockstep batch is
rewritten with shapes that do not change during a generation:

    input ids, positions, cache slots   [B, bs]       copied into static tensors every step
    keys                                all T slots   (the SlotKVCache buffers themselves)
    attention mask                      [B, 1, bs, T] block-causal (hides the slots of later
                                                      blocks), copied in once per block

The first in-block step of a generation runs once eagerly on a side stream (warm-up), is captured,
and every later in-block step is a replay; the prefill and each block's entering step stay eager.
Per generation: one capture (the cache buffers belong to the generation). The decode step (token
choice with per-row generators) stays eager. On a CPU the same static path runs without capture,
which is how test_graphed_steps.py checks it against the reference path (identical tokens).

The full-attention dual-cache step (Fast-dLLM) is static already: it feeds the current block and
reads all T slots through the padding mask, whatever the block; only its inputs are copied into
static buffers. Its graph replays the eager step's kernels, so graphed and eager dual-cache runs
give the same tokens bit for bit, in bf16 too. The refresh (a full forward, GPU-bound) stays eager.
Not in the project's samplers: bench_block_diffusion and bench_full_attention measure them (part
``cuda_graph``) to decide.
"""
from __future__ import annotations

from typing import Sequence

import torch

from common.config.sampler import SamplerConfig
from rollout.sampling.base import GenerationOutput, HostView, forward_block_logits, run_denoising
from rollout.sampling.block_diffusion import BlockDiffusionLogits, chunk_block_mask
from rollout.sampling.canvas import Canvas, build_canvas
from rollout.sampling.full_attention import FullAttentionLogits
from rollout.sampling.state import DecodeState


class StepGraph:
    """One captured call of ``step`` (CUDA) or plain calls (CPU / ``capture=False``)."""

    def __init__(self, step, capture: bool) -> None:
        self.step, self.capture = step, capture
        self.graph, self.out, self.replays = None, None, 0

    def __call__(self) -> torch.Tensor:
        if not self.capture:
            return self.step()
        if self.graph is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.step()  # warm-up: lazy initialisation happens outside the capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # captured on the warm-up's stream: its lazily created state (cuBLAS workspace) already exists
            with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                self.out = self.step()
            self.graph = graph
        self.graph.replay()
        self.replays += 1
        return self.out


class GraphedBlockDiffusionLogits(BlockDiffusionLogits):
    """``BlockDiffusionLogits`` (exact cache) whose in-block lockstep steps use static shapes and,
    on CUDA with ``capture``, one captured graph."""

    def __init__(self, policy, canvas: Canvas, block_size: int, capture: bool) -> None:
        super().__init__(policy, canvas, block_size, use_cache=True)
        b, t, dev = canvas.batch_size, canvas.total_length, canvas.ids.device
        self.ids = torch.zeros(b, block_size, dtype=torch.long, device=dev)  # [B, bs]
        self.positions = torch.zeros_like(self.ids)
        self.slots = torch.zeros_like(self.ids)
        self.static_mask = torch.zeros(b, 1, block_size, t, dtype=torch.bool, device=dev)  # [B, 1, bs, T]
        self.mask_free = None  # the static step always carries its mask
        self.mask_block = -1  # block start the static mask was built for
        self.graph = StepGraph(self._step, capture and dev.type == "cuda")

    def __call__(self, state: DecodeState, view: HostView) -> torch.Tensor:
        if view.forward == 0 or view.refresh or view.lo != view.hi:
            return super().__call__(state, view)
        c = self.canvas
        current = state.block_positions()  # [B, bs]
        self.ids.copy_(c.ids.gather(1, current))
        self.positions.copy_(c.position_ids.gather(1, current))
        self.slots.copy_(current)
        if self.mask_block != view.lo:
            self.static_mask.copy_(chunk_block_mask(self.blocks, c.valid, current, c.total_length))
            self.mask_block = view.lo
        self.cache.set_slots(self.slots, c.total_length)
        return self.graph()

    def _step(self) -> torch.Tensor:
        return forward_block_logits(self.policy, self.ids, attention_mask=self.static_mask, position_ids=self.positions,
                                    logits_from=0, offsets=None, block_length=self.block_size, cache=self.cache)


class GraphedDualLogits(FullAttentionLogits):
    """``FullAttentionLogits`` in dual-cache mode whose cached step runs from static buffers and,
    on CUDA with ``capture``, as one captured graph (refreshes stay eager)."""

    def __init__(self, policy, canvas: Canvas, block_length: int, capture: bool) -> None:
        super().__init__(policy, canvas, block_length, "dual")
        lq = block_length + self.shift
        b, dev = canvas.batch_size, canvas.ids.device
        self.ids = torch.zeros(b, lq, dtype=torch.long, device=dev)  # [B, (1 +) Lb]
        self.positions = torch.zeros_like(self.ids)
        self.slots = torch.zeros_like(self.ids)
        self.attend = canvas.valid[:, None, None, :].expand(b, 1, lq, canvas.total_length)  # [B, 1, Lq, T], constant
        self.graph = StepGraph(self._step, capture and dev.type == "cuda")

    def _dual(self, state: DecodeState) -> torch.Tensor:
        c = self.canvas
        query = state.block_positions()  # [B, Lb] canvas indices
        slots = query
        if self.shift:
            query = torch.cat([query[:, :1] - 1, query], dim=1)  # [B, 1 + Lb]
            slots = torch.cat([torch.full_like(query[:, :1], self.cache.scratch_slot), slots], dim=1)
        self.ids.copy_(c.ids.gather(1, query))
        self.positions.copy_(c.position_ids.gather(1, query))
        self.slots.copy_(slots)
        self.cache.set_slots(self.slots, c.total_length)
        return self.graph()

    def _step(self) -> torch.Tensor:
        return forward_block_logits(self.policy, self.ids, attention_mask=self.attend, position_ids=self.positions,
                                    logits_from=self.shift, offsets=None, block_length=self.block_length,
                                    cache=self.cache)


def generate_graphed(policy, prompts: Sequence[torch.Tensor], seeds: torch.Tensor, cfg: SamplerConfig,
                     capture: bool = True) -> tuple[GenerationOutput, int]:
    """``generate_block_diffusion`` with the graphed in-block step; returns (output, graph replays)."""
    block_size, _, steps_per_block = cfg.layout(policy.block_size, block_diffusion=True)
    with torch.inference_mode():
        canvas = build_canvas(prompts, cfg.gen_length, mask_token_id=policy.mask_token_id,
                              pad_token_id=policy.pad_token_id, device=policy.device, min_prompt_width=block_size)
        logits = GraphedBlockDiffusionLogits(policy, canvas, block_size, capture)
        out = run_denoising(canvas, seeds, cfg, block_length=block_size, steps_per_block=steps_per_block,
                            mask_token_id=policy.mask_token_id, eos_token_id=policy.eos_token_id, block_logits=logits)
    return out, logits.graph.replays


def generate_graphed_dual(policy, prompts: Sequence[torch.Tensor], seeds: torch.Tensor, cfg: SamplerConfig,
                          capture: bool = True) -> tuple[GenerationOutput, int]:
    """``generate_full_attention`` with ``cache="dual"`` and the graphed cached step; returns
    (output, graph replays)."""
    block_length, _, steps_per_block = cfg.layout(policy.block_size)
    with torch.inference_mode():
        canvas = build_canvas(prompts, cfg.gen_length, mask_token_id=policy.mask_token_id,
                              pad_token_id=policy.pad_token_id, device=policy.device)
        logits = GraphedDualLogits(policy, canvas, block_length, capture)
        out = run_denoising(canvas, seeds, cfg, block_length=block_length, steps_per_block=steps_per_block,
                            mask_token_id=policy.mask_token_id, eos_token_id=policy.eos_token_id, block_logits=logits,
                            block_sync=True)
    return out, logits.graph.replays

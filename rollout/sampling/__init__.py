"""Masked-diffusion samplers behind one call: ``generate(policy, prompts, seeds, cfg)``.

full_attention.py: LLaDA / Dream (semi-autoregressive blocks; optional approximate prefix / dual
cache). block_diffusion.py: SDAR / TraDo (exact KV cache of finished blocks). decode.py holds the
per-step rule, state.py the per-row progress, base.py the loop and the output record, graphs.py the
static cached steps replayed as CUDA graphs (``cfg.cuda_graph``).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.rollout.sampling.base import GenerationOutput
from stabledrl.rollout.sampling.block_diffusion import generate_block_diffusion
from stabledrl.rollout.sampling.d1_compat import generate_d1
from stabledrl.rollout.sampling.full_attention import generate_full_attention
from stabledrl.rollout.sampling.uniform_block import generate_uniform_block
from stabledrl.rollout.sampling.graphs import StepGraphs


def generate(
    policy: DiffusionPolicy, prompts: Sequence[torch.Tensor], seeds: torch.Tensor, cfg: SamplerConfig,
    graphs: Optional[StepGraphs] = None,
) -> GenerationOutput:
    """Sample ``cfg.gen_length`` tokens after each prompt with the sampler of the policy's family.
    ``graphs``: where the static steps of ``cfg.cuda_graph`` live across calls (an engine keeps
    one, so each shape is captured once); None = a pool for this call only."""
    if len(prompts) != len(seeds):
        raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds; give one seed per row")
    if cfg.compat == "d1":  # d1's eval decoding, padding and all (d1_compat.py)
        return generate_d1(policy, prompts, cfg)
    if policy.spec.noise == "uniform":  # DiffusionGemma: uniform-noise canvases (uniform_block.py)
        return generate_uniform_block(policy, prompts, seeds, cfg)
    if policy.is_block_diffusion:
        return generate_block_diffusion(policy, prompts, seeds, cfg, graphs)
    return generate_full_attention(policy, prompts, seeds, cfg, graphs)


__all__ = ["GenerationOutput", "StepGraphs", "generate", "generate_block_diffusion", "generate_d1",
           "generate_full_attention"]

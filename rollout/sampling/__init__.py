"""Masked-diffusion samplers behind one call: ``generate(policy, prompts, seeds, cfg)``.

full_attention.py: LLaDA / Dream (semi-autoregressive blocks; optional approximate prefix / dual
cache). block_diffusion.py: SDAR / TraDo (exact KV cache of finished blocks). decode.py holds the
per-step rule, state.py the per-row progress, base.py the loop and the output record.
"""
from __future__ import annotations

from typing import Sequence

import torch

from common.config.sampler import SamplerConfig
from common.models.base import DiffusionPolicy
from rollout.sampling.base import GenerationOutput
from rollout.sampling.block_diffusion import generate_block_diffusion
from rollout.sampling.full_attention import generate_full_attention
from rollout.sampling.uniform_block import generate_uniform_block


def generate(
    policy: DiffusionPolicy, prompts: Sequence[torch.Tensor], seeds: torch.Tensor, cfg: SamplerConfig
) -> GenerationOutput:
    """Sample ``cfg.gen_length`` tokens after each prompt with the sampler of the policy's family."""
    if len(prompts) != len(seeds):
        raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds; give one seed per row")
    if policy.spec.noise == "uniform":  # DiffusionGemma: uniform-noise canvases (uniform_block.py)
        return generate_uniform_block(policy, prompts, seeds, cfg)
    if policy.is_block_diffusion:
        return generate_block_diffusion(policy, prompts, seeds, cfg)
    return generate_full_attention(policy, prompts, seeds, cfg)


__all__ = ["GenerationOutput", "generate", "generate_block_diffusion", "generate_full_attention"]

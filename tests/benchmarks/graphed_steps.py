"""The graphed samplers as the first GPU run's experiment called them, now served by the product
(``SamplerConfig.cuda_graph``, rollout/sampling/graphs.py): each returns (output, graph replays),
for tests/gpu/test_sampler_fast_paths_gpu.py. Nothing is implemented here."""
from __future__ import annotations

from typing import Sequence

import torch

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.rollout.sampling import GenerationOutput, StepGraphs, generate


def generate_graphed(policy, prompts: Sequence[torch.Tensor], seeds: torch.Tensor, cfg: SamplerConfig,
                     capture: bool = True) -> tuple[GenerationOutput, int]:
    """Block diffusion with the graphed in-block step (exact cache). The product captures exactly
    on CUDA; ``capture=False`` is kept for the old call sites and must match that."""
    return _graphed(policy, prompts, seeds, cfg.model_copy(update={"cache": "prefix"}), capture)


def generate_graphed_dual(policy, prompts: Sequence[torch.Tensor], seeds: torch.Tensor, cfg: SamplerConfig,
                          capture: bool = True) -> tuple[GenerationOutput, int]:
    """Full attention with the graphed dual-cache step."""
    return _graphed(policy, prompts, seeds, cfg.model_copy(update={"cache": "dual"}), capture)


def _graphed(policy, prompts, seeds, cfg: SamplerConfig, capture: bool) -> tuple[GenerationOutput, int]:
    if capture != (policy.device.type == "cuda"):
        raise ValueError(f"the sampler captures exactly on CUDA; capture={capture} on {policy.device}")
    graphs = StepGraphs()
    out = generate(policy, prompts, seeds, cfg.model_copy(update={"cuda_graph": True}), graphs)
    return out, graphs.replays

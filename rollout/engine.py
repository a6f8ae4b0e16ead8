"""The rollout engine interface, and the native torch engine that implements it.

A rollout worker sees only ``RolloutEngine``: give it prompts with one seed per row, get back
completions with the per-token decode step; give it new weights with their version. The native
engine runs the samplers of rollout/sampling on a ``DiffusionPolicy`` in this process. Another
backend (vLLM, SGLang: vLLM serves only DiffusionGemma among dLLMs today, see DESIGN.md) fills the
same two methods and must keep the same contract:

- ``generate(prompts, seeds, cfg)``: prompts are 1-D int64 tensors without padding; ``seeds`` [B]
  seeds row b's randomness only, so a row's completion does not depend on its batch neighbours
  (needed for exactly-once replays and reproducible runs); output rows follow the prompt order;
  ``completion_ids`` is EOS-filled after the first EOS and ``decode_step`` [B, C] gives the step
  at which each token was committed (trajectory estimators read it; a backend that cannot record
  it must say so rather than invent one).
- ``load_weights(state_dict, version)``: names as in ``DiffusionPolicy.state_dict()``; after it
  returns, every later ``generate`` uses these weights and reports ``policy_version = version``.
"""
from __future__ import annotations

import time
from typing import Mapping, Protocol, Sequence, runtime_checkable

import torch

from common.config.sampler import SamplerConfig
from common.models.base import DiffusionPolicy
from rollout.sampling import GenerationOutput, StepGraphs, generate


@runtime_checkable
class RolloutEngine(Protocol):
    policy_version: int

    def generate(self, prompts: Sequence[torch.Tensor], seeds: torch.Tensor, cfg: SamplerConfig) -> GenerationOutput:
        """Sample ``cfg.gen_length`` tokens after each prompt; row b draws only from ``seeds[b]``."""
        ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Replace the weights (all of them, names of ``DiffusionPolicy.state_dict()``)."""
        ...


class TorchRolloutEngine:
    """The native engine: the samplers of rollout/sampling on a local ``DiffusionPolicy``.

    Requests larger than ``cfg.max_batch_size`` run in micro-batches of prompts of similar length
    (less left padding); since rows are independent of their neighbours this changes no token.
    With ``cfg.cuda_graph`` the engine keeps the static cached steps (and their CUDA graphs) of the
    last ``graph_capacity`` shapes across requests (rollout/sampling/graphs.py), so a shape is
    captured once and replayed by every later request of that shape, across weight updates
    (``load_weights`` copies in place, where the graphs read).
    """

    def __init__(self, policy: DiffusionPolicy, policy_version: int = 0, graph_capacity: int = 2) -> None:
        self.policy = policy.eval()
        self.policy_version = int(policy_version)
        self.graphs = StepGraphs(graph_capacity)

    def generate(self, prompts: Sequence[torch.Tensor], seeds: torch.Tensor, cfg: SamplerConfig) -> GenerationOutput:
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds; give one seed per row")
        if not prompts:
            raise ValueError("generate needs at least one prompt")
        t0 = time.perf_counter()
        seeds = torch.as_tensor(seeds, dtype=torch.long).cpu()
        by_length = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
        parts = []
        for start in range(0, len(by_length), cfg.max_batch_size):
            rows = by_length[start : start + cfg.max_batch_size]
            parts.append(generate(self.policy, [prompts[i] for i in rows], seeds[rows], cfg, self.graphs))
        out = GenerationOutput.concat(parts)
        inverse = torch.empty(len(by_length), dtype=torch.long)
        inverse[torch.tensor(by_length)] = torch.arange(len(by_length))
        out = out.select(inverse)
        out.time_s = time.perf_counter() - t0
        out.policy_version = self.policy_version
        return out

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy the tensors into the policy's parameters in place (dtype and device converted);
        every parameter and buffer must be given (a partial push is a bug upstream)."""
        self.policy.load_state_dict(dict(state_dict), strict=True)  # raises on missing or unexpected names
        self.policy_version = int(version)

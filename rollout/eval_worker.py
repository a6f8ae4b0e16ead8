"""A policy copy that completes prompts: the actor offline evaluation spreads over the GPUs.

    worker = EvalWorker(0, model_cfg)                    # the runner makes it a Ray actor, one per GPU
    texts = worker.complete(prompt_ids, seeds, sampler)  # decoded completions, in prompt order

It samples with the rollout engine (``stabledrl.rollout.engine.TorchRolloutEngine``: the samplers of
``stabledrl.rollout.sampling``, as rollouts and held-out evaluation do) and decodes as evaluation does
(``stabledrl.rollout.workflow.decode_completion``: up to the first EOS, special tokens removed). Grading stays
with the caller, so the actor needs no task and no reward code.

``loader`` builds (policy, tokenizer) from the model section (default ``load_policy``); the policy
goes to the actor's device (``stabledrl.common.actor_setup.setup_actor_process``: ``cuda:0`` of the GPU Ray gave it).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional, Sequence

import torch

from stabledrl.common.config.model import ModelConfig
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.actor_setup import setup_actor_process
from stabledrl.rollout.engine import TorchRolloutEngine
from stabledrl.rollout.workflow import decode_completion
from stabledrl.common.models import load_policy

Loader = Callable[[ModelConfig], tuple[Any, Any]]


def complete(engine: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], seeds: Sequence[int],
             sampler: SamplerConfig, eos_token_id: int) -> list[str]:
    """One completion per prompt (token ids, no padding), decoded; row b draws only from seeds[b].
    With ``sampler.compat == "d1"`` the prompts are one d1 batch, padded by the caller, and each
    completion is the whole window decoded with the special tokens kept (what d1's eval writes)."""
    tensors = [torch.tensor(list(p), dtype=torch.long) for p in prompts]
    out = engine.generate(tensors, torch.tensor(list(seeds), dtype=torch.long), sampler)
    if sampler.compat == "d1":
        return tokenizer.batch_decode(out.completion_ids.cpu(), skip_special_tokens=False)
    return [decode_completion(tokenizer, out.completion_ids[b].cpu(), int(out.completion_length[b]), eos_token_id)
            for b in range(len(tensors))]


class EvalWorker:
    def __init__(self, index: int, model: ModelConfig, loader: Optional[Loader] = None) -> None:
        t0 = time.perf_counter()
        self.index = index
        self.device = setup_actor_process()
        if loader is None:
            policy, self.tokenizer = load_policy(model)
        else:
            policy, self.tokenizer = loader(model)
        self.policy = policy.to(self.device).eval()
        self.engine = TorchRolloutEngine(self.policy)
        self.load_s = time.perf_counter() - t0

    def ready(self) -> dict[str, Any]:
        return {"worker": self.index, "device": str(self.device), "pid": os.getpid(), "load_s": self.load_s}

    def complete(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], sampler: SamplerConfig) -> list[str]:
        return complete(self.engine, self.tokenizer, prompts, seeds, sampler, self.engine.eos_token_id)

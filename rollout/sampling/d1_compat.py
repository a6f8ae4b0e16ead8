"""Decoding as d1's evaluation decodes (``sampler.compat: d1``), for reporting next to its table.

d1's ``eval/generate.py`` differs from this project's full-attention sampler (full_attention.py) in
ways that can flip greedy outputs, and this sampler reproduces each of them:

- the batch arrives left-padded by the caller (d1 pads with the tokenizer's pad token) and the
  padding is *visible*: no attention mask, positions 0..T-1 counted from the padded start, so a
  row's tokens depend on its batch neighbours' lengths;
- one full forward over the whole canvas per step, no cache;
- the argmax (and the confidence, a softmax over the whole vocabulary) include the mask token: a
  position whose best guess is [MASK] is "committed" as [MASK] and stays open, and any masked
  position before the end of the current block (an earlier block's leftover too) competes for the
  step's k commits; positions after the block never do;
- k per step: the block's masked count split over its steps (remainder first), fixed at the
  block's start; top-k by ``torch.topk`` per row;
- on CUDA the whole loop runs under ``torch.autocast("cuda")`` (float16 matmuls over the bf16
  weights; the softmax in float32), as d1's ``generate()`` does;
- the completion is the whole window: nothing is EOS-filled (text after an EOS is kept, as d1
  decodes it with the special tokens).

d1's eval is greedy (temperature 0); its sampled mode draws from the global RNG, which per-row seeds
cannot reproduce, so ``compat: d1`` requires temperature 0 (``stabledrl.common.config.sampler``).
"""
from __future__ import annotations

import time
from typing import Sequence

import torch

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.rollout.sampling.base import GenerationOutput


def generate_d1(policy: DiffusionPolicy, prompts: Sequence[torch.Tensor], cfg: SamplerConfig) -> GenerationOutput:
    """``cfg.gen_length`` tokens after prompts of one length (d1's left-padded batch), as d1 decodes."""
    widths = {len(p) for p in prompts}
    if len(widths) != 1:
        raise ValueError(f"compat d1 decodes a batch padded to one width (as d1's collate pads it); got widths "
                         f"{sorted(widths)}")
    if policy.spec.shifted_logits or policy.is_block_diffusion:
        raise ValueError(f"compat d1 reproduces d1's LLaDA decoding; {policy.spec.name} is not a LLaDA-style family")
    t0 = time.perf_counter()
    block_length, num_blocks, steps_per_block = cfg.layout(policy.block_size)
    device = policy.device
    mask_id = policy.mask_token_id
    prompt = torch.stack([torch.as_tensor(p, dtype=torch.long) for p in prompts]).to(device)  # [B, P]
    b, width = prompt.shape
    x = torch.cat([prompt, torch.full((b, cfg.gen_length), mask_id, dtype=torch.long, device=device)], dim=1)
    decode_step = torch.full((b, cfg.gen_length), -1, dtype=torch.long)
    forwards = 0
    autocast = torch.autocast(device_type="cuda", enabled=device.type == "cuda")  # float16 on CUDA, as d1
    with torch.inference_mode(), autocast:
        for block in range(num_blocks):
            end = width + (block + 1) * block_length
            start = end - block_length
            open_in_block = (x[:, start:end] == mask_id).sum(dim=1)  # [B]
            base, extra = open_in_block // steps_per_block, open_in_block % steps_per_block
            for step in range(steps_per_block):
                k = (base + (step < extra).long()).tolist()  # [B]
                masked = x == mask_id  # [B, T]
                logits = policy(x).logits  # [B, T, V]; no mask, positions 0..T-1
                x0 = logits.argmax(dim=-1)  # [B, T], the mask token included
                p = torch.softmax(logits, dim=-1)
                conf = p.gather(-1, x0[..., None]).squeeze(-1)  # [B, T]
                conf[:, end:] = float("-inf")
                x0 = torch.where(masked, x0, x)
                conf = torch.where(masked, conf, torch.tensor(float("-inf"), device=device))
                for row in range(b):
                    if k[row] > 0:
                        _, chosen = torch.topk(conf[row], k=k[row])
                        x[row, chosen] = x0[row, chosen]
                        decode_step[row, (chosen - width).clamp(min=0).cpu()] = forwards
                forwards += 1
    completion = x[:, width:].clone()
    decode_step = torch.where(decode_step < 0, forwards - 1, decode_step).to(device)
    length = torch.full((b,), cfg.gen_length, dtype=torch.long, device=device)
    return GenerationOutput(completion, length, decode_step, forwards, b * cfg.gen_length, time.perf_counter() - t0)

"""Score masked views: log p_theta(o_k | view) at the requested completion positions only.

Full-attention families (LLaDA, Dream) read a plain forward over ``[prompt | noisy completion]``.
Block-diffusion families (SDAR, TraDo) read the staircase layout ``[prompt | clean completion |
noisy completion]`` (docs/algorithms.md §5): block b of the noisy copy sees the prompt and the *clean*
blocks before it, so one forward scores every block's term log p(y_b | q, y_<b). Every estimator goes
through here, so each one means the same thing on both kinds of family.

Cost control: the LM head runs at the scored positions only (``logits_at``: about half a completion
under a uniform masking level, where the plain call would project every completion position onto
the vocabulary), the log-softmax is taken there alone (gather + logsumexp in float32), views with
nothing to score are skipped, and ``draw_batch`` bounds how many views of each row share one forward.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from stabledrl.common.attention import full_mask, staircase_mask
from stabledrl.common.estimators.masking import Views
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.models.flex_staircase import staircase_block_mask, uses_flex_staircase
from stabledrl.common.types import SequenceBatch


def build_inputs(
    policy: DiffusionPolicy,
    prompt_ids: torch.Tensor,  # [N, P], noisy prompt (left-padded)
    prompt_mask: torch.Tensor,  # [N, P]
    clean_completion: torch.Tensor,  # [N, C]
    noisy_completion: torch.Tensor,  # [N, C]
) -> tuple[torch.Tensor, Any, torch.Tensor, int]:
    """(input_ids, attention_mask, position_ids, logits_from) of the layout the policy's family scores with.

    The returned logits (from ``logits_from``) cover exactly the noisy completion's C positions.
    The mask is None for full-attention rows without padding (every token sees every token); for a
    policy on the flex staircase path (``model.staircase_attention: flex``) it is a flex BlockMask.
    """
    n, p = prompt_mask.shape
    c = noisy_completion.shape[1]
    ones = torch.ones(n, c, dtype=torch.bool, device=prompt_mask.device)
    valid = torch.cat([prompt_mask, ones], dim=1)  # [N, P + C]
    positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)  # [N, P + C], from each row's first real token
    if not policy.is_block_diffusion:
        input_ids = torch.cat([prompt_ids, noisy_completion], dim=1)  # [N, P + C]
        # no padding: no mask, so sdpa may take its flash kernel (a boolean mask rules it out)
        mask = None if bool(prompt_mask.all()) else full_mask(valid)
        return input_ids, mask, positions, p
    input_ids = torch.cat([prompt_ids, clean_completion, noisy_completion], dim=1)  # [N, P + 2C]
    positions = torch.cat([positions, positions[:, p:]], dim=1)  # both copies share position ids
    if uses_flex_staircase(policy):  # the layout as a flex BlockMask, never the dense mask
        return input_ids, staircase_block_mask(prompt_mask, c, policy.block_size), positions, p + c
    return input_ids, staircase_mask(prompt_mask, c, policy.block_size), positions, p + c


def token_logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[M, V] logits, [M] targets -> [M] float32 log-softmax at the targets."""
    picked = logits.gather(-1, targets[:, None]).squeeze(-1).float()
    return picked - torch.logsumexp(logits.float(), dim=-1)


def score_views(
    policy: DiffusionPolicy, batch: SequenceBatch, views: Views, draw_batch: Optional[int] = None
) -> torch.Tensor:
    """[B, V, C] float32: log p_theta(o_k | view v of row b) where ``views.score``, 0 elsewhere.

    Views are taken ``draw_batch`` at a time (all B rows of each), skipping (row, view) pairs with
    nothing to score; differentiable when grad is enabled.
    """
    device = policy.device
    batch = batch.to(device)
    b, v, c = views.score.shape
    p = batch.prompt_width
    score, prompt_noise, completion_noise = (t.to(device) for t in (views.score, views.prompt, views.completion))
    active = score.any(dim=-1)  # [B, V]
    step = max(1, v if draw_batch is None else int(draw_batch))
    out = torch.zeros(b, v, c, dtype=torch.float32, device=device)
    prompt_ids, completion_ids = batch.input_ids[:, :p], batch.completion_ids
    for start in range(0, v, step):
        # view-major order inside the chunk: all rows of view `start`, then of `start + 1`, ...
        vi, bi = active[:, start : start + step].T.nonzero(as_tuple=True)
        if bi.numel() == 0:
            continue
        vi = vi + start
        noisy_prompt = torch.where(prompt_noise[bi, vi], policy.mask_token_id, prompt_ids[bi])
        noisy_completion = torch.where(completion_noise[bi, vi], policy.mask_token_id, completion_ids[bi])
        inputs, attn, positions, logits_from = build_inputs(
            policy, noisy_prompt, batch.prompt_mask[bi], completion_ids[bi], noisy_completion
        )
        sel = score[bi, vi]  # [N, C]
        logits = policy(
            inputs, attention_mask=attn, position_ids=positions, logits_from=logits_from, logits_at=sel
        ).logits  # [M, V]: the LM head at the scored positions only
        lp = token_logp(logits, completion_ids[bi][sel])  # [M]
        rows = torch.zeros(sel.shape, dtype=torch.float32, device=device).masked_scatter(sel, lp)  # [N, C]
        out = out.index_put((bi, vi), rows)
    return out

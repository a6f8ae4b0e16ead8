"""Masked-diffusion supervised fine-tuning: LLaDA's SFT loss and a small single-process loop.

LLaDA (Nie et al., arXiv 2502.09992, §2.3 and its guidelines' ``forward_process``): for a prompt p
and a response r padded with EOS to the canvas width C (the EOS padding is part of the response and
is trained, which is how the model learns to stop; the sampler later EOS-fills the same canvas),

    t ~ U(0, 1),   p_mask = (1 - ε) t + ε                          (ε = 1e-3)
    each response token is masked independently with prob p_mask;  the prompt is never masked
    L = -(1/B) Σ_b (1/C) Σ_{k masked in row b} log p_θ(r_k | p, r_masked) / p_mask,b

(1/C: LLaDA divides by the response length including the EOS padding, here the canvas width).
E_t E_mask[Σ_{k masked} -log p / p_mask] is the negative ELBO of log p_θ(r | p), so minimising L
maximises a bound on the likelihood of the reference completions; tests/unit/learner/test_sft.py checks the
expectation against an enumeration of every mask.

Block-diffusion families (SDAR / TraDo) are scored through the staircase layout of
``stabledrl.common.estimators.scoring.build_inputs``: the noisy copy of block b sees the clean blocks before
it, so the same loss trains every block's conditional at once.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional, Sequence

import torch

from stabledrl.common.config.warmstart import WarmStartConfig
from stabledrl.common.estimators.scoring import build_inputs, token_logp
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.seeding import derive_seed, generator
from stabledrl.common.tasks.base import Row, Task
from stabledrl.common.tasks.prompts import prompt_ids
from stabledrl.common.types import SequenceBatch, left_pad

log = logging.getLogger(__name__)


def encode_pairs(
    tokenizer: Any, task: Task, rows: Sequence[Row], gen_length: int, *, eos_token_id: int, pad_token_id: int
) -> SequenceBatch:
    """[prompt left-padded | reference completion + EOS, EOS-filled to gen_length] for every row.

    Prompts are encoded exactly as the rollout side encodes them (``stabledrl.common.tasks.prompts``: through the
    chat template when the tokenizer has one), so the reference answer follows the opening of the
    assistant turn; a reference longer than ``gen_length`` tokens is an error naming its row.
    """
    prompts, completions = [], []
    for row in rows:
        prompt = prompt_ids(tokenizer, task, row)
        answer = tokenizer.encode(task.reference_completion(row), add_special_tokens=False)
        if not prompt:
            raise ValueError(f"row {row.prompt_id}: the rendered prompt encodes to no tokens")
        if len(answer) > gen_length:
            raise ValueError(
                f"row {row.prompt_id}: reference completion has {len(answer)} tokens, more than gen_length={gen_length}"
            )
        completions.append(answer + [eos_token_id] * (gen_length - len(answer)))
        prompts.append(torch.tensor(prompt, dtype=torch.long))
    padded, prompt_mask = left_pad(prompts, pad_token_id)
    completion = torch.tensor(completions, dtype=torch.long).reshape(len(rows), gen_length)  # [B, C]
    return SequenceBatch(
        input_ids=torch.cat([padded, completion], dim=1),
        prompt_mask=prompt_mask,
        completion_mask=torch.ones_like(completion, dtype=torch.bool),  # the EOS padding is trained too
    )


def draw_masks(
    batch_size: int, gen_length: int, g: torch.Generator, eps: float = 1e-3
) -> tuple[torch.Tensor, torch.Tensor]:
    """(p_mask [B], masked [B, C] bool): t ~ U(0, 1) per row, p_mask = (1 - eps) t + eps, each
    completion token masked independently with probability p_mask (CPU, from ``g``)."""
    t = torch.rand(batch_size, generator=g)
    p_mask = (1.0 - eps) * t + eps
    masked = torch.rand(batch_size, gen_length, generator=g) < p_mask[:, None]
    return p_mask, masked


def sft_loss(
    policy: DiffusionPolicy,
    batch: SequenceBatch,
    p_mask: torch.Tensor,  # [B]
    masked: torch.Tensor,  # [B, C] bool
    num_rows: Optional[float] = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """This micro-batch's share of the SFT loss (module docstring), divided by ``num_rows`` (the rows
    of the whole step; default B) so micro-batch losses add up to the step's loss.

    Returns (loss, metrics): ``sft/ce`` is the mean cross-entropy over the masked tokens (unweighted),
    ``sft/masked_fraction`` the fraction of completion tokens masked.
    """
    if policy.spec.noise != "mask":
        raise NotImplementedError(
            f"{policy.spec.name} corrupts with {policy.spec.noise} noise; this SFT loss is the absorbing-mask ELBO"
        )
    device = policy.device
    batch = batch.to(device)
    p_mask, masked = p_mask.to(device).float(), masked.to(device)
    b, c = masked.shape
    p = batch.prompt_width
    clean = batch.completion_ids  # [B, C]
    noisy = policy.corrupt(clean, masked)  # [B, C]
    inputs, attention, positions, logits_from = build_inputs(
        policy, batch.input_ids[:, :p], batch.prompt_mask, clean, noisy
    )
    logits = policy(
        inputs, attention_mask=attention, position_ids=positions, logits_from=logits_from
    ).logits  # [B, C, V]
    nll = -token_logp(logits[masked], clean[masked])  # [M]
    rows = masked.nonzero()[:, 0]  # [M] row of every masked token
    per_row = torch.zeros(b, dtype=torch.float32, device=device).index_add(0, rows, nll / p_mask[rows])  # [B]
    loss = per_row.sum() / (c * (b if num_rows is None else num_rows))
    metrics = {
        "sft/ce": (nll.sum() / masked.sum().clamp(min=1)).detach(),
        "sft/masked_fraction": masked.float().mean().detach(),
    }
    return loss, metrics


def sft_step(
    policy: DiffusionPolicy,
    optimizer: torch.optim.Optimizer,
    batch: SequenceBatch,
    p_mask: torch.Tensor,  # [B]
    masked: torch.Tensor,  # [B, C]
    micro_batch_size: int,
    grad_clip: float,
) -> tuple[float, float]:
    """One optimizer update on ``batch`` in micro-batches (losses normalised by the whole batch, so
    the gradient is the full batch's). Returns (loss, masked-token cross-entropy)."""
    b = batch.input_ids.shape[0]
    optimizer.zero_grad(set_to_none=True)
    total, ce = 0.0, 0.0
    for start in range(0, b, micro_batch_size):
        rows = list(range(start, min(start + micro_batch_size, b)))
        loss, metrics = sft_loss(policy, batch.select(rows), p_mask[rows], masked[rows], num_rows=b)
        loss.backward()
        total += float(loss.detach())
        ce += float(metrics["sft/ce"]) * len(rows) / b
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip)
    optimizer.step()
    return total, ce


class EpochOrder:
    """Row indices for successive steps: epoch e visits all n rows once, in a permutation seeded by
    (seed, e); a batch that crosses an epoch boundary continues into the next permutation."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed
        self.epoch, self.cursor = -1, n
        self.order = torch.empty(0, dtype=torch.long)

    def take(self, count: int) -> list[int]:
        picks: list[int] = []
        while len(picks) < count:
            if self.cursor >= self.n:
                self.epoch, self.cursor = self.epoch + 1, 0
                self.order = torch.randperm(
                    self.n, generator=generator(derive_seed(self.seed, "sft-epoch", self.epoch))
                )
            take = min(count - len(picks), self.n - self.cursor)
            picks.extend(self.order[self.cursor : self.cursor + take].tolist())
            self.cursor += take
        return picks


def run_sft(
    policy: DiffusionPolicy,
    tokenizer: Any,
    rows: Sequence[Row],
    task: Task,
    cfg: WarmStartConfig,
    seed: int,
    *,
    gen_length: int,
    label: str = "sft",
    callback: Optional[Callable[[int, dict[str, float]], None]] = None,
) -> dict[str, Any]:
    """Train ``policy`` in place with the SFT loss on ``rows``' reference completions.

    Deterministic given ``seed``: epoch e visits the rows in a permutation seeded by (seed, e) and
    step s draws its masks from (seed, s). AdamW with a linear warm-up to a constant ``cfg.lr``,
    gradient-norm clip ``cfg.grad_clip``. Every ``cfg.log_every`` steps the mean loss since the last
    report is logged ("``label`` step ...") and ``callback(step, metrics)`` runs (e.g. an evaluation). Returns the final
    metrics: ``sft/loss`` (mean of the last report window), ``sft/loss_first``, ``sft/ce``,
    ``sft/steps``, ``sft/time_s``, ``sft/tokens_per_s`` and ``sft/loss_curve`` (one value per window).
    """
    if not rows:
        raise ValueError("run_sft needs at least one training row")
    data = encode_pairs(
        tokenizer, task, rows, gen_length, eos_token_id=policy.eos_token_id, pad_token_id=policy.pad_token_id
    )
    n = data.input_ids.shape[0]
    decay = [p for p in policy.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in policy.parameters() if p.requires_grad and p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr
    )
    micro = cfg.micro_batch_size or cfg.batch_size
    order = EpochOrder(n, seed)
    curve: list[float] = []
    window: list[float] = []
    ce_window: list[float] = []
    t0 = time.perf_counter()
    policy.train()
    try:
        for step in range(cfg.steps):
            picks = order.take(cfg.batch_size)
            p_mask, masked = draw_masks(
                cfg.batch_size, gen_length, generator(derive_seed(seed, "sft", step)), cfg.mask_eps
            )
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr
            step_loss, step_ce = sft_step(policy, optimizer, data.select(picks), p_mask, masked, micro, cfg.grad_clip)
            window.append(step_loss)
            ce_window.append(step_ce)
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
                curve.append(sum(window) / len(window))
                report = {"sft/loss": curve[-1], "sft/ce": sum(ce_window) / len(ce_window), "sft/step": step + 1}
                window, ce_window = [], []
                log.info(f"{label} step {step + 1}/{cfg.steps}  loss {report['sft/loss']:.4f}  "
                         f"ce {report['sft/ce']:.4f}  ({time.perf_counter() - t0:.0f}s)")  # fmt: skip
                if callback is not None:
                    policy.eval()
                    callback(step + 1, report)
                    policy.train()
    finally:
        policy.eval()
    elapsed = time.perf_counter() - t0
    return {
        "sft/loss": curve[-1],
        "sft/loss_first": curve[0],
        "sft/ce": report["sft/ce"],
        "sft/steps": cfg.steps,
        "sft/time_s": elapsed,
        "sft/tokens_per_s": cfg.steps * cfg.batch_size * data.input_ids.shape[1] / max(elapsed, 1e-9),
        "sft/loss_curve": curve,
    }

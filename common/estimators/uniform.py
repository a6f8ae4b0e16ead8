"""Likelihood of a uniform-noise block-diffusion policy (DiffusionGemma), every block in one staircase.

Uniform-state diffusion (UDLM, Schiff et al., arXiv 2412.10193; Duo, Sahoo et al., arXiv 2506.10892):
q(z_t | x) = Cat(alpha_t e_x + (1 - alpha_t) / N), N = vocabulary size, i.e. each position keeps its
token with probability alpha_t and otherwise holds a token drawn uniformly from the vocabulary. With
the log-linear schedule alpha_t = 1 - t (continuous time; the bound does not depend on the schedule),
the per-token negative ELBO integrand of UDLM (its Eq. for the continuous-time NELBO) is

    g(t, z, x) = -alpha_t' / (N alpha_t) * [ N / xb_i - N / xbt_i
                 - sum_j (xb_j / xb_i) log( (xbt_i xb_j) / (xbt_j xb_i) ) ]        >= 0,
    xb = N alpha_t e_x + (1 - alpha_t) 1,   xbt = N alpha_t p_theta(. | z) + (1 - alpha_t) 1,   i = z,

and log p(x) >= -E_{t ~ U(0,1), z ~ q_t}[ sum over positions of g ] (a KL rate, so each g >= 0; it
is 0 when p_theta puts all mass on x). ``udlm_elbo_terms`` evaluates -g in closed form with
r = N alpha / (1 - alpha): the only vocabulary-wide quantity is S = sum_j log1p(r p_j), so nothing
[M, V] is needed beyond the log-softmax itself (a test checks it against the literal V-sum).

Block diffusion factorises log pi(y) = sum_b log pi(y_b | q, y_<b); each block's term is bounded
separately, with its own t_b, against its *clean* context. Per draw and per completion block b with
n_b real tokens (up to and including the first EOS):

    t_b = t_min + (t_max - t_min) u,  u ~ U(0, 1);  each real position corrupted with prob. t_b
    (a corrupted position holds a uniform token, ``DiffusionPolicy.corrupt``);
    objective "elbo":           value_b = sum_{k in b} -g(t_b, z_k, o_k)          (every real position)
    objective "corrupted_logp": value_b = sum_{k corrupted} log p_theta(o_k | q, y_<b, z_b)

and ``weighting`` "weighted" sums over the blocks (for "elbo": the ELBO of log pi(o); for
"corrupted_logp": each block's sum scaled by n_b / m_b, m_b = its corrupted count), "mean" takes
the per-scored-token mean (the StableDRL / SPG length-normalised form). The "corrupted_logp"
objective is a *surrogate*, not a bound: it is the masked-diffusion estimator's shape with uniform
corruption, cheaper (no V-wide sum) and closer to what the other estimators compute; a block with
no corrupted position contributes nothing.

Scoring is the staircase forward [prompt | clean completion | noisy completion] (scoring.py's
``build_inputs``): DiffusionGemma's encoder reads prompt + clean blocks < b, its decoder the noisy
block b (common/models/diffusion_gemma.py), with a zero self-conditioning signal (the first
denoising step). Canvas positions after the first EOS, up to the end of their block, hold uniform
noise and are never scored; later blocks are not scored at all. t is clamped to [1e-4, 1 - 1e-4]
(at t = 0 or 1 the closed form divides by zero; the integrand is finite at both ends).

Draw order per sample, for each draw and each block that holds real tokens: u, the n_b corruption
uniforms, the n_b noise tokens; then the noise after the first EOS. Forwards: ``num_draws``
(each of length P + 2C). Sequence values only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from stabledrl.common.config.estimator import UniformStaircaseConfig
from stabledrl.common.estimators.base import ESTIMATORS, LogLikelihood
from stabledrl.common.estimators.elbo import elbo_values
from stabledrl.common.estimators.masking import row_infos, sample_generators
from stabledrl.common.estimators.scoring import build_inputs, token_logp
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.types import SequenceBatch

T_CLAMP = 1e-4


@dataclass
class UniformViews:
    """``n`` uniformly corrupted copies of each of B completions (CPU until scored)."""

    noisy: torch.Tensor  # [B, n, C] int64 the noisy completion
    corrupted: torch.Tensor  # [B, n, C] bool positions replaced by noise
    score: torch.Tensor  # [B, n, C] bool positions whose term counts
    alpha: torch.Tensor  # [B, n, C] float64 alpha_t = 1 - t of the position's block
    weight: torch.Tensor  # [B, n, C] float32 per-token weight of "weighted" (elbo: 1, corrupted_logp: n_b / m_b)


def uniform_views(
    policy: DiffusionPolicy, batch: SequenceBatch, seeds: torch.Tensor, cfg: UniformStaircaseConfig
) -> UniformViews:
    """Draw every sample's corruption from its own seed (see the module docstring for the order)."""
    b, c, n, block = batch.input_ids.shape[0], batch.completion_width, cfg.num_draws, policy.block_size
    clean = batch.completion_ids.cpu()
    noisy = clean[:, None, :].repeat(1, n, 1)
    corrupted = torch.zeros(b, n, c, dtype=torch.bool)
    score = torch.zeros(b, n, c, dtype=torch.bool)
    alpha = torch.ones(b, n, c, dtype=torch.float64)
    weight = torch.zeros(b, n, c, dtype=torch.float32)
    for i, (info, g) in enumerate(zip(row_infos(batch), sample_generators(seeds))):
        length = info.completion_length
        for j in range(n):
            for start in range(0, length, block):
                real = min(block, length - start)
                t = cfg.t_min + (cfg.t_max - cfg.t_min) * float(torch.rand((), generator=g))
                hit = torch.rand(real, generator=g) < t  # [n_b]
                span = slice(start, start + real)
                noisy[i, j, span] = policy.corrupt(clean[i, None, span], hit[None], g)[0]
                corrupted[i, j, span] = hit
                alpha[i, j, span] = 1.0 - min(max(t, T_CLAMP), 1.0 - T_CLAMP)
                if cfg.objective == "elbo":
                    score[i, j, span], weight[i, j, span] = True, 1.0
                else:
                    score[i, j, span] = hit
                    weight[i, j, span] = hit.float() * (real / max(int(hit.sum()), 1))
            tail = min(-(-length // block) * block, c)  # end of the block holding the first EOS
            if tail > length:
                everything = torch.ones(1, tail - length, dtype=torch.bool)
                noisy[i, j, length:tail] = policy.corrupt(clean[i, None, length:tail], everything, g)[0]
                corrupted[i, j, length:tail] = True
    return UniformViews(noisy, corrupted, score, alpha, weight)


def udlm_elbo_terms(
    logits: torch.Tensor,  # [M, V] the decoder's logits at the scored positions
    clean: torch.Tensor,  # [M] x, the clean token
    noisy: torch.Tensor,  # [M] z, the token the canvas holds
    alpha: torch.Tensor,  # [M] alpha_t in (0, 1)
) -> torch.Tensor:
    """[M] float32: -g(t, z, x), the UDLM continuous-time ELBO integrand (module docstring), <= 0.

    With r = N a / (1 - a), xt_j = r [j = x] + 1 and xtt_j = r p_j + 1 (xb and xbt divided by 1 - a):
    N / xb_i - N / xbt_i = N / (1 - a) (1 / xt_i - 1 / xtt_i), and the V-sum is
    (1 / xt_i) [ (r + N)(log xtt_i - log xt_i) - S - r log1p(r p_x) + (r + 1) log1p(r) ],
    S = sum_j log1p(r p_j). Scalars in float64; only S is a V-wide float32 reduction.
    """
    n = logits.shape[-1]
    logp = torch.log_softmax(logits.float(), dim=-1)  # [M, V]
    a = alpha.to(device=logits.device, dtype=torch.float64)
    r = n * a / (1.0 - a)  # [M]
    s = torch.log1p(r[:, None].float() * logp.exp()).sum(-1).double()  # [M]
    p_x = logp.gather(-1, clean[:, None]).squeeze(-1).double().exp()
    p_i = logp.gather(-1, noisy[:, None]).squeeze(-1).double().exp()
    same = noisy == clean
    log_xt_i = torch.where(same, torch.log1p(r), torch.zeros_like(r))
    xt_i = torch.where(same, r + 1.0, torch.ones_like(r))
    xtt_i = r * p_i + 1.0
    term1 = n / (1.0 - a) * (1.0 / xt_i - 1.0 / xtt_i)
    term2 = (
        (r + n) * (torch.log1p(r * p_i) - log_xt_i) - s - r * torch.log1p(r * p_x) + (r + 1.0) * torch.log1p(r)
    ) / xt_i
    return ((term1 - term2) / (n * a)).float()


def score_uniform_views(
    policy: DiffusionPolicy, batch: SequenceBatch, views: UniformViews, objective: str
) -> torch.Tensor:
    """[B, n, C] float32: each scored position's term (-g or log p), 0 elsewhere; one staircase
    forward per draw over all B rows; differentiable when grad is enabled."""
    device = policy.device
    batch = batch.to(device)
    b, n, c = views.score.shape
    p = batch.prompt_width
    clean = batch.completion_ids
    per_draw = []
    for j in range(n):
        noisy, sel = views.noisy[:, j].to(device), views.score[:, j].to(device)  # [B, C]
        if not bool(sel.any()):
            per_draw.append(torch.zeros(b, c, dtype=torch.float32, device=device))
            continue
        inputs, attn, positions, logits_from = build_inputs(
            policy, batch.input_ids[:, :p], batch.prompt_mask, clean, noisy
        )
        logits = policy(
            inputs, attention_mask=attn, position_ids=positions, logits_from=logits_from
        ).logits  # [B, C, V]
        if objective == "elbo":
            terms = udlm_elbo_terms(logits[sel], clean[sel], noisy[sel], views.alpha[:, j].to(device)[sel])
        else:
            terms = token_logp(logits[sel], clean[sel])
        per_draw.append(torch.zeros(b, c, dtype=torch.float32, device=device).masked_scatter(sel, terms))  # [B, C]
    return torch.stack(per_draw, dim=1)


@ESTIMATORS.register("uniform_staircase")
def uniform_staircase(
    policy: DiffusionPolicy, batch: SequenceBatch, seeds: torch.Tensor, cfg: UniformStaircaseConfig
) -> LogLikelihood:
    if policy.spec.noise != "uniform" or not policy.is_block_diffusion:
        raise ValueError(
            f"the uniform_staircase estimator scores uniform-noise block diffusion (DiffusionGemma); "
            f"{policy.spec.name!r} corrupts with {policy.spec.noise!r}: use staircase or another masked estimator"
        )
    views = uniform_views(policy, batch, seeds, cfg)
    terms = score_uniform_views(policy, batch, views, cfg.objective)  # [B, n, C]
    draws = elbo_values(terms, views.score, views.weight, cfg.weighting)  # [B, n]
    return LogLikelihood(
        sequence=draws.mean(dim=1),
        forwards=cfg.num_draws,
        diagnostics={"draws": draws.detach(), "corrupted": views.corrupted.sum(-1), "scored": views.score.sum(-1)},
    )

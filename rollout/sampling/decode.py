"""One denoising step of masked-diffusion decoding: pick tokens, score them, commit some.

LLaDA's sampler (arXiv 2502.09992, Alg. 4-5) at each step, for the masked positions of the
current block:

    x0_k   = argmax_v  l_k[v] / T + g_k[v],   g ~ Gumbel(0, 1)   (argmax of l_k when T = 0)
    conf_k = softmax(l_k)[x0_k] = exp(l_k[x0_k] - logsumexp(l_k))
    commit the k masked positions of highest conf (low-confidence remasking: the rest stay masked),
    or k uniformly random ones (random remasking), or every one with conf > threshold and at
    least one (Fast-dLLM parallel decoding, arXiv 2505.22618).

The Gumbel-max form is LLaDA's ``exp(l) / (-log u)^T`` written in log space. The uniforms u come
from a torch generator per row, or (``sampler.noise_source: counter``) from a counter-based draw:
u = splitmix64(seed_b + (n_b · Lb·V + i + 1) · φ), n_b the row's own step counter and i the flat
(position, token) index, the top 53 (float64) or 24 (float32) bits as a fraction; one elementwise
computation for every row, fused into the choice's single pass when compiled. The confidence is
computed in float32 from a logsumexp over the block positions only, never a float64 softmax of
the whole canvas. The mask token is never chosen (its logit is set to -inf), so a committed
position can never read as masked again.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from stabledrl.common.compiling import compiled_once

NEG_INF = float("-inf")


def transfer_schedule(block_length: int, steps_per_block: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[steps_per_block] tokens committed at each step of a block: block_length split as evenly as
    possible, the remainder on the first steps (LLaDA's ``get_num_transfer_tokens``); sums to block_length."""
    base, rem = divmod(block_length, steps_per_block)
    k = torch.full((steps_per_block,), base, dtype=torch.long, device=device)
    k[:rem] += 1
    return k


def choose_tokens(
    logits: torch.Tensor,  # [B, Lb, V] logits of each row's current block (any float dtype)
    temperature: float,
    generators: Sequence[torch.Generator],  # one per row
    *,
    mask_token_id: int,
    noise_dtype: Union[torch.dtype, str] = torch.float64,
    rows: Optional[Sequence[int]] = None,
    fused: bool = False,
    counter: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    confidence: str = "float32",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick a token per position and its confidence. Returns (x0 [B, Lb] int64, conf [B, Lb] float32).

    ``confidence`` (``sampler.confidence``): "float32" = p(x0) from a float32 logsumexp over the
    vocabulary without [MASK]; "d1" / "stabledrl" = the release's, the softmax over the whole
    vocabulary, [MASK] included, in the dtype its sampler computes it (``release_confidence``).

    ``counter`` = (seeds [B], steps [B]) int64 on the logits' device: the counter-based draw instead
    of the generators (``counter_uniform``; float64 / float32 noise): row b's uniforms are a function of
    (seeds[b], steps[b]) alone, so ``rows`` is not needed (a row that waits keeps its step, and its
    next draw is the one it would have made).

    Each row draws its Gumbel noise from its own generator, so its choice does not depend on its
    batch neighbours. ``rows`` (default: all) are the rows that draw; the others leave their
    generator untouched (a row that commits nothing this step must not consume randomness, or its
    later draws would depend on how long it waited) and their x0 is meaningless. ``logits`` is
    modified in place (the mask token's logit is set to -inf).

    ``fused`` (``sampler.compile``): the same arithmetic after the draws through ``torch.compile``,
    one pass over the logits instead of a dozen (see ``_fused``); the draws stay per row.
    """
    if confidence not in CONFIDENCES:
        raise ValueError(f"unknown confidence {confidence!r}; valid: {', '.join(CONFIDENCES)}")
    mask_logit = logits[..., mask_token_id].clone() if confidence != "float32" else None  # [B, Lb]
    x0, conf = _choose(logits, temperature, generators, mask_token_id, noise_dtype, rows, fused, counter)
    if mask_logit is not None:
        conf = release_confidence(logits, mask_logit, x0, mask_token_id, RELEASE_CONFIDENCE_DTYPES[confidence])
    return x0, conf


# sampler.confidence: the float32 logsumexp without [MASK] (the default), or a release's softmax
# over the whole vocabulary in the dtype its sampler takes (d1: its model's bf16; the StableDRL
# release: float32, its model.dtype under FSDP once accelerate's upcast parameters are in place)
CONFIDENCES = ("float32", "d1", "stabledrl")
RELEASE_CONFIDENCE_DTYPES = {"d1": torch.bfloat16, "stabledrl": torch.float32}


def release_confidence(logits: torch.Tensor, mask_logit: torch.Tensor, x0: torch.Tensor, mask_token_id: int,
                       dtype: torch.dtype) -> torch.Tensor:
    """[B, Lb] a release's confidence: softmax(logits.to(dtype))[x0] over the whole vocabulary, [MASK]'s
    logit (``mask_logit``, which the choice set to -inf in ``logits``) included, read in ``dtype`` (in
    bf16 near-equal confidences tie), returned as float32."""
    full = logits.to(dtype)
    full[..., mask_token_id] = mask_logit.to(dtype)
    return torch.softmax(full, dim=-1).gather(-1, x0[..., None]).squeeze(-1).float()


def release_commit(scores: torch.Tensor, masked: torch.Tensor, k: torch.Tensor, offsets: torch.Tensor,
                   lengths: torch.Tensor) -> torch.Tensor:
    """[B, Lb] bool: the k masked positions a release commits, chosen as its sampler chooses them:
    ``torch.topk`` over the row it builds (``lengths[b]`` positions, -inf but at the block's masked
    positions, which sit from ``offsets[b]`` on), so that tied confidences part as they part there
    (which tied position topk returns depends on the device and on the row's layout)."""
    scores = scores.masked_fill(~masked, NEG_INF)
    commit = torch.zeros_like(masked)
    lb = scores.shape[1]
    for row, (n, at, length) in enumerate(zip(k.tolist(), offsets.tolist(), lengths.tolist())):
        if n <= 0:
            continue
        line = torch.full((int(length),), NEG_INF, dtype=scores.dtype, device=scores.device)
        line[at : at + lb] = scores[row]
        chosen = torch.topk(line, k=min(int(n), int(length))).indices - at
        chosen = chosen[(chosen >= 0) & (chosen < lb)]
        commit[row, chosen] = True
    return masked & commit


def _choose(
    logits: torch.Tensor, temperature: float, generators: Sequence[torch.Generator], mask_token_id: int,
    noise_dtype: Union[torch.dtype, str], rows: Optional[Sequence[int]], fused: bool,
    counter: Optional[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``choose_tokens`` with the float32 confidence."""
    logits[..., mask_token_id] = NEG_INF
    name = noise_dtype if isinstance(noise_dtype, str) else str(noise_dtype).removeprefix("torch.")
    if name not in NOISE_DTYPES:
        raise ValueError(f"unknown noise dtype {noise_dtype!r}; valid: {', '.join(NOISE_DTYPES)}")
    if temperature > 0 and counter is not None:
        if name in _PRODUCT_FORMS:
            raise ValueError(f"the counter-based draw gives float64 or float32 noise, not {name}")
        seeds, steps = counter
        if fused:
            return _fused("counter")(logits, seeds, steps, temperature, getattr(torch, name))
        x0 = _gumbel_argmax_(counter_uniform(seeds, steps, tuple(logits.shape[1:]), getattr(torch, name)), logits,
                             temperature)
    elif temperature > 0 and name in _PRODUCT_FORMS:
        draw, score, delta = _PRODUCT_FORMS[name]
        u = torch.empty(logits.shape, dtype=draw, device=logits.device)  # [B, Lb, V]
        _uniform_rows(u, generators, rows)
        if fused:
            return _fused("product")(logits, u, temperature, delta, score)
        x0 = _product_form_argmax(logits, u, temperature, delta, score)
    elif temperature > 0:
        noise = torch.empty(logits.shape, dtype=getattr(torch, name), device=logits.device)  # [B, Lb, V]
        _uniform_rows(noise, generators, rows)
        if fused:
            return _fused("gumbel")(logits, noise, temperature)
        x0 = _gumbel_argmax_(noise, logits, temperature)
    else:
        x0 = logits.argmax(dim=-1)  # [B, Lb]
    return x0, _confidence(logits, x0)


def _gumbel_argmax_(u: torch.Tensor, logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[B, Lb] argmax_v l_v / T + Gumbel(u_v), every operation in u's dtype; ``u`` [B, Lb, V] is
    overwritten in place (one buffer for the whole eager form)."""
    # Gumbel(0,1) = -log(-log u); the clamp keeps u -> 1 from giving an infinite winner
    u.log_().neg_().clamp_(min=torch.finfo(u.dtype).tiny).log_().neg_()
    u.add_(logits, alpha=1.0 / temperature)
    return u.argmax(dim=-1)


def _confidence(logits: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """[B, Lb] float32 p(x0) = exp(l[x0] - logsumexp(l)), computed in float32."""
    picked = logits.gather(-1, x0[..., None]).squeeze(-1).float()  # [B, Lb]
    return torch.exp(picked - torch.logsumexp(logits.float(), dim=-1))


# Gumbel noise precision (``sampler.noise_dtype``). float64 / float32: the log-space form above with the
# uniform draw and every operation in that dtype. The two low-precision forms are the releases' own
# arithmetic, operation for operation, so that their rounding (and the ties it makes) is theirs:
# score = exp(l) / (−log(u + δ))^T, u drawn in `draw`, the product computed in `draw`, then cast to
# `score` before the argmax (d1 diffu_grpo_trainer.add_gumbel_noise: bfloat16 throughout, δ = 0; the
# StableDRL release networks/llada_svpo.add_gumbel_noise_spg: float32 with δ = 1e-9, cast to the model's
# dtype, which under the release's FSDP launch is float32 once FSDP holds accelerate's upcast parameters,
# so float32_product, and bfloat16 before that: float32_then_bfloat16; tests/parity/stabledrl_noise_dtype.py).
NOISE_DTYPES = ("float64", "float32", "bfloat16", "float32_then_bfloat16", "float32_product")
_SCORE_SALT = 0x5DEECE66D  # random remasking's scores: a counter stream apart from the token draws'
_PRODUCT_FORMS = {
    "bfloat16": (torch.bfloat16, torch.bfloat16, 0.0),
    "float32_then_bfloat16": (torch.float32, torch.bfloat16, 1e-9),
    "float32_product": (torch.float32, torch.float32, 1e-9),
}


def _product_form_argmax(
    logits: torch.Tensor, u: torch.Tensor, temperature: float, delta: float, score: torch.dtype,
) -> torch.Tensor:
    """[B, Lb] argmax_v exp(l_v) / (−log(u_v + δ))^T, every operation in u's dtype (the draw), the
    result cast to ``score`` before the argmax. ``u`` is consumed."""
    if delta:
        u.add_(delta)
    u.log_().neg_().pow_(temperature)
    scores = logits.to(u.dtype).exp().div_(u).to(score)
    del u
    return scores.argmax(dim=-1)


def _product_choice(
    logits: torch.Tensor, u: torch.Tensor, temperature: float, delta: float, score: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The product form and the confidence as one function of tensors (what ``_fused`` compiles)."""
    if delta:
        u = u + delta
    scores = (logits.to(u.dtype).exp() / u.log().neg().pow(temperature)).to(score)
    x0 = scores.argmax(dim=-1)
    return x0, _confidence(logits, x0)


def _gumbel_choice(logits: torch.Tensor, u: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-space Gumbel-max form and the confidence as one function of tensors."""
    gumbel = u.log().neg().clamp(min=torch.finfo(u.dtype).tiny).log().neg()
    x0 = (gumbel + logits.to(u.dtype) * (1.0 / temperature)).argmax(dim=-1)
    return x0, _confidence(logits, x0)


def _counter_gumbel_choice(logits: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor, temperature: float,
                           dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-space Gumbel-max form over the counter-based draw, as one function of tensors."""
    return _gumbel_choice(logits, counter_uniform(seeds, steps, tuple(logits.shape[1:]), dtype), temperature)


# The counter-based draw (``sampler.noise_source: counter``): SplitMix64 over the counter
# seed + (step · n + i + 1) · φ, in int64 arithmetic that wraps (the constants as their two's-complement
# values); ``_shr`` is the logical right shift (torch's ``>>`` on int64 is arithmetic).
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    return (x >> s) & ((1 << (64 - s)) - 1)


def counter_uniform(seeds: torch.Tensor, steps: torch.Tensor, shape: tuple[int, ...],
                    dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """[B, *shape] uniforms in [0, 1): element i of row b is SplitMix64(seeds[b] + (steps[b] · n + i + 1) · φ)
    (n = prod(shape)), its top 53 bits (float64) or 24 (float32) as a fraction. A row's draws depend on
    its seed and step counter only; distinct (step, i) give distinct counters."""
    n = 1
    for d in shape:
        n *= int(d)
    index = torch.arange(n, device=seeds.device, dtype=torch.int64).view(1, *shape)
    count = steps.to(torch.int64).view(-1, *([1] * len(shape))) * n + index + 1
    z = seeds.to(torch.int64).view(-1, *([1] * len(shape))) + count * _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    bits = 53 if dtype == torch.float64 else 24
    return _shr(z, 64 - bits).to(dtype) * (2.0 ** -bits)


# Fused decode. Eager, a step's choice is a dozen passes over [B, Lb, V] (at LLaDA-8B's 32 rows x 32
# positions x 126,464: 0.5-1 GB each) besides the draws: 4.6-7.2 ms a step on an H100, against ~70 ms
# for an 8-layer forward. Compiled, the arithmetic after the draws reads the draws and the logits
# once. ``emulate_precision_casts`` rounds every low-precision intermediate where eager rounds it, so
# the bf16 product form keeps eager's ties.
_FUSED_FORMS = {"product": _product_choice, "gumbel": _gumbel_choice, "counter": _counter_gumbel_choice}


def _fused(form: str):
    return compiled_once(_FUSED_FORMS[form], options={"emulate_precision_casts": True})


def random_scores(
    shape: tuple[int, int], generators: Sequence[torch.Generator], device: torch.device,
    rows: Optional[Sequence[int]] = None, counter: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
) -> torch.Tensor:
    """[B, Lb] uniform scores for random remasking, one generator per row (only ``rows`` draw), or
    the counter-based draw of ``counter`` = (seeds, steps) on a stream of its own (the seeds salted)."""
    if counter is not None:
        seeds, steps = counter
        return counter_uniform(seeds ^ _SCORE_SALT, steps, (shape[1],), torch.float32)
    scores = torch.empty(shape, dtype=torch.float32, device=device)
    _uniform_rows(scores, generators, rows)
    return scores


def _uniform_rows(out: torch.Tensor, generators: Sequence[torch.Generator], rows: Optional[Sequence[int]]) -> None:
    """U(0, 1) into ``out[row]`` from ``generators[row]`` for each drawing row; 0.5 in the others."""
    if rows is None:
        for row, g in enumerate(generators):
            out[row].uniform_(generator=g)
        return
    drawing = set(rows)
    for row, g in enumerate(generators):
        if row in drawing:
            out[row].uniform_(generator=g)
        else:
            out[row].fill_(0.5)


def commit_mask(
    scores: torch.Tensor,  # [B, Lb] higher = commit first
    masked: torch.Tensor,  # [B, Lb] bool: positions still [MASK] (and rows still working)
    *,
    k: Optional[torch.Tensor] = None,  # [B] tokens to commit this step
    threshold: Optional[float] = None,
) -> torch.Tensor:
    """[B, Lb] bool: the masked positions committed this step.

    Fixed k: the k highest-scoring masked positions (ties go to the earlier position).
    Threshold: every masked position with score > threshold, plus the best one, so a row with
    masked positions always makes progress.
    """
    scores = scores.masked_fill(~masked, NEG_INF)
    order = scores.argsort(dim=1, descending=True, stable=True)  # [B, Lb]
    ar = torch.arange(scores.shape[1], device=scores.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(1, order, ar)  # rank[b, j]: 0 = best
    if threshold is not None:
        return masked & ((scores > threshold) | (rank == 0))
    if k is None:
        raise ValueError("commit_mask needs k (tokens per step) or a threshold")
    return masked & (rank < k[:, None])

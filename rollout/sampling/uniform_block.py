"""Block-by-block sampling for a uniform-noise block-diffusion policy (DiffusionGemma).

DiffusionGemma has no mask token: its canvas is noised with tokens drawn *uniformly from the
vocabulary* (common/models/diffusion_gemma.py). Generation goes block by block; for block b:

  - the canvas (``block_length`` = the policy's canvas length) starts as uniform random tokens;
  - each step runs the decoder over the canvas against the exact context cache (the encoder has
    committed the prompt and blocks < b), picks a token and a confidence per position
    (decode.py's rule: Gumbel-max at ``cfg.temperature``, confidence = p(picked token));
  - positions are *accepted* by confidence: the k most confident not-yet-accepted positions
    (the low-confidence schedule, k from ``transfer_schedule``), or every one above
    ``cfg.threshold`` (at least one); ``remasking="random"`` accepts k random ones;
  - every position not accepted is *renoised*: it holds a fresh uniform token at the next step
    (the release's ``EntropyBoundSampler.renoise_canvas``);
  - once every position is accepted, the clean block is committed to the encoder's cache in the
    same forward as the next block's first step ([clean block b | canvas b+1], ``logits_from``
    at the canvas), as block_diffusion.py fuses SDAR's "append" pass.

So this is the masked block sampler (base.py's loop, state.py's bookkeeping, decode.py's step rule)
with one change: what the model *sees* at an unaccepted position. The bookkeeping canvas keeps
``policy.mask_token_id`` at unaccepted positions (that is how ``DecodeState`` tells accepted from
not), and every forward feeds uniform noise there instead. The model never reads the mask id and
never emits it (decode.py gives it logit -inf).

Randomness: row b's token choices come from the loop's generator seeded by ``seeds[b]``; its
canvas noise from a second generator seeded by ``derive_seed(seeds[b], "uniform_canvas")``, drawn
(``block_length`` tokens) only on steps where the row steps. A row's tokens therefore depend on its
prompt and its seed only, not on its batch neighbours or their padding.

Self-conditioning: as in the release, every step after a block's first feeds the previous step's
(temperature-scaled) logits to the decoder's self-conditioning block; the first step of a block
has none (``self_conditioning=False`` turns it off everywhere).

Differences from the release's ``generate`` (what this sampler is not): accepted tokens stay fixed
(the release re-decides every position at every step, so no token has a decode step), acceptance is
by confidence, not the entropy bound, the temperature is constant (no linear schedule), and there
is no adaptive stopping (a block takes its steps; EOS stops a row as in the other samplers). Rows
move through the blocks together (``block_sync``: with a threshold, a row that finished its block
waits, drawing nothing), because the encoder cache grows by whole blocks for the whole batch.

Reference path (``cfg.cache="none"``): each step re-encodes [prompt | finished blocks] and decodes
the canvas in one forward. It gives the same tokens and the same number of forwards.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from stabledrl.common.attention import full_mask
from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.seeding import derive_seed, generator
from stabledrl.rollout.sampling.base import GenerationOutput, HostView, run_denoising
from stabledrl.rollout.sampling.canvas import Canvas, build_canvas
from stabledrl.rollout.sampling.state import DecodeState


class UniformCanvasLogits:
    """``block_logits`` for a uniform-noise policy: renoise the unaccepted positions, run the
    decoder over the canvas (with the exact encoder cache, or re-encoding the context)."""

    def __init__(
        self, policy: DiffusionPolicy, canvas: Canvas, block_length: int, seeds: torch.Tensor, *,
        use_cache: bool, temperature: float, self_conditioning: bool,
    ) -> None:
        self.policy, self.canvas, self.block_length = policy, canvas, block_length
        device = canvas.ids.device
        self.noise_generators = [generator(derive_seed(int(s), "uniform_canvas"), device) for s in seeds.tolist()]
        self.use_cache, self.temperature, self.self_conditioning = use_cache, temperature, self_conditioning
        self.cache = None  # the policy's ContextCache once the prompt is encoded
        self.committed = 0  # completion tokens the cache holds
        self.previous: Optional[torch.Tensor] = None  # [B, Lb, V] last step's logits (self-conditioning)

    def noisy_block(self, state: DecodeState, view: HostView) -> torch.Tensor:
        """[B, Lb] the current block as the model sees it: accepted tokens, fresh uniform noise elsewhere."""
        current = self.canvas.ids.gather(1, state.block_positions())  # [B, Lb]
        noise = torch.zeros_like(current)
        rows = range(len(self.noise_generators)) if view.rows is None else view.rows
        for row in rows:
            noise[row] = torch.randint(
                0,
                self.policy.vocab_size,
                (self.block_length,),
                generator=self.noise_generators[row],
                device=current.device,
            )
        return torch.where(current == self.policy.mask_token_id, noise, current)

    def __call__(self, state: DecodeState, view: HostView) -> torch.Tensor:
        c, lb, p = self.canvas, self.block_length, self.canvas.prompt_width
        lo = view.lo  # every working row is in this block (block_sync)
        noisy = self.noisy_block(state, view)  # [B, Lb]
        sc = None
        if self.self_conditioning and not view.refresh and self.previous is not None:
            sc = self.previous / self.temperature if self.temperature > 0 else self.previous
        if not self.use_cache:  # [prompt | finished blocks | canvas], everything encoded again
            end = p + lo + lb
            inputs = torch.cat([c.ids[:, : p + lo], noisy], dim=1)
            out = self.policy(
                inputs, attention_mask=full_mask(c.valid[:, :end]), position_ids=c.position_ids[:, :end],
                logits_from=p + lo, self_conditioning_logits=sc,
            )
        elif self.cache is None:  # first step: [prompt | canvas 0], the prompt enters the cache
            end = p + lb
            inputs = torch.cat([c.ids[:, :p], noisy], dim=1)
            out = self.policy(
                inputs, attention_mask=full_mask(c.valid[:, :end]), position_ids=c.position_ids[:, :end],
                use_cache=True, logits_from=p, self_conditioning_logits=sc,
            )
            self.cache = out.past_key_values
        else:  # [finished blocks not yet cached | canvas] against the cache
            start = p + self.committed
            context = c.ids[:, start : p + lo]  # clean blocks (empty inside a block)
            inputs = torch.cat([context, noisy], dim=1)  # [B, Lc + Lb]
            positions = torch.cat([c.position_ids[:, start : p + lo], c.position_ids[:, p + lo : p + lo + lb]], dim=1)
            keys = torch.cat([c.valid[:, :start], torch.ones_like(inputs, dtype=torch.bool)], dim=1)  # [B, S + L]
            mask = keys[:, None, None, :].expand(-1, 1, inputs.shape[1], -1)
            out = self.policy(
                inputs, attention_mask=mask, position_ids=positions, past_key_values=self.cache,
                logits_from=context.shape[1], self_conditioning_logits=sc,
            )
            self.committed = lo
        self.previous = out.logits  # decode.py sets the mask token's logit to -inf in place
        return out.logits  # [B, Lb, V]


def generate_uniform_block(
    policy: DiffusionPolicy, prompts: Sequence[torch.Tensor], seeds: torch.Tensor, cfg: SamplerConfig,
    *, self_conditioning: bool = True,
) -> GenerationOutput:
    """Generate ``cfg.gen_length`` tokens after each prompt with a uniform-noise block-diffusion
    policy; ``cfg.cache``: "prefix"/"auto" = the exact encoder cache, "none" = the reference path."""
    if policy.spec.noise != "uniform" or not policy.is_block_diffusion:
        raise ValueError(f"{policy.spec.name} is not a uniform-noise block-diffusion family; use generate()")
    if getattr(cfg, "cuda_graph", False):  # the field is newer than this sampler; read it where it exists
        raise ConfigError("sampler.cuda_graph: the uniform-noise (DiffusionGemma) sampler has no graphed step; set it "
                          "False")
    block_length, _, steps_per_block = cfg.layout(policy.block_size, block_diffusion=True)
    use_cache = cfg.resolved_cache(block_diffusion=True) == "prefix"
    seeds = torch.as_tensor(seeds, dtype=torch.long).cpu()
    with torch.inference_mode():
        canvas = build_canvas(
            prompts, cfg.gen_length, mask_token_id=policy.mask_token_id, pad_token_id=policy.pad_token_id,
            device=policy.device,
        )
        block_logits = UniformCanvasLogits(
            policy, canvas, block_length, seeds, use_cache=use_cache, temperature=cfg.temperature,
            self_conditioning=self_conditioning,
        )
        return run_denoising(
            canvas, seeds, cfg, block_length=block_length, steps_per_block=steps_per_block,
            mask_token_id=policy.mask_token_id, eos_token_id=policy.eos_token_id, block_logits=block_logits,
            block_sync=True,
        )

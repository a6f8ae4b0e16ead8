"""DiffusionGemma behind the one-forward policy interface.

DiffusionGemma (transformers ``DiffusionGemmaForBlockDiffusion``) is block diffusion with two roles
that share every transformer weight:

- the **encoder** reads committed tokens (prompt, finished blocks) *causally*, token by token, and
  leaves their keys/values in a cache; it produces no logits;
- the **decoder** reads a *canvas* (the block being denoised, ``canvas_length`` tokens, 256 in the
  release): its embeddings pass through the self-conditioning block (``post_norm(e + SC(soft))``;
  ``soft = 0`` at the first step), it attends bidirectionally to the cached context and the whole
  canvas, never writes the cache, and its logits are soft-capped: ``30 * tanh(logits / 30)``.

The canvas is noised with tokens drawn *uniformly from the vocabulary* (the release's
``EntropyBoundSampler`` renoises rejected positions that way), so the family's ``noise`` is
``"uniform"``: use ``DiffusionPolicy.corrupt``, not the mask token, to build noisy inputs.

How ``forward(input_ids, attention_mask, position_ids, past_key_values, use_cache, logits_from)``
maps onto it: positions ``< logits_from`` are context (encoder), positions ``>= logits_from`` are
canvas (decoder), and logits come back for the canvas only. The caller's 4-D mask is used as given
for the canvas rows (their keys are ``[cache | context | canvas]``) and, intersected with token
causality, for the context rows. So the staircase layout ``[prompt | clean | noisy]`` with
``logits_from = P + C`` scores every block b exactly as the release would: encoder over
``prompt + clean blocks < b``, decoder over noisy block b. Sliding-window layers see what the
release's cache keeps: the last ``W`` keys for context rows, the last ``W - 1`` context keys before
the canvas block (plus the canvas) for canvas rows.

Caching (the rollout side): ``past_key_values`` is a ``ContextCache`` from an earlier call. Context
rows of a call extend it *in place* (commit a finished block), canvas rows read it (``logits_from=0``
decodes a canvas against it), and ``use_cache=True`` returns it; mask columns, when a mask is given,
are ``[cached | this call's tokens]``.

Not covered by the one forward: images (the vision tower is loaded but never fed), the
self-conditioning signal of later denoising steps unless the caller passes
``self_conditioning_logits`` (estimators score the first-step, zero-signal decoder), and the
release's sampler (entropy-bound acceptance, temperature schedule, adaptive stopping), which is the
rollout engine's job.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from stabledrl.common.models.base import DiffusionPolicy, PolicyOutput
from stabledrl.common.models.masks import backend_mask


def require_diffusion_gemma() -> Any:
    """The transformers module with DiffusionGemma, or an ImportError naming the release needed."""
    import importlib

    import transformers

    try:
        return importlib.import_module("transformers.models.diffusion_gemma")
    except ImportError:
        raise ImportError(
            f"the diffusion_gemma family needs a transformers release that ships "
            f"transformers.models.diffusion_gemma (DiffusionGemmaForBlockDiffusion; tested with 5.17 and 5.24); this "
            f"environment has transformers {transformers.__version__}. Upgrade transformers or pick another family."
        ) from None


def cache_kwarg(fn: Callable) -> str:
    """Name of the cache argument of a transformers forward: ``cache`` in recent releases,
    ``past_key_values`` before (5.17 still uses the old name and silently drops the new one)."""
    return "cache" if "cache" in inspect.signature(fn).parameters else "past_key_values"


def tiny_config(
    *,
    vocab_size: int,
    pad_token_id: int,
    eos_token_id: int,
    bos_token_id: int,
    canvas_length: int,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    sliding_window: int = 8,
    attn_implementation: str = "sdpa",
) -> Any:
    """A DiffusionGemmaConfig at a tiny shape: alternating sliding/full layers (last one full), a small
    MoE next to each dense MLP, a one-layer vision tower, and a short sliding window so that tests
    exercise it."""
    dg = require_diffusion_gemma()
    head_dim = hidden_size // num_attention_heads
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_hidden_layers)]
    layer_types[-1] = "full_attention"
    text = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads, head_dim=head_dim, global_head_dim=head_dim,
        num_global_key_value_heads=num_key_value_heads, layer_types=layer_types, sliding_window=sliding_window,
        num_experts=4, top_k_experts=2, moe_intermediate_size=max(1, intermediate_size // 2),
        max_position_embeddings=4096, use_bidirectional_attention="vision",
        pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=bos_token_id,
    )  # fmt: skip
    vision = dict(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=8, patch_size=4, position_embedding_size=64,
    )  # fmt: skip
    return dg.DiffusionGemmaConfig(
        text_config=text, vision_config=vision, canvas_length=canvas_length, image_token_id=None,
        boi_token_id=None, eoi_token_id=None, attn_implementation=attn_implementation,
    )  # fmt: skip


@dataclass
class ContextCache:
    """The encoder's key/value cache of committed tokens plus their position ids (needed to apply the
    sliding window of later calls). The decoder reads it and never writes it."""

    kv: Any  # transformers DynamicCache, every layer full-length (windows are applied by our masks)
    positions: torch.Tensor  # [B, S] position id of every cached key

    def get_seq_length(self) -> int:
        return int(self.positions.shape[1])


class DiffusionGemmaPolicy(DiffusionPolicy):
    """DiffusionPolicy over ``DiffusionGemmaForBlockDiffusion``; see the module docstring."""

    @property
    def sliding_window(self) -> int:
        return int(self.model.config.get_text_config().sliding_window)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, L]
        *,
        attention_mask: Optional[torch.Tensor] = None,  # [B, 1, L, S + L] bool, S = cached length
        position_ids: Optional[torch.Tensor] = None,  # [B, L]
        past_key_values: Optional[ContextCache] = None,
        use_cache: bool = False,
        logits_from: Optional[int] = None,  # where the canvas starts
        self_conditioning_logits: Optional[torch.Tensor] = None,  # [B, L - logits_from, V]
        logits_at: Optional[torch.Tensor] = None,  # [B, L - logits_from] bool: return logits[logits_at], [M, V]
    ) -> PolicyOutput:
        b, length = input_ids.shape
        device = input_ids.device
        if logits_from is None and past_key_values is None:
            raise ValueError(
                "DiffusionGemma decodes a canvas against encoded context: pass logits_from (where the canvas "
                "starts) or the cache of an earlier call"
            )
        split = 0 if logits_from is None else int(logits_from)
        past = 0 if past_key_values is None else past_key_values.get_seq_length()
        if position_ids is None:
            position_ids = (torch.arange(length, device=device) + past).expand(b, length)
        if attention_mask is None:
            attention_mask = torch.ones(b, 1, length, past + length, dtype=torch.bool, device=device)
        attention_mask = attention_mask.bool()
        cache = self._cache_for(past_key_values, position_ids, split)
        key_positions = torch.cat([cache.positions, position_ids[:, split:]], dim=1)  # [B, S + L]
        context = {}
        if split > 0:
            rows = attention_mask[:, :, :split, : past + split]
            masks = self._context_masks(rows, position_ids[:, :split], key_positions[:, : past + split])
            context = dict(input_ids=input_ids[:, :split], attention_mask=masks, position_ids=position_ids[:, :split])
        if split == length:  # context only: extend the cache, no canvas to score
            if context:
                encoder = self.model.model.encoder
                encoder(**context, **{cache_kwarg(encoder.forward): cache.kv})
            logits = torch.zeros(b, 0, self.vocab_size, device=device)
        else:
            logits = self.model(
                **context,
                **{cache_kwarg(self.model.forward): cache.kv},
                decoder_input_ids=input_ids[:, split:],
                decoder_attention_mask=self._canvas_masks(attention_mask[:, :, split:], key_positions, past + split),
                decoder_position_ids=position_ids[:, split:],
                self_conditioning_logits=self_conditioning_logits,
            ).logits  # [B, L - split, V] float32, soft-capped
        keep = use_cache or past_key_values is not None
        if logits_at is not None:  # the decoder's head is soft-capped over the canvas: select after it
            logits = logits[logits_at]
        return PolicyOutput(logits=logits, past_key_values=cache if keep else None)

    @staticmethod
    def _cache_for(past: Optional[ContextCache], position_ids: torch.Tensor, split: int) -> ContextCache:
        """The cache this call writes its context rows into (the encoder extends ``kv`` in place, so the
        positions are extended here to stay in step); a fresh one when none is passed."""
        from transformers import DynamicCache

        if past is None:  # every layer full-length: the sliding window is applied by our masks
            return ContextCache(DynamicCache(), position_ids[:, :split])
        past.positions = torch.cat([past.positions, position_ids[:, :split]], dim=1)
        return past

    def _context_masks(
        self,
        mask: torch.Tensor,  # [B, 1, Q, K] the caller's rows for the context
        q_pos: torch.Tensor,  # [B, Q]
        k_pos: torch.Tensor,  # [B, K]
    ) -> dict[str, torch.Tensor]:
        """Encoder masks: the caller's mask, token-causal (the encoder is causal), and for sliding
        layers only keys within the window: ``q - W < k <= q``."""
        if getattr(self.model.config.get_text_config(), "use_bidirectional_attention", None) == "all":
            raise NotImplementedError(
                "this DiffusionGemma config makes its encoder bidirectional over text (use_bidirectional_attention="
                "'all'); the policy maps only the causal encoder of the release"
            )
        distance = q_pos[:, None, :, None] - k_pos[:, None, None, :]  # [B, 1, Q, K]
        full = mask & (distance >= 0)
        return self._for_backend({"full_attention": full, "sliding_attention": full & (distance < self.sliding_window)})

    def _canvas_masks(
        self,
        mask: torch.Tensor,  # [B, 1, Q, K] the caller's rows for the canvas, K = context + canvas keys
        k_pos: torch.Tensor,  # [B, K]
        context_length: int,
    ) -> dict[str, torch.Tensor]:
        """Decoder masks: the caller's mask; sliding layers see the canvas and the last ``W - 1`` context
        keys before the row's canvas block (what the release's sliding-window cache keeps)."""
        is_canvas = torch.arange(k_pos.shape[1], device=k_pos.device) >= context_length  # [K]
        big = torch.iinfo(k_pos.dtype).max
        visible_canvas = mask & is_canvas
        block_start = torch.where(visible_canvas, k_pos[:, None, None, :], big).amin(-1, keepdim=True)  # [B, 1, Q, 1]
        in_window = is_canvas | (k_pos[:, None, None, :] >= block_start - (self.sliding_window - 1))
        return self._for_backend({"full_attention": mask, "sliding_attention": mask & in_window})

    def _for_backend(self, masks: dict[str, torch.Tensor]) -> dict[str, Any]:
        return {kind: backend_mask(m, self.model.config._attn_implementation) for kind, m in masks.items()}

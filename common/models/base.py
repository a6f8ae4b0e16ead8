"""One policy interface over the transformers models of every dLLM family.

Samplers and estimators see only ``DiffusionPolicy``: ``forward`` returns logits *aligned in
place* (row k predicts token k) whatever the family does internally, plus the KV cache when asked.
Dream predicts token k from position k-1 ("shifted logits"); the shift is undone here, so no
caller branches on the family.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Literal, Optional

import torch
from torch import nn

from stabledrl.common.models.masks import backend_mask


@dataclass(frozen=True)
class FamilySpec:
    name: str  # "llada" | "dream" | "sdar" | "diffusion_gemma"
    attention: Literal["full", "block"]  # full bidirectional, or block-causal (block diffusion)
    shifted_logits: bool  # Dream: logits at k-1 predict token k
    default_block_size: int  # generation block (sampler) / diffusion block (block families)
    # what a corrupted position holds: the [M] token (absorbing-state diffusion), or a token drawn
    # uniformly from the vocabulary (DiffusionGemma renoises its canvas; it has no mask token)
    noise: Literal["mask", "uniform"] = "mask"


@dataclass
class PolicyOutput:
    logits: torch.Tensor  # [B, L_kept, V], row j predicts the token at kept position j
    past_key_values: Any = None


class DiffusionPolicy(nn.Module):
    """A masked-diffusion LM: the wrapped transformers model plus the tokens the algorithms need."""

    def __init__(
        self,
        model: nn.Module,
        spec: FamilySpec,
        *,
        mask_token_id: int,
        eos_token_id: int,
        pad_token_id: int,
        block_size: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.spec = spec
        self.mask_token_id = int(mask_token_id)
        self.eos_token_id = int(eos_token_id)
        self.pad_token_id = int(pad_token_id)
        self.block_size = int(block_size or spec.default_block_size)

    @property
    def is_block_diffusion(self) -> bool:
        return self.spec.attention == "block"

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.get_text_config().vocab_size)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, L]
        *,
        attention_mask: Optional[torch.Tensor] = None,  # [B, 1, L, L_total] bool, True = attend
        position_ids: Optional[torch.Tensor] = None,  # [B, L]
        past_key_values: Any = None,
        use_cache: bool = False,
        logits_from: Optional[int] = None,  # keep logits only for positions >= logits_from
        logits_to: Optional[int] = None,  # ... and < logits_to (default: to the end of the chunk)
        logits_at: Optional[torch.Tensor] = None,  # [B, L_kept] bool: only these kept positions, see below
    ) -> PolicyOutput:
        """Logits of the kept positions, [B, L_kept, V]. With ``logits_at`` only the positions it marks
        go through the LM head, returned as [M, V] in row-major order (``logits[logits_at]`` of the
        plain call): a scoring pass needs log-probabilities at its masked positions only, and the
        head (vocabulary x hidden) is a large share of a forward's work and of its memory."""
        length = input_ids.shape[1]
        start = 0 if logits_from is None else int(logits_from)
        end = length if logits_to is None else int(logits_to)
        if not 0 <= start < end <= length:
            raise ValueError(f"need 0 <= logits_from < logits_to <= {length}, got {start}, {end}")
        shift = 1 if self.spec.shifted_logits else 0
        if shift and start == 0:
            raise ValueError("shifted-logit families cannot predict position 0 of a chunk; pass logits_from >= 1")
        mask = backend_mask(attention_mask, self.model.config._attn_implementation)
        if logits_at is not None:
            if past_key_values is not None or use_cache:
                raise ValueError("logits_at scores a plain forward; it takes no cache")
            split = self._decoder_and_head()
            if split is not None:
                hidden = split[0](
                    input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False
                ).last_hidden_state  # [B, L, H]
                return PolicyOutput(logits=split[1](hidden[:, start - shift : end - shift][logits_at]))  # [M, V]
        keep = torch.arange(start - shift, end - shift, device=input_ids.device)
        kwargs: dict[str, Any] = {}
        if past_key_values is not None:
            kwargs[self._cache_kwarg] = past_key_values
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=use_cache,
            logits_to_keep=keep,
            **kwargs,
        )
        # the output's own field name: reading `past_key_values` from a release that renamed it to
        # `cache` logs a deprecation, even when the cache is None
        renamed = any(f.name == "cache" for f in fields(out)) if is_dataclass(out) else hasattr(out, "cache")
        cache = getattr(out, "cache" if renamed else "past_key_values", None)
        logits = out.logits if logits_at is None else out.logits[logits_at]
        return PolicyOutput(logits=logits, past_key_values=cache)

    def _decoder_and_head(self) -> Optional[tuple[nn.Module, nn.Module]]:
        """(decoder, LM head) of a transformers causal-LM class, whose logits are exactly the head over
        the decoder's last hidden state (Llama, Qwen2, Qwen3 and their PEFT wrappers); None for any
        other model, which then computes every kept position and selects afterwards."""
        get_decoder = getattr(self.model, "get_decoder", None)
        get_head = getattr(self.model, "get_output_embeddings", None)
        if get_decoder is None or get_head is None or getattr(self.model.config, "final_logit_softcapping", None):
            return None
        decoder, head = get_decoder(), get_head()
        if decoder is None or decoder is self.model or not isinstance(head, nn.Linear):
            return None
        return decoder, head

    def corrupt(
        self,
        input_ids: torch.Tensor,  # [B, L]
        masked: torch.Tensor,  # [B, L] bool, True = corrupt this position
        generator: Optional[torch.Generator] = None,
    ) -> torch.Tensor:
        """[B, L] ids with the ``masked`` positions replaced by the family's noise: ``mask_token_id``,
        or (``spec.noise == "uniform"``) tokens drawn uniformly from the vocabulary with ``generator``."""
        if self.spec.noise == "mask":
            return torch.where(masked, torch.full_like(input_ids, self.mask_token_id), input_ids)
        gen_device = generator.device if generator is not None else input_ids.device
        noise = torch.randint(0, self.vocab_size, input_ids.shape, generator=generator, device=gen_device)
        return torch.where(masked, noise.to(input_ids.device), input_ids)

    @functools.cached_property
    def _cache_kwarg(self) -> str:
        # transformers >= 5.2x renamed `past_key_values` to `cache`; accept both releases (read once:
        # inspect.signature on every forward is host time the samplers cannot spare)
        params = inspect.signature(self.model.forward).parameters
        return "cache" if "cache" in params else "past_key_values"

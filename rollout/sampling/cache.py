"""A KV cache addressed by canvas slot, written in place: one structure for every cached sampler.

Each layer keeps preallocated buffers ``K, V [B, H, T + 1, D]`` for a canvas of T positions (slot
T is a scratch slot that nothing reads). Before a forward the sampler names, per row, the slot of
each input token (``slots [B, Lq]``) and how many leading slots attention may read
(``visible``); each layer's ``update`` writes the fresh keys/values into those slots and returns
``K[:, :, :visible]``. The attention mask ``[B, 1, Lq, visible]`` decides what is really seen.

- Exact block-diffusion cache (SDAR / TraDo): slots of the prompt and finished blocks hold their
  clean K/V; a step writes [previous block (clean, now final) | current block (noisy)] so the
  finished block enters the cache in the same forward that denoises the next one.
- Prefix cache (Fast-dLLM, arXiv 2505.22618): a full forward writes every slot once per block;
  later steps feed [current block | suffix] and read the prefix from the buffer.
- Dual cache: the same refresh; later steps feed only the current block, reading both the prefix
  and the suffix from the buffer.
A row that must not overwrite a slot sends it to the scratch slot. Nothing is concatenated or
copied per step, unlike transformers' DynamicCache, whose update appends.

Only ``update`` (and ``get_seq_length`` for models that ask) is called by the transformers models
we wrap (Llama, Qwen2, Qwen3 in transformers 5.x), which is why a plain class suffices.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch


class SlotKVCache:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = int(num_slots)  # T; slot T is the scratch slot
        self.keys: list[torch.Tensor] = []  # per layer [B, H, T + 1, D]
        self.values: list[torch.Tensor] = []
        self._slots: Optional[torch.Tensor] = None  # [B, Lq] int64
        self._rows_heads: tuple[torch.Tensor, torch.Tensor] | None = None  # [B, 1, 1], [1, H, 1] indices
        self._visible = 0

    @contextlib.contextmanager
    def outside_graphs(self) -> Iterator[None]:
        """Inside: ``update`` is a graph break of a compiled caller, run eagerly. Under regional
        compilation (compiled.py: every decoder layer compiled on its own, one compilation for all)
        the update would be traced into each layer's graph, and its reads of the layer's index (the
        buffer list, its length) would specialise the graph to that layer: one compilation a layer
        and shape (64 at LLaDA-8B over two shapes: the whole recompile limit, common/compiling.py).
        Called from outside the graph, it leaves the layers one compilation, its writes the same
        index_put_ in place. (The instance's own ``update``, so that the caller's trace never
        enters it.)"""
        self.update = torch.compiler.disable(self._update)
        try:
            yield
        finally:
            del self.update

    @property
    def scratch_slot(self) -> int:
        return self.num_slots

    def set_slots(self, slots: torch.Tensor, visible: int) -> None:
        """Slots [B, Lq] of the next forward's input tokens, and the readable prefix length."""
        if not 0 < visible <= self.num_slots:
            raise ValueError(f"visible={visible} outside 1..{self.num_slots}")
        self._slots = slots
        self._visible = int(visible)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        """key/value_states [B, H, Lq, D] -> (K, V) [B, H, visible, D] with the new entries written."""
        return self._update(key_states, value_states, layer_idx)

    def _update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
                **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self._slots is None:
            raise RuntimeError("SlotKVCache.update called before set_slots")
        if layer_idx == len(self.keys):
            b, h, _, d = key_states.shape
            shape = (b, h, self.num_slots + 1, d)
            self.keys.append(torch.zeros(shape, dtype=key_states.dtype, device=key_states.device))
            self.values.append(torch.zeros(shape, dtype=value_states.dtype, device=value_states.device))
            if self._rows_heads is None:
                self._rows_heads = (torch.arange(b, device=key_states.device)[:, None, None],
                                    torch.arange(h, device=key_states.device)[None, :, None])
        k_buf, v_buf = self.keys[layer_idx], self.values[layer_idx]
        # advanced indexing, not scatter_: under torch.compile (sampler.compile) index_put_ writes into
        # the buffer in place, where a scatter_ into a graph input is computed into a full copy of the
        # layer's cache and copied back (two passes over [B, H, T + 1, D] per layer and step)
        index = (*self._rows_heads, self._slots[:, None, :])  # [B, 1, 1], [1, H, 1], [B, 1, Lq]
        k_buf.index_put_(index, key_states.to(k_buf.dtype))
        v_buf.index_put_(index, value_states.to(v_buf.dtype))
        return k_buf[:, :, : self._visible], v_buf[:, :, : self._visible]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._visible

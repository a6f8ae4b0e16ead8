"""The staircase layout as a flex-attention ``BlockMask`` built from a ``mask_mod``, and the
attention function that runs it.

The dense staircase mask (common/attention.py ``staircase_mask``) is a ``[B, 1, L, L]`` boolean;
handed to sdpa it rules out the flash kernel (the masked kernel reads the mask and computes every
tile, the empty half of the layout included; transformers also copies the grouped K/V heads). Its pattern is
fixed by four numbers per row: the row's left padding ``n_b``, the prompt width ``P``, the
completion width ``C`` and the diffusion block size. ``staircase_mask_mod`` computes whether a
query may see a key from those numbers alone, and ``staircase_block_mask`` builds the flex
``BlockMask`` (which 128 x 128 tiles are empty, full or partial) a few query tiles at a time, so no
``B x L x L`` tensor is ever held; flex then skips the empty tiles (about half of the layout) and
applies the mask_mod only inside the partial ones.

``FLEX_STAIRCASE`` is an attention function of transformers' ``AttentionInterface``: a forward whose
mask is a ``BlockMask`` runs ``flex_attention`` (compiled with ``torch.compile`` on CUDA, which is
what makes it fast; eager elsewhere), any other mask (the sampler's tensors, None) runs transformers'
stock sdpa function unchanged. ``use_flex_staircase(policy)`` installs it on a policy; the scoring
path (common/estimators/scoring.py) then hands the model a BlockMask instead of the dense mask.
It is selected by ``model.staircase_attention: flex`` (common/config/model.py).

Off CUDA, flex is unfused (it materialises the scores) and has no backward, so a forward there
materialises the mask from the same mask_mod and runs sdpa (CPU runs and rehearsals compute what
they computed before); ``FLEX_OFF_CUDA = True`` runs forwards without grad through eager flex
instead, which the CPU tests use to check the flex numerics against sdpa and the multi-pass value.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

import torch

FLEX_STAIRCASE = "sdpa_flex_staircase"
TILE = 128  # flex's default sparse block (tile) size
_CHUNK_ELEMENTS = 1 << 22  # at most this many mask entries exist at once while a BlockMask is built


def staircase_mask_mod(pad: torch.Tensor, prompt_width: int, completion_width: int, block_size: int) -> Callable:
    """``mask_mod(b, h, q, k)`` of the staircase layout over ``[prompt | clean | noisy]``
    (length ``P + 2C``), equal elementwise to ``staircase_mask`` for left-padded prompts.

    ``pad`` [B]: left-padding tokens of each row. The widths are kept as a device tensor, not
    Python constants, so a compiled flex kernel is not specialised (and recompiled) per width."""
    bounds = torch.tensor([prompt_width, prompt_width + completion_width], device=pad.device)
    pad = pad.to(torch.long)
    bs = int(block_size)

    def block(i, p, pc):
        # prompt: blocks counted backwards from the prompt's end (-1, -2, ...); both completion
        # copies: the completion position's block (0, 1, ...)
        prompt_block = -((p - 1 - i) // bs) - 1
        completion_block = torch.where(i >= pc, i - pc, i - p) // bs
        return torch.where(i < p, prompt_block, completion_block)

    def mask_mod(b, h, q, k):
        p, pc, n = bounds[0], bounds[1], pad[b]
        bq, bk = block(q, p, pc), block(k, p, pc)
        k_noisy = k >= pc
        clean_rule = ~k_noisy & (bk <= bq)
        noisy_rule = torch.where(k_noisy, bk == bq, bk < bq)
        allowed = torch.where(q >= pc, noisy_rule, clean_rule) & (k >= n)
        return torch.where(q >= n, allowed, q == k)  # a padding row sees only itself

    return mask_mod


def left_padding(prompt_mask: torch.Tensor) -> torch.Tensor:
    """[B, P] prompt mask -> [B] left-padding counts; ValueError unless every row is padding
    followed by its real tokens (the SequenceBatch layout)."""
    pad = (~prompt_mask).sum(dim=1)
    expect = torch.arange(prompt_mask.shape[1], device=prompt_mask.device)[None] >= pad[:, None]
    if not torch.equal(expect, prompt_mask.bool()):
        raise ValueError("the flex staircase mask needs left-padded prompts (padding, then the real tokens)")
    return pad


def staircase_block_mask(prompt_mask: torch.Tensor, completion_width: int, block_size: int) -> Any:
    """[B, P] left-padded prompt mask -> flex ``BlockMask`` of the staircase layout (length P + 2C)."""
    pad = left_padding(prompt_mask)
    return block_mask_from_mod(
        staircase_mask_mod(pad, prompt_mask.shape[1], completion_width, block_size),
        batch=prompt_mask.shape[0], length=prompt_mask.shape[1] + 2 * completion_width, device=prompt_mask.device,
    )


def block_mask_from_mod(mask_mod: Callable, *, batch: int, length: int, device: torch.device) -> Any:
    """``BlockMask`` of a broadcastable ``mask_mod`` over ``[batch, length, length]``, evaluated a
    band of query tiles at a time (at most ``_CHUNK_ELEMENTS`` entries at once). Tiles are
    classified as flex's ``create_block_mask`` does: full (every entry True), partial, empty."""
    from torch.nn.attention.flex_attention import BlockMask

    tiles = -(-length // TILE)
    padded = tiles * TILE
    b = torch.arange(batch, device=device)[:, None, None]
    k = torch.arange(padded, device=device)[None, None, :]
    band = max(1, _CHUNK_ELEMENTS // max(1, batch * TILE * padded))  # query tiles per chunk
    partial, full = [], []
    for first in range(0, tiles, band):
        rows = min(band, tiles - first) * TILE
        q = torch.arange(first * TILE, first * TILE + rows, device=device)[None, :, None]
        inside = (q < length) & (k < length)  # flex pads to whole tiles with False
        allowed = (mask_mod(b, None, q, k) & inside).expand(batch, rows, padded)
        tiled = allowed.reshape(batch, rows // TILE, TILE, tiles, TILE)
        counts = tiled.sum(dim=(2, 4), dtype=torch.int32)  # [B, band, tiles] entries allowed per tile
        full.append(counts == TILE * TILE)
        partial.append((counts > 0) & (counts < TILE * TILE))

    def ordered(dense: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = torch.cat(dense, dim=1)[:, None].to(torch.int32)  # [B, 1, tiles, tiles]
        order = torch.argsort(blocks, dim=-1, descending=True, stable=True)
        return blocks.sum(-1).to(torch.int32), order.to(torch.int32)

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=TILE, mask_mod=mask_mod, seq_lengths=(length, length)
    )


def dense_from_block_mask(block_mask: Any) -> torch.Tensor:
    """[B, 1, Q, K] bool: the ``mask_mod`` of ``block_mask`` evaluated everywhere (the CPU
    fallback for differentiable forwards; tests compare it with the dense layouts)."""
    q_len, k_len = block_mask.seq_lengths
    batch = block_mask.kv_num_blocks.shape[0]
    device = block_mask.kv_num_blocks.device
    b = torch.arange(batch, device=device)[:, None, None]
    q = torch.arange(q_len, device=device)[None, :, None]
    k = torch.arange(k_len, device=device)[None, None, :]
    return block_mask.mask_mod(b, None, q, k).expand(batch, q_len, k_len)[:, None]


_compiled_flex: Optional[Callable] = None
FLEX_OFF_CUDA = False  # run eager flex off CUDA for forwards without grad (tests check its numerics)


def _flex_kernel(device: torch.device) -> Callable:
    """flex_attention, compiled once per process on CUDA (the fused Triton kernel); eager elsewhere."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        def eager(*args: Any, **kwargs: Any) -> torch.Tensor:
            with warnings.catch_warnings():  # "called without torch.compile": known, tests only
                warnings.simplefilter("ignore", UserWarning)
                return flex_attention(*args, **kwargs)

        return eager
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex


def sdpa_flex_staircase(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, Lq, D]
    key: torch.Tensor,  # [B, H_kv, K, D]
    value: torch.Tensor,  # [B, H_kv, K, D]
    attention_mask: Any,  # a flex BlockMask, or whatever transformers' sdpa takes
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature -> ([B, Lq, H, D], None): flex for a BlockMask,
    transformers' sdpa for anything else."""
    from torch.nn.attention.flex_attention import BlockMask
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not isinstance(attention_mask, BlockMask):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if module.training and dropout > 0:
        raise ValueError("the flex staircase path has no attention dropout; set the model's attention_dropout to 0")
    if kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None or kwargs.get("s_aux") is not None:
        raise ValueError("the flex staircase path supports neither logit softcapping, position biases nor sinks")
    if query.device.type != "cuda" and not (FLEX_OFF_CUDA and not (torch.is_grad_enabled() and query.requires_grad)):
        # off CUDA flex is unfused (eager) and has no backward: the same mask, materialised from the
        # mask_mod, through sdpa (FLEX_OFF_CUDA: forwards without grad run eager flex, as tests do)
        dense = dense_from_block_mask(attention_mask)
        return sdpa_attention_forward(module, query, key, value, dense, dropout=dropout, scaling=scaling,
                                      is_causal=False, **kwargs)
    groups = query.shape[1] // key.shape[1]
    out = _flex_kernel(query.device)(query, key, value, block_mask=attention_mask, scale=scaling,
                                     enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make ``FLEX_STAIRCASE`` known to transformers (attention and mask-building interfaces)."""
    from transformers import AttentionInterface

    AttentionInterface.register(FLEX_STAIRCASE, sdpa_flex_staircase)
    try:  # a forward given a 2-D or no mask builds it as for sdpa
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

        AttentionMaskInterface.register(FLEX_STAIRCASE, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    except (ImportError, KeyError):  # noqa: PERF203 - a release without the mask interface builds none
        pass


def use_flex_staircase(policy: torch.nn.Module) -> None:
    """Run ``policy`` (a DiffusionPolicy on sdpa) with ``FLEX_STAIRCASE``: its staircase forwards
    get a BlockMask through flex, every other forward stays on sdpa."""
    config = policy.model.config
    if config._attn_implementation not in ("sdpa", FLEX_STAIRCASE):
        raise ValueError(
            f"model.staircase_attention flex runs beside sdpa; this model uses {config._attn_implementation!r}"
        )
    register()
    config._attn_implementation = FLEX_STAIRCASE


def uses_flex_staircase(policy: torch.nn.Module) -> bool:
    return getattr(policy.model.config, "_attn_implementation", None) == FLEX_STAIRCASE


def is_sdpa(config: Any) -> bool:
    """True for sdpa models, with or without the flex staircase path (every tensor mask runs sdpa)."""
    return config._attn_implementation in ("sdpa", FLEX_STAIRCASE)

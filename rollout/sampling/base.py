"""What every sampler shares: the output record and the step loop.

The loop (``run_denoising``) is the same for every sampler; a sampler supplies only
``block_logits(state, view) -> [B, Lb, V]``: the logits of each row's current block, however it
computes them (full forward, approximate cache, exact block cache). Host synchronisation: with a
fixed number of steps all rows move through the blocks in lockstep, so the host knows the block
without asking and reads the device once per block (only to stop early at EOS); with threshold
decoding rows advance at their own pace (or wait for each other at block ends: ``block_sync``,
state.py) and the host reads the progress summary and the rows that step next, once per step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.seeding import generator
from stabledrl.rollout.sampling.canvas import Canvas
from stabledrl.rollout.sampling.decode import transfer_schedule
from stabledrl.rollout.sampling.state import DecodeState


@dataclass
class GenerationOutput:
    """What a rollout engine returns for B prompts (rows in the order of the prompts)."""

    completion_ids: torch.Tensor  # [B, C] int64, EOS-filled after the first EOS
    completion_length: torch.Tensor  # [B] int64, tokens up to and including the first EOS (C if none)
    decode_step: torch.Tensor  # [B, C] int64, the row's step at which each token was committed
    num_forwards: int  # model forwards run (all micro-batches together)
    tokens_generated: int  # sum of completion_length
    time_s: float  # wall-clock seconds of generation
    policy_version: int = 0  # version of the weights that generated it
    # what the forwards carried, summed over them (the roofline's FLOPs, tests/benchmarks/peers/roofline.py):
    # rows, the tokens fed (rows x the query's length: the whole canvas, or a cached step's block), and
    # attention's query-key pairs (rows x the query's length x the keys it reads). A sampler that does not
    # count them leaves them to the engine, which counts every forward as one of the whole canvas
    forward_rows: int = 0
    forward_tokens: int = 0
    forward_attended: int = 0

    @staticmethod
    def concat(parts: Sequence["GenerationOutput"]) -> "GenerationOutput":
        return GenerationOutput(
            completion_ids=torch.cat([p.completion_ids for p in parts]),
            completion_length=torch.cat([p.completion_length for p in parts]),
            decode_step=torch.cat([p.decode_step for p in parts]),
            num_forwards=sum(p.num_forwards for p in parts),
            tokens_generated=sum(p.tokens_generated for p in parts),
            time_s=sum(p.time_s for p in parts),
            policy_version=parts[0].policy_version if parts else 0,
            forward_rows=sum(p.forward_rows for p in parts),
            forward_tokens=sum(p.forward_tokens for p in parts),
            forward_attended=sum(p.forward_attended for p in parts),
        )

    def select(self, rows: torch.Tensor) -> "GenerationOutput":
        """The same output with rows reordered / picked by ``rows`` [B'] (totals unchanged)."""
        rows = rows.to(self.completion_ids.device)
        return GenerationOutput(
            self.completion_ids[rows], self.completion_length[rows], self.decode_step[rows],
            self.num_forwards, self.tokens_generated, self.time_s, self.policy_version,
            self.forward_rows, self.forward_tokens, self.forward_attended,
        )


@dataclass(frozen=True)
class HostView:
    """What the host knows before a forward, without asking the device."""

    lo: int  # lowest current block start (completion index) among working rows
    hi: int  # highest
    refresh: bool  # some working row starts a new block (approximate caches refresh here)
    forward: int  # forwards run so far
    rows: Optional[list[int]] = None  # rows that step (commit, draw randomness); None = all


BlockLogits = Callable[[DecodeState, HostView], torch.Tensor]  # -> [B, Lb, V]


def run_denoising(
    canvas: Canvas,
    seeds: torch.Tensor,  # [B] int64, one generator seed per row
    cfg: SamplerConfig,
    *,
    block_length: int,
    steps_per_block: int,
    mask_token_id: int,
    eos_token_id: int,
    block_logits: BlockLogits,
    block_sync: bool = False,
) -> GenerationOutput:
    """Decode the canvas block by block until every row is done; see the module docstring.
    ``block_sync``: rows wait for each other at block ends (state.py; the approximate caches)."""
    t0 = time.perf_counter()
    device = canvas.ids.device
    counter = cfg.noise_source == "counter"  # the counter-based draw keyed by the seeds (decode.py), no generators
    generators = [] if counter else [generator(int(s), device) for s in seeds.tolist()]
    keys = seeds.to(device=device, dtype=torch.int64) if counter else None
    state = DecodeState.start(canvas, block_length, mask_token_id, eos_token_id, block_sync=block_sync)
    schedule = transfer_schedule(block_length, steps_per_block, device)
    num_blocks = canvas.gen_length // block_length
    fixed = cfg.threshold is None
    max_forwards = num_blocks * steps_per_block if fixed else canvas.gen_length
    view = HostView(lo=0, hi=0, refresh=True, forward=0)
    while True:
        logits = block_logits(state, view)  # [B, Lb, V]
        state.step(
            logits, generators, temperature=cfg.temperature, remasking=cfg.remasking, schedule=schedule,
            threshold=cfg.threshold, noise_dtype=cfg.noise_dtype, stop_at_eos=cfg.stop_at_eos,
            rows=view.rows, fused=cfg.compile, seeds=keys, confidence=cfg.confidence,
        )
        n = view.forward + 1
        if fixed:  # lockstep: every working row is in block n // steps_per_block
            if n % steps_per_block:
                view = HostView(view.lo, view.hi, refresh=False, forward=n)
                continue
            if n == max_forwards or (cfg.stop_at_eos and bool(state.done.all())):
                break
            start = (n // steps_per_block) * block_length
            view = HostView(start, start, refresh=True, forward=n)
        else:
            lo, hi, all_done, entered, rows = state.progress()
            if all_done:
                break
            if n >= max_forwards:
                raise RuntimeError(
                    f"threshold decoding ran {n} forwards without finishing gen_length={canvas.gen_length}"
                )
            view = HostView(lo, hi, refresh=entered, forward=n, rows=rows)
    return _finish(state, eos_token_id, forwards=n, t0=t0)


def _finish(state: DecodeState, eos_token_id: int, *, forwards: int, t0: float) -> GenerationOutput:
    completion = state.canvas.completion.clone()  # [B, C]
    c = completion.shape[1]
    is_eos = completion == eos_token_id
    has_eos = is_eos.any(dim=1)
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), c)  # [B]
    ar = torch.arange(c, device=completion.device)
    completion.masked_fill_(ar[None, :] > first_eos[:, None], eos_token_id)
    length = torch.where(has_eos, first_eos + 1, c)
    decode_step = torch.where(state.decode_step < 0, state.finish_step[:, None], state.decode_step)
    tokens = int(length.sum())  # the one sync at the end; also makes time_s honest on CUDA
    return GenerationOutput(completion, length, decode_step, forwards, tokens, time.perf_counter() - t0)


def forward_block_logits(
    policy: torch.nn.Module,  # DiffusionPolicy
    input_ids: torch.Tensor,  # [B, Lq]
    *,
    attention_mask: torch.Tensor,  # [B, 1, Lq, K] bool
    position_ids: torch.Tensor,  # [B, Lq]
    logits_from: int,  # first input index whose logits are kept
    offsets: torch.Tensor | None,  # [B] each row's block start among the kept logits; None = all at 0
    block_length: int,
    cache: object = None,
) -> torch.Tensor:
    """One policy forward -> [B, Lb, V] logits of each row's current block (aligned in place)."""
    out = policy(
        input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=cache is not None,
        logits_from=logits_from,
        # rows in lockstep need only the block's logits (at 8B shape: 0.25 GB instead of 2 GB)
        logits_to=logits_from + block_length if offsets is None else None,
    )
    logits = out.logits  # [B, Lk, V]
    if offsets is None:
        return logits[:, :block_length]
    lk, v = logits.shape[1], logits.shape[2]
    ar = torch.arange(block_length, device=logits.device)
    index = (offsets.clamp(min=0, max=lk - block_length)[:, None] + ar)[..., None].expand(-1, -1, v)
    return logits.gather(1, index)  # [B, Lb, V]

"""Per-row decoding progress on the device, updated in place by one step at a time.

Two ways to move through the blocks (they differ only with threshold decoding, where rows finish
a block after different numbers of steps; with a fixed number of steps every row finishes each
block after exactly steps_per_block steps, so both are the same):

- independent (``block_sync=False``, the exact paths): a row whose block is fully decoded moves
  on at once;
- block-synchronous (``block_sync=True``, the approximate prefix / dual caches, as Fast-dLLM's
  batched decoding): every working row stays in the same block; a row that has decoded its block
  *waits*, committing nothing, until the last working row has decoded it too, and then all move
  on together. The batch therefore enters each block once, and the cache is refreshed once per
  block (not whenever some row happens to start a block).

A waiting step is no step of the row: its step counter does not advance and its generator draws
nothing (the caller names the drawing rows, see ``progress``), so a row decodes exactly as it
would alone, with its cache refreshed at each of its own block starts. A row that is finished
(every position decoded, or an EOS with everything before it decoded) stops committing. In both
modes a row's trajectory depends only on its own canvas and its own generator, not on its batch
neighbours. ``decode_step[b, c]`` is the row's own step counter (0-based) at which completion
position c was committed; positions a finished row never decoded (after its EOS) get the row's
last step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from stabledrl.rollout.sampling.canvas import Canvas
from stabledrl.rollout.sampling.decode import choose_tokens, commit_mask, random_scores, release_commit


@dataclass
class DecodeState:
    canvas: Canvas
    block_length: int
    mask_token_id: int
    eos_token_id: int
    block_start: torch.Tensor  # [B] int64, completion index of each row's current block
    block_step: torch.Tensor  # [B] int64, steps taken inside the current block
    row_step: torch.Tensor  # [B] int64, decoding steps taken by the row
    done: torch.Tensor  # [B] bool
    finish_step: torch.Tensor  # [B] int64, row_step - 1 when the row finished
    entered: torch.Tensor  # [B] bool, the row moved to a new block at the last step
    decode_step: torch.Tensor  # [B, C] int64, -1 while undecoded
    block_sync: bool = False  # every working row in the same block (see the module docstring)

    @classmethod
    def start(
        cls, canvas: Canvas, block_length: int, mask_token_id: int, eos_token_id: int, block_sync: bool = False
    ) -> "DecodeState":
        b, c, dev = canvas.batch_size, canvas.gen_length, canvas.ids.device
        zeros = torch.zeros(b, dtype=torch.long, device=dev)
        return cls(
            canvas=canvas,
            block_length=block_length,
            mask_token_id=mask_token_id,
            eos_token_id=eos_token_id,
            block_start=zeros.clone(),
            block_step=zeros.clone(),
            row_step=zeros.clone(),
            done=torch.zeros(b, dtype=torch.bool, device=dev),
            finish_step=zeros.clone(),
            entered=torch.ones(b, dtype=torch.bool, device=dev),
            decode_step=torch.full((b, c), -1, dtype=torch.long, device=dev),
            block_sync=block_sync,
        )

    def block_positions(self) -> torch.Tensor:
        """[B, Lb] canvas indices of each row's current block (a finished row keeps its last block)."""
        start = self.block_start.clamp(max=self.canvas.gen_length - self.block_length)
        ar = torch.arange(self.block_length, device=start.device)
        return self.canvas.prompt_width + start[:, None] + ar  # [B, Lb]

    def step(
        self,
        logits: torch.Tensor,  # [B, Lb, V] logits of each row's current block
        generators: Sequence[torch.Generator],
        *,
        temperature: float,
        remasking: str,
        schedule: torch.Tensor,  # [steps_per_block] tokens per step (ignored with a threshold)
        threshold: Optional[float],
        noise_dtype: torch.dtype | str,
        stop_at_eos: bool,
        rows: Optional[Sequence[int]] = None,
        fused: bool = False,
        seeds: Optional[torch.Tensor] = None,
        confidence: str = "float32",
    ) -> None:
        """Commit this step's tokens into the canvas and advance every working row. ``rows``: the
        rows that may commit this step and so draw randomness (``progress()[4]``); None = all.
        ``fused``: the choice's arithmetic compiled (``choose_tokens``). ``seeds`` [B]: the
        counter-based draw keyed by each row's seed and its own step counter (``row_step``) instead of
        the generators (``sampler.noise_source: counter``)."""
        ids, p = self.canvas.ids, self.canvas.prompt_width
        pos = self.block_positions()  # [B, Lb]
        current = ids.gather(1, pos)  # [B, Lb]
        working = ~self.done
        masked = (current == self.mask_token_id) & working[:, None]  # [B, Lb]
        stepping = masked.any(dim=1)  # [B] working rows with something left in their block (not waiting)
        counter = None if seeds is None else (seeds, self.row_step)
        x0, conf = choose_tokens(
            logits, temperature, generators, mask_token_id=self.mask_token_id, noise_dtype=noise_dtype, rows=rows,
            fused=fused, counter=counter, confidence=confidence,
        )
        scores = (
            conf if remasking == "low_confidence"
            else random_scores(tuple(conf.shape), generators, conf.device, rows, counter=counter)
        )
        k = schedule[self.block_step.clamp(max=schedule.numel() - 1)]  # [B]
        if confidence == "float32" or threshold is not None:
            commit = commit_mask(scores, masked, k=k, threshold=threshold)  # [B, Lb]
        else:  # a release's topk over the row it builds: d1 [its prompt | canvas], the StableDRL release [canvas]
            prompt = self.canvas.valid[:, :p].sum(dim=1) if confidence == "d1" else torch.zeros_like(self.block_start)
            commit = release_commit(scores, masked, k, prompt + self.block_start, prompt + self.canvas.gen_length)

        ids.scatter_(1, pos, torch.where(commit, x0, current))
        old_steps = self.decode_step.gather(1, pos - p)
        self.decode_step.scatter_(1, pos - p, torch.where(commit, self.row_step[:, None], old_steps))

        self.row_step += stepping
        self.block_step += stepping
        unfinished = (masked & ~commit).any(dim=1)  # [B]
        if self.block_sync:  # the batch moves on when no working row has anything left in the block
            unfinished = unfinished.any().expand_as(unfinished)
        finished_block = working & ~unfinished  # [B]
        self.block_start += finished_block * self.block_length
        self.block_step.masked_fill_(finished_block, 0)
        self._update_done(working, stop_at_eos)
        self.entered = finished_block & ~self.done

    def _update_done(self, working: torch.Tensor, stop_at_eos: bool) -> None:
        newly = working & (self.block_start >= self.canvas.gen_length)
        if stop_at_eos:
            completion = self.canvas.completion  # [B, C]
            undecoded = completion == self.mask_token_id
            is_eos = completion == self.eos_token_id
            first_eos = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), completion.shape[1])  # [B]
            ar = torch.arange(completion.shape[1], device=completion.device)
            undecoded_before = (undecoded & (ar[None, :] < first_eos[:, None])).any(dim=1)
            newly |= working & (first_eos < completion.shape[1]) & ~undecoded_before
        self.finish_step = torch.where(newly, self.row_step - 1, self.finish_step)
        self.done |= newly

    def progress(self) -> tuple[int, int, bool, bool, list[int]]:
        """Host view (one device->host copy): (lowest and highest current block start among working
        rows, all rows done, some working row entered a new block at the last step, the rows that
        will step next: working and not waiting)."""
        c = self.canvas.gen_length
        working = ~self.done
        lo = torch.where(working, self.block_start, c).min()
        hi = torch.where(working, self.block_start, -1).max()
        undecoded = self.canvas.ids.gather(1, self.block_positions()) == self.mask_token_id  # [B, Lb]
        stepping = working & undecoded.any(dim=1)  # [B]
        summary = torch.cat([torch.stack([lo, hi, (~working).all().long(), self.entered.any().long()]),
                             stepping.long()]).tolist()
        rows = [i for i, s in enumerate(summary[4:]) if s]
        return int(summary[0]), int(summary[1]), bool(summary[2]), bool(summary[3]), rows

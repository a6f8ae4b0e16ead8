"""Per-row decoding progress on the device, updated in place by one step at a time.

Every row owns its current block: a row whose block is fully decoded moves on at once (with
threshold decoding rows finish blocks at different steps), and a row that is finished (every
position decoded, or an EOS with everything before it decoded) stops committing. A row's
trajectory depends only on its own canvas and its own generator, so its tokens do not depend on
its batch neighbours. ``decode_step[b, c]`` is the row's own step counter (0-based) at which
completion position c was committed; positions a finished row never decoded (after its EOS) get
the row's last step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from rollout.sampling.canvas import Canvas
from rollout.sampling.decode import choose_tokens, commit_mask, random_scores


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

    @classmethod
    def start(cls, canvas: Canvas, block_length: int, mask_token_id: int, eos_token_id: int) -> "DecodeState":
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
        noise_dtype: torch.dtype,
        stop_at_eos: bool,
    ) -> None:
        """Commit this step's tokens into the canvas and advance every working row."""
        ids, p = self.canvas.ids, self.canvas.prompt_width
        pos = self.block_positions()  # [B, Lb]
        current = ids.gather(1, pos)  # [B, Lb]
        working = ~self.done
        masked = (current == self.mask_token_id) & working[:, None]  # [B, Lb]
        x0, conf = choose_tokens(
            logits, temperature, generators, mask_token_id=self.mask_token_id, noise_dtype=noise_dtype
        )
        scores = conf if remasking == "low_confidence" else random_scores(tuple(conf.shape), generators, conf.device)
        k = schedule[self.block_step.clamp(max=schedule.numel() - 1)]  # [B]
        commit = commit_mask(scores, masked, k=k, threshold=threshold)  # [B, Lb]

        ids.scatter_(1, pos, torch.where(commit, x0, current))
        old_steps = self.decode_step.gather(1, pos - p)
        self.decode_step.scatter_(1, pos - p, torch.where(commit, self.row_step[:, None], old_steps))

        self.row_step += working
        self.block_step += working
        finished_block = working & ~(masked & ~commit).any(dim=1)  # [B]
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

    def progress(self) -> tuple[int, int, bool, bool]:
        """Host view (one device->host copy): (lowest and highest current block start among working
        rows, all rows done, some working row entered a new block at the last step)."""
        c = self.canvas.gen_length
        working = ~self.done
        lo = torch.where(working, self.block_start, c).min()
        hi = torch.where(working, self.block_start, -1).max()
        summary = torch.stack([lo, hi, (~working).all().long(), self.entered.any().long()]).tolist()
        return int(summary[0]), int(summary[1]), bool(summary[2]), bool(summary[3])

"""The data that crosses process boundaries: Sample, Group, the wire types between the driver and
the rollout workers (PromptRequest in, Episode out), and the padded SequenceBatch that
estimators, samplers and the learner all read.

Layout of a sequence batch (the one convention everything uses)::

    input_ids  [B, P + C]   = [ prompt, left-padded to P | completion, C = gen_length ]
    prompt_mask      [B, P] True on real prompt tokens (left padding is False)
    completion_mask  [B, C] True on completion tokens up to and including the first EOS

Positions are counted from each row's first real token, so a row's logits do not depend on how
much padding its batch needed (the estimators' determinism rests on this).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence, TypedDict

from jaxtyping import Bool, Float, Int

if TYPE_CHECKING:  # torch is imported where tensors are made, so the control plane's types load without it
    import torch

    from stabledrl.common.stats import Stat
    from stabledrl.common.tasks.base import Row


@dataclass
class Sample:
    """One completion of one prompt, as a rollout worker ships it."""

    sample_id: str  # f"{prompt_id}/{index}": exactly-once accounting key
    prompt_id: str
    index: int  # position within its group, 0..G-1
    prompt_ids: Int[torch.Tensor, " Lp"]  # no padding
    completion_ids: Int[torch.Tensor, " C"]  # the full canvas (EOS-filled after the first EOS)
    completion_length: int  # tokens up to and including the first EOS (C if none)
    reward: float
    reward_parts: dict[str, float] = field(default_factory=dict)
    policy_version: int = 0  # version of the weights that generated it (v_b)
    behaviour_logp: float = 0.0  # sequence-level estimate under the behaviour policy
    behaviour_token_logp: Optional[Float[torch.Tensor, " C"]] = None  # where the estimator defines it
    estimator: str = ""
    mask_seed: int = 0
    decode_step: Optional[Int[torch.Tensor, " C"]] = None  # step at which each token was unmasked
    answer: Optional[str] = None  # reference answer (for logging / evaluation)


@dataclass
class Group:
    """The G samples of one prompt; advantages are computed per group."""

    prompt_id: str
    samples: list[Sample]

    @property
    def rewards(self) -> torch.Tensor:
        import torch
        return torch.tensor([s.reward for s in self.samples], dtype=torch.float32)

    @property
    def policy_version(self) -> int:
        """Oldest version in the group (the one staleness is charged against)."""
        return min(s.policy_version for s in self.samples)


@dataclass(frozen=True)
class PromptRequest:
    uid: int  # position of the prompt in the run's stream: seeds and exactly-once accounting
    row: Row


@dataclass
class Episode:
    """One finished prompt: its group (None when every sample was dropped) and what it cost."""

    uid: int
    prompt_id: str
    group: Optional[Group]
    worker: int
    stats: dict[str, float] = field(default_factory=dict)  # this prompt's share of the request's cost


@dataclass
class EvalResult:
    """Accuracy of one evaluation; ``correct[i]`` counts prompt i's correct samples."""

    num_prompts: int
    samples_per_prompt: int
    pass_at: dict[int, float]  # k -> pass@k
    mean_correctness: float  # mean correctness value over every sample (partial credit counts)
    correct: list[int]
    completions: list[list[str]] = field(repr=False, default_factory=list)  # [N][n] decoded texts
    time_s: float = 0.0
    scoring_failures: int = 0  # checker calls that raised (a user reward); scored 0
    reward_calls: dict[str, float] = field(default_factory=dict)  # the scorer's calls by outcome (RewardStats)
    stopped: str = ""  # why scoring stopped early: the reward failed too often (task.reward.max_failed_fraction)

    @property
    def pass_at_1(self) -> float:
        return self.pass_at[1]

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        out = {f"{prefix}/pass@{k}": v for k, v in sorted(self.pass_at.items())}
        out[f"{prefix}/mean_correctness"] = self.mean_correctness
        out[f"{prefix}/time_s"] = self.time_s
        return out


@dataclass
class RolloutResult:
    """What one rollout request returns: its episodes, the reward calls it made by outcome (calls,
    ok, failed, ...: counted by the coordinator once per delivered request, also of a worker that
    dies later), and the worker's clock (common/actor_time.py)."""

    episodes: list[Episode]
    reward_calls: dict[str, float] = field(default_factory=dict)
    clock: dict[str, float] = field(default_factory=dict)


@dataclass
class StepResult:
    """What one learner rank returns for a step: its statistics, each with its reduction over the
    ranks (common/stats.py), and its clock (common/actor_time.py)."""

    metrics: dict[str, Stat]
    clock: dict[str, float] = field(default_factory=dict)


class WorkerInfo(TypedDict):
    """What a rollout worker reports once it is up (RolloutWorker.ready)."""

    worker: int
    device: str
    pid: int
    load_s: float
    node_id: str  # the Ray node it runs on (elasticity: a worker lost with its node)
    reward_sandbox: str  # what the reward sandbox confines, in words (RewardScorer.confinement)
    parameters: int
    version: int
    loaded_on: str  # where it loaded its policy: the host for a worker whose first push binds it on its GPU


@dataclass
class SequenceBatch:
    """Padded tensors for a batch of (prompt, completion) pairs; see the module docstring."""

    input_ids: Int[torch.Tensor, "B P+C"]
    prompt_mask: Bool[torch.Tensor, "B P"]
    completion_mask: Bool[torch.Tensor, "B C"]
    decode_step: Optional[Int[torch.Tensor, "B C"]] = None
    advantages: Optional[Float[torch.Tensor, " B"]] = None  # the SPG sandwich needs the sign

    @property
    def prompt_width(self) -> int:
        return self.prompt_mask.shape[1]

    @property
    def completion_width(self) -> int:
        return self.completion_mask.shape[1]

    @property
    def valid(self) -> torch.Tensor:
        """[B, P + C] True on every non-padding position (all completion positions are real)."""
        import torch
        ones = torch.ones_like(self.completion_mask, dtype=torch.bool)
        return torch.cat([self.prompt_mask, ones], dim=1)

    @property
    def position_ids(self) -> torch.Tensor:
        """[B, P + C] positions counted from each row's first real token."""
        return (self.valid.long().cumsum(dim=1) - 1).clamp(min=0)

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_width :]

    def to(self, device: torch.device | str) -> "SequenceBatch":
        def mv(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if t is None else t.to(device)

        return SequenceBatch(
            input_ids=self.input_ids.to(device),
            prompt_mask=self.prompt_mask.to(device),
            completion_mask=self.completion_mask.to(device),
            decode_step=mv(self.decode_step),
            advantages=mv(self.advantages),
        )

    def select(self, rows: Sequence[int] | torch.Tensor) -> "SequenceBatch":
        import torch
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.input_ids.device)

        def pick(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if t is None else t.index_select(0, idx.to(t.device))

        return SequenceBatch(
            input_ids=pick(self.input_ids),
            prompt_mask=pick(self.prompt_mask),
            completion_mask=pick(self.completion_mask),
            decode_step=pick(self.decode_step),
            advantages=pick(self.advantages),
        )


def left_pad(
    seqs: Sequence[torch.Tensor], pad_id: int, width: Optional[int] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad 1-D int tensors to ``width`` (default: the longest). Returns (ids [B, W], mask [B, W])."""
    import torch
    width = max((len(s) for s in seqs), default=0) if width is None else width
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        n = len(s)
        if n > width:
            raise ValueError(f"sequence {i} has {n} tokens, more than the width {width}")
        if n:
            ids[i, width - n :] = torch.as_tensor(s, dtype=torch.long)
            mask[i, width - n :] = True
    return ids, mask


def collate_samples(samples: Sequence[Sample], pad_id: int, advantages: Optional[torch.Tensor] = None) -> SequenceBatch:
    """Build the padded batch for ``samples`` (completion canvases must share one length)."""
    import torch
    prompt_ids, prompt_mask = left_pad([s.prompt_ids for s in samples], pad_id)
    widths = {len(s.completion_ids) for s in samples}
    if len(widths) != 1:
        raise ValueError(f"completions in one batch must share gen_length, got lengths {sorted(widths)}")
    completion = torch.stack([torch.as_tensor(s.completion_ids, dtype=torch.long) for s in samples])
    c = completion.shape[1]
    lengths = torch.tensor([s.completion_length for s in samples])
    completion_mask = torch.arange(c)[None, :] < lengths[:, None]
    decode_step = None
    if all(s.decode_step is not None for s in samples):
        decode_step = torch.stack([torch.as_tensor(s.decode_step, dtype=torch.long) for s in samples])
    return SequenceBatch(
        input_ids=torch.cat([prompt_ids, completion], dim=1),
        prompt_mask=prompt_mask,
        completion_mask=completion_mask,
        decode_step=decode_step,
        advantages=advantages,
    )

"""The rollout engine interface, and the native torch engine that implements it.

A rollout worker reaches its model only through ``RolloutEngine`` (the shape of AReaL's
inference engines): sample completions, score them with the behaviour estimator, take new
weights. The native engine runs the samplers of rollout/sampling and the estimators of
common/estimators on a ``DiffusionPolicy`` in this process. Another backend (an inference server
such as vLLM or SGLang) is a class that fills the same methods and keeps the same contract, built
where ``RolloutWorker.__init__`` (rollout/worker.py) builds ``TorchRolloutEngine`` today; nothing
else changes. vLLM serves none of LLaDA, Dream or SDAR/TraDo (among diffusion LMs only
DiffusionGemma), so no such backend ships and the project installs no vLLM. The contract:

- ``generate(prompts, seeds, cfg)``: prompts are 1-D int64 tensors without padding; ``seeds`` [B]
  seeds row b's randomness only, so a row's completion does not depend on its batch neighbours
  (needed for exactly-once replays and reproducible runs); output rows follow the prompt order;
  ``completion_ids`` is EOS-filled after the first EOS and ``decode_step`` [B, C] gives the step
  at which each token was committed (trajectory estimators read it; a backend that cannot record
  it must say so rather than invent one); the output carries the engine's ``policy_version``.
- ``score(batch, seeds, estimator)``: the behaviour log-likelihood estimate of each row under the
  weights that sampled it, with the row's mask seed (``stabledrl.common.estimators.estimate``'s contract):
  the learner redraws the same masks from the same seeds.
- ``update_weights(push, handle, partial=False)``: receive version ``handle.version`` through this
  worker's end of the weight transport (common/transport) and load it; the engine owns the
  version: after it returns, every later ``generate`` uses these weights and reports this version.
  ``partial``: the push may carry only some parameters (a LoRA learner sends the matrices it
  adapts, merged, or its adapters A and B, which the engine holds unmerged: ``hold_adapters``);
  the others keep the weights the engine holds.
- ``stage_weights(push, handle, partial, keep_order, timeout_s)``: receive a version into a second
  copy of the weights while ``generate`` runs on another thread (a broadcast push then never waits
  for the request in progress); the version held does not change. The ``update_weights`` of that
  version (or an older one) then swaps the staged copy in instead of receiving, in order with the
  requests. ``keep_order``: a staged version is never replaced before it is applied (in-order runs
  sample every request with exactly the version before it). ``discard_staged()`` forgets a staged
  copy (the transport was rebuilt: what it staged is not applied).
"""
from __future__ import annotations

import time
from typing import Optional, Protocol, Sequence, runtime_checkable

import torch

from stabledrl.common.config.estimator import EstimatorConfig
from stabledrl.common.config.learner import LoraConfig
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.estimators import LogLikelihood, estimate
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.models.lora import attach_adapters, target_paths
from stabledrl.common.transport.staging import StagedWeights
from stabledrl.common.transport.base import ParameterLoader, WeightHandle, WeightPush
from stabledrl.common.transport.views import ViewPush
from stabledrl.common.types import SequenceBatch
from stabledrl.rollout.sampling import GenerationOutput, StepGraphs, generate
from stabledrl.rollout.sampling.compiled import forget_compiled


@runtime_checkable
class RolloutEngine(Protocol):
    eos_token_id: int  # the token that ends a completion (the reward reads up to it)
    pad_token_id: int  # the left padding of collated batches
    vocab_size: int  # logits per position (what a behaviour-estimate call holds: rollout/workflow.py)

    @property
    def policy_version(self) -> int:
        """The version of the weights every later ``generate`` and ``score`` uses."""
        ...

    def generate(self, prompts: Sequence[torch.Tensor], seeds: torch.Tensor, cfg: SamplerConfig) -> GenerationOutput:
        """Sample ``cfg.gen_length`` tokens after each prompt; row b draws only from ``seeds[b]``."""
        ...

    def score(self, batch: SequenceBatch, seeds: torch.Tensor, estimator: EstimatorConfig) -> LogLikelihood:
        """The behaviour estimate of every row of ``batch`` under the current weights."""
        ...

    def update_weights(self, push: WeightPush, handle: WeightHandle, partial: bool = False) -> int:
        """Receive and load version ``handle.version`` (``partial``: only some parameters may come),
        or apply the staged copy of it; returns the version now held."""
        ...

    def stage_weights(self, push: WeightPush, handle: WeightHandle, partial: bool = False, *, keep_order: bool,
                      timeout_s: float) -> int:
        """Receive version ``handle.version`` beside the running request; returns the version staged."""
        ...

    def discard_staged(self) -> None:
        """Forget a staged copy that was not applied."""
        ...


def call_rows(order: list[int], lengths: Sequence[int], cfg: SamplerConfig) -> list[list[int]]:
    """The rows of each sampler call: ``order`` (rows by prompt length, shortest first) cut into runs
    of at most ``cfg.max_batch_size`` rows and, with ``cfg.max_tokens_per_forward``, of at most that
    many canvas tokens (rows x (the run's longest prompt + gen_length): the canvas is padded to it)."""
    calls: list[list[int]] = []
    current: list[int] = []
    bound = cfg.max_tokens_per_forward
    for i in order:
        width = lengths[i] + cfg.gen_length  # the longest so far: the rows come shortest first
        if current and (len(current) == cfg.max_batch_size or (bound and (len(current) + 1) * width > bound)):
            calls.append(current)
            current = []
        current.append(i)
    return calls + [current] if current else calls


class TorchRolloutEngine:
    """The native engine: the samplers of rollout/sampling on a local ``DiffusionPolicy``.

    Requests larger than ``cfg.max_batch_size`` rows (or ``cfg.max_tokens_per_forward`` tokens) run in
    micro-batches of prompts of similar length (less left padding); since rows are independent of
    their neighbours this changes no token.
    With ``cfg.cuda_graph`` the engine keeps the static cached steps (and their CUDA graphs) of the
    last ``graph_capacity`` shapes across requests (rollout/sampling/graphs.py), so a shape is
    captured once and replayed by every later request of that shape, across weight updates
    (``update_weights`` copies in place, where the graphs read; a push that points the parameters
    elsewhere, ``weights.ipc: view``, has the steps built again, rollout/sampling/graphs.py).

    ``device``: where the policy runs, when it was loaded elsewhere: a rollout worker whose pushes
    bind its parameters to views of its learner rank's on their GPU loads it on the host
    (rollout/worker.py), so that the GPU never holds a copy of its own. The first push that binds
    (``ViewPush``) leaves on the host only what it did not bind (buffers such as the rotary tables),
    which ``place`` then moves to ``device``; any other push, a stage, a generation or a score moves
    the whole policy there first, so nothing is received into, or runs on, the host by mistake.
    """

    def __init__(self, policy: DiffusionPolicy, policy_version: int = 0, graph_capacity: int = 2,
                 device: Optional[torch.device] = None) -> None:
        self.policy = policy.eval()
        self.device = policy.device if device is None else torch.device(device)
        self.on_host = policy.device != self.device  # waits for the first push, or ``place``
        self.eos_token_id, self.pad_token_id = policy.eos_token_id, policy.pad_token_id
        self.vocab_size = policy.vocab_size
        self._version = int(policy_version)
        self.staged: Optional[StagedWeights] = None  # a version received beside the running request
        self.graphs = StepGraphs(graph_capacity)

    @property
    def policy_version(self) -> int:
        return self._version

    def generate(self, prompts: Sequence[torch.Tensor], seeds: torch.Tensor, cfg: SamplerConfig) -> GenerationOutput:
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds; give one seed per row")
        if not prompts:
            raise ValueError("generate needs at least one prompt")
        self.place()
        t0 = time.perf_counter()
        seeds = torch.as_tensor(seeds, dtype=torch.long).cpu()
        by_length = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
        parts = []
        for rows in call_rows(by_length, [len(p) for p in prompts], cfg):
            part = generate(self.policy, [prompts[i] for i in rows], seeds[rows], cfg, self.graphs)
            if not part.forward_tokens:  # a sampler that does not count: every forward one of the whole canvas
                width = max(len(prompts[i]) for i in rows) + cfg.gen_length
                part.forward_rows = part.num_forwards * len(rows)
                part.forward_tokens = part.forward_rows * width
                part.forward_attended = part.forward_tokens * width
            parts.append(part)
        out = GenerationOutput.concat(parts)
        inverse = torch.empty(len(by_length), dtype=torch.long)
        inverse[torch.tensor(by_length)] = torch.arange(len(by_length))
        out = out.select(inverse)
        out.time_s = time.perf_counter() - t0
        out.policy_version = self._version
        return out

    @torch.no_grad()
    def score(self, batch: SequenceBatch, seeds: torch.Tensor, estimator: EstimatorConfig) -> LogLikelihood:
        self.place()
        return estimate(self.policy, batch, seeds, estimator)

    def update_weights(self, push: WeightPush, handle: WeightHandle, partial: bool = False) -> int:
        """Copy every received parameter into the policy in place (dtype and device converted);
        a parameter the policy does not have is an error, and so is one that never arrives unless
        the push is ``partial`` (then at least one must). A version ``stage_weights`` received
        (or a newer one) is applied from the staging copy instead; one already applied leaves the
        weights as they are. A policy on the host (``device``) is moved to its device first, or,
        where the push binds its parameters to views there, what the push did not bind right after."""
        if not isinstance(push, ViewPush):
            self.place()  # the push copies into the parameters where they lie
        if self.staged is not None and (self.staged.last or -1) >= handle.version:
            applied = self.staged.apply()  # None: a newer staged version was applied already
            self._version = self._version if applied is None else int(applied)
            return self._version
        loader = ParameterLoader(self.policy, partial=partial, device=self.device)
        version = push.receive(handle, loader)
        loader.finish()
        self.place()
        self._version = int(version)
        return self._version

    def stage_weights(self, push: WeightPush, handle: WeightHandle, partial: bool = False, *, keep_order: bool,
                      timeout_s: float) -> int:
        """Receive into the staging copy (common/transport/staging.py; allocated at the first push)."""
        self.place()  # the copy is allocated where the parameters lie
        if self.staged is None:
            self.staged = StagedWeights(self.policy)
        return self.staged.receive(push, handle, keep_order=keep_order, timeout_s=timeout_s, partial=partial)

    def hold_adapters(self, lora: Optional[LoraConfig]) -> None:
        """Pushes carry the LoRA adapters of ``lora``'s targets (``learner.lora.push: adapters``):
        each target Linear becomes a ``LoraLinear`` (common/models/lora.py) that computes what the
        learner's forward computes, with A and B as parameters the pushes load (zero until the
        first). Set up again with the same adapters, it keeps the ones it holds. None: pushes carry
        weights."""
        if lora is not None:
            model = self.policy.model
            if attach_adapters(model, target_paths(model, lora.resolved_targets()), lora.rank, lora.alpha / lora.rank):
                self.graphs = StepGraphs(self.graphs.capacity)  # steps captured before ran the modules replaced
                forget_compiled(self.policy)  # and so did the layers compiled before
                self.staged = None  # a staging copy holds the parameters it was made for

    def discard_staged(self) -> None:
        self.staged = None

    def place(self) -> None:
        """A policy still on the host: every parameter and buffer not yet on ``device`` moves there
        (``Module.to`` leaves a tensor already there as it is: a view a push bound stays the
        learner's); a no-op once the policy is there."""
        if self.on_host:
            self.policy.to(self.device)
            self.on_host = False

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.policy.parameters())

"""Admission: which prompts go out, under which uids, and what comes back into the group buffer.

It owns the prompt stream's position, the next request uid, the re-queued requests (a lost
worker's, sampled again under their uids with the same seeds), the staleness bound
(StalenessController) and the finished groups (GroupBuffer), and the run's reward-call counts.
``feed`` hands each active worker requests up to its queue depth while the bound allows;
``rollout_done`` takes a worker's episodes back. A piece of the scheduler (coordinator/decisions/scheduler.py);
no Ray, no clock.
"""
from __future__ import annotations

import math
from typing import Any, Container, Optional, Sequence

from stabledrl.common.config.job import JobConfig
from stabledrl.common.tasks import PromptStream, Row
from stabledrl.common.sandbox.scorer import RewardFailureRate, check_failure_rate
from stabledrl.common.types import Episode, PromptRequest
from stabledrl.coordinator.decisions import events as ev
from stabledrl.coordinator.decisions.buffer import GroupBuffer
from stabledrl.coordinator.decisions.fleet import Fleet
from stabledrl.coordinator.decisions.staleness import StalenessController


class Admission:
    def __init__(self, cfg: JobConfig, stream: PromptStream, fleet: Fleet) -> None:
        a, r = cfg.algorithm, cfg.rollout
        self.cfg, self.stream, self.fleet = cfg, stream, fleet
        self.staleness = StalenessController(a.max_staleness, a.groups_per_step)
        self.buffer = GroupBuffer(self.staleness)
        # requests queued per worker (in order: every admitted one at once)
        self.depth = math.ceil((a.max_staleness + 1) * a.groups_per_step / r.prompts_per_request) if a.in_order \
            else r.requests_per_worker
        self.next_uid = 0
        self.requeue: list[PromptRequest] = []  # admitted, not being sampled: a lost worker's requests, by uid
        self.reward_calls: dict[str, float] = {}

    def outstanding(self) -> list[int]:
        """Uids admitted and not back: being sampled or re-queued (exactly-once accounting)."""
        return sorted([r.uid for r in self.fleet.requests()] + [r.uid for r in self.requeue])

    def feed(self, held: Container[int] = ()) -> list[ev.Command]:
        """Requests for each active worker up to its queue depth while the admission bound allows
        (what it admits spread evenly over the workers that would take it: ``_request_size``);
        none for the workers in ``held`` (the receivers of a collective push still out)."""
        out: list[ev.Command] = []
        queued = {w.index: self.fleet.queued(w.index) for w in self.fleet.active() if w.index not in held}
        while queued:
            index = min(queued, key=queued.__getitem__)
            n = self._request_size(self.staleness.capacity(), sum(q == queued[index] for q in queued.values()))
            if queued[index] >= self.depth or n == 0 or not self.staleness.try_start(n):
                break
            requests = tuple(self._next_request() for _ in range(n))
            worker = self.fleet[index]
            uids = f"{requests[0].uid}..{requests[-1].uid}" if n > 1 else str(requests[0].uid)
            call = self.fleet.call("rollout", f"{worker.name} (prompts {uids})", worker, requests)
            out.append(ev.Generate(call, index, requests, self.cfg.rollout.request_timeout_s))
            queued[index] += 1
        return out

    def _request_size(self, capacity: int, takers: int) -> int:
        """Prompts of the next request: ``prompts_per_request``, or fewer when the bound admits fewer
        than the ``takers`` workers of this round would take (spread evenly: at η = 0 a step of 4
        groups goes to 2 workers as 2 + 2, not 4 + 0; rows are seeded by prompt, so the samples are
        the same)."""
        return min(self.cfg.rollout.prompts_per_request, -(-capacity // max(takers, 1)))

    def take_batch(self) -> Optional[list[Episode]]:
        """The next step's batch, or None (stale groups are dropped and counted on the way)."""
        before = (self.outstanding() or [None])[0] if self.cfg.algorithm.in_order else None
        return self.buffer.take(self.cfg.algorithm.groups_per_step, before=before)

    def rollout_done(self, event: ev.RolloutDone) -> list[ev.Command]:
        """Buffer a worker's episodes (a late answer of a replaced process is ignored); the job
        stops once too many reward calls failed, rather than train on zeros."""
        if self.fleet.take(event.call) is None:
            return []  # a call of a process already replaced: its requests were re-queued
        for outcome, n in event.reward_calls.items():
            key = f"reward_calls/{outcome}"
            self.reward_calls[key] = self.reward_calls.get(key, 0.0) + n
        for episode in event.episodes:
            self.buffer.add(episode)
        try:
            check_failure_rate(self.reward_calls, self.cfg.task)
        except RewardFailureRate as e:
            return [ev.Stop(str(e))]
        return []

    def lost(self, requests: Sequence[PromptRequest]) -> None:
        """A lost worker's requests: their places are released and they wait to be sampled again."""
        if requests:
            self.staleness.abort(len(requests))
            self.requeue = sorted(self.requeue + list(requests), key=lambda r: r.uid)

    def totals(self) -> dict[str, float]:
        """The reward calls of the whole run, counted from the delivered requests."""
        return {f"rollout/{k}": v for k, v in self.reward_calls.items()}

    def state_dict(self) -> dict[str, Any]:
        """Requests admitted and not back yet are saved with the re-queued ones: a resumed run
        samples them again (same seeds, the restored weights)."""
        requeue = sorted(self.requeue + self.fleet.requests(), key=lambda r: r.uid)
        return {"version": self.staleness.version, "stream": self.stream.state_dict(),
                "staleness": self.staleness.state_dict(), "next_uid": self.next_uid,
                "requeue": [(r.uid, r.row.prompt_id) for r in requeue], "reward_calls": dict(self.reward_calls)}

    def load_state_dict(self, state: dict[str, Any], rows: dict[str, Row], episodes: Sequence[Episode]) -> None:
        """KeyError / ValueError when the task's rows changed; OverflowError when the buffered
        groups exceed the staleness bound."""
        self.next_uid = int(state["next_uid"])
        self.stream.load_state_dict(state["stream"])
        self.requeue = [PromptRequest(int(uid), rows[pid]) for uid, pid in state["requeue"]]
        self.staleness.load_state_dict(state["staleness"])
        self.reward_calls = dict(state.get("reward_calls", {}))
        for episode in episodes:  # admitted and finished before the checkpoint
            if not self.staleness.try_start(1):
                raise OverflowError("more buffered groups than the staleness bound admits")
            self.buffer.add(episode)

    def _next_request(self) -> PromptRequest:
        if self.requeue:
            return self.requeue.pop(0)
        request = PromptRequest(self.next_uid, self.stream.next())
        self.next_uid += 1
        return request

"""Evaluations dealt over the rollout workers: ``eval.protocol``'s benchmark units, then the
held-out rows (coordinator/decisions/held_out.py). A part or unit whose worker was lost waits for another
worker; the held-out parts are merged once all are back. A piece of the scheduler
(coordinator/decisions/scheduler.py); no Ray.
"""
from __future__ import annotations

from typing import Optional, Sequence

from stabledrl.common.config.job import JobConfig
from stabledrl.common.sandbox.scorer import RewardFailureRate, check_failure_rate
from stabledrl.common.tasks import Row
from stabledrl.coordinator.decisions import events as ev
from stabledrl.coordinator.decisions.fleet import Fleet
from stabledrl.coordinator.decisions.held_out import DealtParts, HeldOutResult, HeldOutRun


class Evaluation:
    def __init__(self, cfg: JobConfig, held_out: Sequence[Row], fleet: Fleet) -> None:
        self.cfg, self.held_out, self.fleet = cfg, list(held_out), fleet
        self.held_out_run: Optional[HeldOutRun] = None
        self.protocol_run: Optional[DealtParts] = None  # eval.protocol's units at this step
        self.protocol_finishing = False  # FinishProtocol is out
        self.last_eval: Optional[HeldOutResult] = None
        self.evaluations: list[HeldOutResult] = []  # every held-out result of this process, in order
        self.reward_calls: dict[str, float] = {}  # the evaluations' reward calls by outcome, this process

    def lost_worker(self, index: int) -> None:
        """A lost worker's parts and units wait for another worker."""
        for run in (self.held_out_run, self.protocol_run):
            if run is not None:
                run.lost_worker(index)

    # ---- held-out rows ------------------------------------------------------------------------
    def evaluate(self, step: int, first: bool) -> tuple[list[ev.Command], bool]:
        """Deal the held-out parts to the active workers; (commands, whether the evaluation is over)."""
        if first:
            self.last_eval = None
            if not self.held_out:
                return [], True
            self.held_out_run = HeldOutRun.deal(self.held_out, max(1, len(self.fleet.active())), step)
        run, e, out = self.held_out_run, self.cfg.eval, []
        for part, index in run.assign([w.index for w in self.fleet.active()]):
            worker = self.fleet[index]
            call = self.fleet.call("eval", f"{worker.name} (held-out evaluation)", worker)
            run.running[call] = (part, index)
            out.append(ev.Evaluate(call, index, run.parts[part], e.samples_per_prompt, e.seed,
                                   e.sampler_for(self.cfg.sampler), self.cfg.rollout.request_timeout_s))
        if not run.finished:
            return out, False
        try:
            self.last_eval = result = run.merge()
        except ValueError as error:
            return out + [ev.Stop(str(error))], False
        self.held_out_run = None
        self.evaluations.append(result)
        reruns = f"; {run.reruns} part(s) run again after their worker was lost" if run.reruns else ""
        out += [ev.Record(step, result.metrics()),
                ev.Log(f"step {step}: held-out pass@1 {100 * result.pass_at_1:.1f}% on {result.num_prompts} prompts "
                       f"({e.describe(self.cfg.sampler)}, weights version {result.version}, {result.time_s:.1f} s"
                       f"{reruns})")]
        return out, True

    def eval_done(self, event: ev.EvalDone) -> list[ev.Command]:
        """Take a part's result; the job stops once the evaluations' reward calls failed too often
        (a part that stopped scoring early says so), as it does for its rollouts' calls."""
        if self.fleet.take(event.call) is None or self.held_out_run is None:
            return []
        part, _ = self.held_out_run.running.pop(event.call)
        self.held_out_run.done[part] = (event.version, event.result)
        for outcome, n in event.result.reward_calls.items():
            key = f"reward_calls/{outcome}"
            self.reward_calls[key] = self.reward_calls.get(key, 0.0) + n
        try:
            if event.result.stopped:
                raise RewardFailureRate(event.result.stopped)
            check_failure_rate(self.reward_calls, self.cfg.task)
        except RewardFailureRate as e:
            return [ev.Stop(f"held-out evaluation at step {self.held_out_run.step}: {e}")]
        return []

    # ---- the protocol's benchmarks ------------------------------------------------------------
    def protocol(self, step: int, first: bool) -> tuple[list[ev.Command], bool]:
        """``eval.protocol`` (a published benchmark table) on the rollout workers: the runtime opens
        the step's results and says how many units are left (ProtocolStarted); units are dealt like
        held-out parts; once all are graded the runtime writes the table (ProtocolDone, which ends
        it: ``protocol_done``). Returns (commands, over already: no protocol set)."""
        if first:
            self.protocol_run, self.protocol_finishing = None, False
            if self.cfg.eval.protocol is None:
                return [], True
            return [ev.StartProtocol(step)], False
        run, out = self.protocol_run, []
        if run is None:
            return [], False  # ProtocolStarted not handled yet
        for unit, index in run.assign([w.index for w in self.fleet.active()]):
            worker = self.fleet[index]
            call = self.fleet.call("complete", f"{worker.name} (protocol unit {unit})", worker)
            run.running[call] = (unit, index)
            out.append(ev.Complete(call, index, unit, self.cfg.rollout.request_timeout_s))
        if run.finished and not self.protocol_finishing:
            self.protocol_finishing = True
            out.append(ev.FinishProtocol(step))
        return out, False

    def protocol_started(self, event: ev.ProtocolStarted) -> list[ev.Command]:
        self.protocol_run = DealtParts.of(event.units)
        return [ev.Log(event.note)] if event.note else []

    def unit_done(self, event: ev.UnitDone) -> None:
        if self.fleet.take(event.call) is None or self.protocol_run is None:
            return
        unit, _ = self.protocol_run.running.pop(event.call)
        self.protocol_run.done[unit] = True

    def protocol_done(self, step: int, event: ev.ProtocolDone) -> list[ev.Command]:
        reruns = self.protocol_run.reruns if self.protocol_run is not None else 0
        self.protocol_run = None
        return [ev.Record(step, event.metrics),
                ev.Log(event.line + (f"; {reruns} unit(s) run again after their worker was lost" if reruns else ""))]

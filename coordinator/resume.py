"""A run's checkpoints seen from the driver: what goes into one, and how a run continues from it.

Mixed into Driver. ``save_checkpoint`` first lets the admitted rollouts land (their groups are
saved and trained after a resume at the staleness they would have had), then saves the learner
(DeepSpeed, collective), the buffered groups and the client state (coordinator/checkpoint.py).
``restore`` runs after ``checkpoint.verify`` accepted the files and the config, and after the actors
started: it checks the model's parameter shapes, loads every learner rank, and restores the
step, the data cursor, the staleness counters, the re-queued requests and the buffered groups,
then pushes the restored weights to every worker.
"""
from __future__ import annotations

import time
from typing import Any, Optional

import yaml

from coordinator import checkpoint
from coordinator.actors import wait
from rollout.workflow import PromptRequest


class Checkpoints:
    def config_json(self) -> dict[str, Any]:
        run = self.job_cfg.run.model_copy(update={"resume_from": None})
        return self.job_cfg.model_copy(update={"run": run}).model_dump(mode="json")

    def write_config(self) -> None:
        """output_dir/config.yaml: the resolved config, which `stabledrl train --resume` reads back."""
        directory = self.cfg.run.output_dir
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.yaml").write_text(yaml.safe_dump(self.config_json(), sort_keys=False))

    def client_state(self) -> dict[str, Any]:
        """The coordinator's part of a checkpoint. Requests admitted and not back yet are saved with
        the re-queued ones: a resumed run samples them again (same seeds, the restored weights)."""
        assert self.training is None, "a checkpoint is taken between steps"
        requeue = sorted(self.requeue + self.inflight.requests(), key=lambda r: r.uid)
        return {"step": self.step, "version": self.staleness.version, "stream": self.stream.state_dict(),
                "staleness": self.staleness.state_dict(), "next_uid": self.next_uid,
                "requeue": [(r.uid, r.row.prompt_id) for r in requeue], "counts": dict(self.counts),
                "reward_calls": dict(self.reward_calls)}

    def save_checkpoint(self) -> None:
        """In-order runs wait for the admitted rollouts first: their groups go into the checkpoint,
        so the resumed run trains on the same samples at the same staleness as an uninterrupted one.
        Other runs (which no resume replays exactly) save them as requests to sample again and go
        on at once: the workers keep generating, and the next step finds its batch."""
        if self.cfg.algorithm.in_order:
            self.drain()
        if self.shapes is None:
            self.shapes = wait([self.actors.learners[0].parameter_shapes.remote()], self.cfg.cluster.start_timeout_s,
                               "learner rank 0 (parameter shapes)")[0]
        state = {**self.client_state(), "config": self.config_json(), "parameter_shapes": self.shapes}
        episodes = [self.buffer.groups[uid] for uid in sorted(self.buffer.groups)]
        args = (self.actors, self.cfg.run.output_dir, self.step, state, episodes, self.cfg.cluster.start_timeout_s)
        if self.cfg.run.async_checkpoint:
            self.finish_checkpoint()  # one save at a time
            self.pending_save = checkpoint.begin_save(*args)
            self.log(f"checkpoint: {self.pending_save.path} (written in the background)")
        else:
            self.log(f"checkpoint: {checkpoint.save(*args)}")

    def poll_checkpoint(self) -> None:
        """Complete a background save whose files are all durable (never blocks)."""
        if self.pending_save is not None and self.pending_save.poll():
            self.log(f"checkpoint: {self.pending_save.path} complete "
                     f"({time.monotonic() - self.pending_save.started:.1f} s after it started)")
            self.pending_save = None

    def finish_checkpoint(self, timeout_s: Optional[float] = None) -> None:
        """Wait for a background save's files (at most ``timeout_s``, default cluster.start_timeout_s),
        then complete it; a save still unwritten after that stays incomplete, and said so."""
        save, self.pending_save = self.pending_save, None
        if save is None:
            return
        if save.wait(self.cfg.cluster.start_timeout_s if timeout_s is None else timeout_s):
            self.log(f"checkpoint: {save.path} complete ({time.monotonic() - save.started:.1f} s after it started)")
        else:
            self.log(f"checkpoint: {save.path} was not written in time; it stays incomplete (a resume takes the one "
                     "before)")

    def restore(self, resume: checkpoint.Resume) -> None:
        timeout = self.cfg.cluster.start_timeout_s
        self.shapes = wait([self.actors.learners[0].parameter_shapes.remote()], timeout,
                           "learner rank 0 (parameter shapes)")[0]
        checkpoint.check_shapes(resume.state["parameter_shapes"], self.shapes, resume.directory / resume.tag)
        state = checkpoint.load(self.actors, resume, timeout)
        self.step, self.next_uid = int(state["step"]), int(state["next_uid"])
        try:
            self.stream.load_state_dict(state["stream"])
            self.requeue = [PromptRequest(int(uid), self.rows[pid]) for uid, pid in state["requeue"]]
        except (ValueError, KeyError) as e:
            raise checkpoint.CheckpointError(f"{resume.directory / resume.tag}: the task's rows changed ({e})") from None
        self.staleness.load_state_dict(state["staleness"])
        self.counts.update(state.get("counts", {}))
        self.reward_calls = dict(state.get("reward_calls", {}))
        for episode in resume.episodes:  # admitted and finished before the checkpoint
            if not self.staleness.try_start(1):
                raise checkpoint.CheckpointError(f"{resume.directory / resume.tag}: more buffered groups than the "
                                                 "staleness bound admits")
            self.buffer.add(episode)
        self.push_weights(self.staleness.version)
        self.drain()
        self.log(f"resumed at step {self.step} (weights version {self.staleness.version}, {len(resume.episodes)} "
                 f"buffered groups) from {resume.directory / resume.tag}")

    def export(self) -> None:
        directory = self.cfg.run.output_dir / "final_model"
        wait(self.actors.call_learners("export", str(directory)), self.cfg.cluster.start_timeout_s,
             [f"learner rank {r} (export)" for r in range(len(self.actors.learners))])
        self.log(f"policy exported: {directory} (model.path={directory} loads it)")


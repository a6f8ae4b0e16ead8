"""The peer benchmark's measurements, one format for every training loop it times.

A peer's process (the harness around a release's own code, or the test's fake peer) appends
events to ``<events>/rank<r>.jsonl`` through ``Recorder``; ``peer_figures`` turns every rank's
events into the figures of the table; ``project_figures`` turns a ``stabledrl train`` record of the
system benchmark (bench_system.py) into the same figures; ``compare`` gives the ratios project /
peer and ``markdown`` the table.

Events (one JSON object a line, ``t`` the wall clock, seconds since the epoch):

    {"event": "start", "t", "launched_at"}          the harness is running (launched_at: the driver's clock)
    {"event": "generate", "t0", "t1", "rows", "tokens"}   one call of the release's sampler
    {"event": "step", "t", "step", "new_samples", "peak_gib", "optimizer_s", "score_s", "forwards"}
        one optimizer step ended; new_samples: rows generated since the step before (the RL samples
        this step starts training); optimizer_s: the optimizer's step (settled before and after);
        score_s: seconds of forwards without a gradient outside the sampler since the step before
        (old policy, reference); forwards: every forward the release ran since the step before, per
        phase (generate: inside its sampler; score: no gradient; train), each {calls, rows, tokens =
        rows x T, tokens_sq = rows x T^2} (the roofline's FLOPs: roofline.py)

The figures, alike for every loop (``n_gpus``: every GPU the loop holds):

- samples_per_s_per_gpu: RL samples (prompt x completion rows, each counted once however many
  inner iterations train on it) that finished training in the timed window, / window / n_gpus.
  The window runs from the end of step ``skip`` to the last step, so it holds whole rounds
  (a generation and its inner iterations);
- rollout_tokens_per_s_per_gpu: completion tokens (rows x gen_length) / the seconds of the
  sampler's calls, per GPU that generates;
- learner_s_per_sample: GPU-seconds not spent in the sampler (training, the reference
  likelihood, the optimizer, waiting) in the window, over the samples trained in it;
- first_step_s: launch to the end of the first optimizer step (load, sharding, the first rollout);
- peak_memory_gib: the largest allocator peak of any GPU.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Optional

FIGURES = ("samples_per_s_per_gpu", "rollout_tokens_per_s_per_gpu", "learner_s_per_sample", "first_step_s",
           "peak_memory_gib")
# a larger figure is better for these two; smaller for the rest (the ratio is then peer / project)
HIGHER_IS_BETTER = {"samples_per_s_per_gpu", "rollout_tokens_per_s_per_gpu"}


class Recorder:
    """Appends one rank's events (module docstring)."""

    def __init__(self, directory: str | os.PathLike, rank: int) -> None:
        self.path = Path(directory) / f"rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.new_samples = 0
        self.steps = 0
        self.generating = False  # inside the release's sampler (its forwards are generation's)
        self.forwards: dict[str, dict[str, float]] = {}
        self.optimizer_s = self.score_s = 0.0
        self.generate_s = 0.0  # the sampler's seconds over the run (a scoring wrapper subtracts them)
        launched = os.environ.get("PEER_LAUNCHED_AT")
        self.write(event="start", t=time.time(), launched_at=float(launched) if launched else None)

    def write(self, **event: Any) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(event) + "\n")

    def generated(self, t0: float, t1: float, rows: int, tokens: int) -> None:
        self.new_samples += rows
        self.generate_s += t1 - t0
        self.write(event="generate", t0=t0, t1=t1, rows=rows, tokens=tokens)

    def stepped(self, peak_gib: Optional[float]) -> None:
        self.steps += 1
        self.write(event="step", t=time.time(), step=self.steps, new_samples=self.new_samples, peak_gib=peak_gib,
                   optimizer_s=self.optimizer_s, score_s=self.score_s, forwards=self.forwards)
        self.new_samples, self.optimizer_s, self.score_s, self.forwards = 0, 0.0, 0.0, {}

    def forward(self, input_ids: Any, times: int = 1) -> None:
        """``times`` forwards of the release's model on ``input_ids`` [rows, T] (a tensor or its shape;
        the phase from where it runs)."""
        import torch

        shape = getattr(input_ids, "shape", input_ids)
        rows, width = int(shape[0]), int(shape[-1])
        phase = "generate" if self.generating else "train" if torch.is_grad_enabled() else "score"
        c = self.forwards.setdefault(phase, {"calls": 0, "rows": 0, "tokens": 0, "tokens_sq": 0})
        c["calls"] += times
        c["rows"] += times * rows
        c["tokens"] += times * rows * width
        c["tokens_sq"] += times * rows * width * width

    def scored(self, seconds: float) -> None:
        self.score_s += seconds

    def record_optimizer_steps(self, device: Any) -> None:
        """A "step" event after every optimizer step of this process (torch's global post hook: the
        release's own loop stays untouched), with the allocator's peak on ``device``."""
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from torch.optim.optimizer import register_optimizer_step_pre_hook

        started: list[float] = []

        def before_step(optimizer, args, kwargs) -> None:
            sync(device)
            started[:] = [time.perf_counter()]

        def after_step(optimizer, args, kwargs) -> None:
            sync(device)
            if started:
                self.optimizer_s += time.perf_counter() - started[0]
            self.stepped(torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None)

        register_optimizer_step_pre_hook(before_step)
        register_optimizer_step_post_hook(after_step)


def sync(device: Any) -> None:
    """Wait for ``device``'s queued work (CUDA; nothing elsewhere), so that a host clock times it."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def checkpoint_view(source: Path, view: Path, rank: int, edit: Optional[Any] = None) -> Path:
    """``source`` as a release's transformers 4.x reads it, in ``<view>-rank<rank>``: links to every
    file, and the tokenizer's config naming the fast tokenizer class 4.x has (the checkpoint's names
    5.x's backend class). ``edit(name, config)`` may change any JSON file's dict further (it is then
    written, not linked)."""
    view = view.with_name(f"{view.name}-rank{rank}")
    view.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        target = view / path.name
        config = json.loads(path.read_text()) if path.suffix == ".json" else None
        if config is not None and path.name == "tokenizer_config.json":
            config["tokenizer_class"] = "PreTrainedTokenizerFast"
            config.pop("backend", None)
        edited = config is not None and edit is not None and bool(edit(path.name, config))
        if edited or (config is not None and path.name == "tokenizer_config.json"):
            target.unlink(missing_ok=True)
            target.write_text(json.dumps(config, indent=2))
        elif not target.exists():
            target.symlink_to(path.resolve())
    return view


def read_events(directory: str | os.PathLike) -> dict[int, list[dict]]:
    out = {}
    for path in sorted(Path(directory).glob("rank*.jsonl")):
        rows = []
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a kill
        out[int(path.stem[4:])] = rows
    return out


def peer_figures(events: dict[int, list[dict]], *, n_gpus: int, skip: int) -> dict[str, Any]:
    """The figures (module docstring) from every rank's events; ``skip``: steps before the window."""
    if not events:
        return {"steps": 0, "problem": "no events"}
    steps = {r: [e for e in ev if e["event"] == "step"] for r, ev in events.items()}
    n = min(len(s) for s in steps.values())
    out: dict[str, Any] = {"steps": n, "ranks": len(events), "n_gpus": n_gpus, "skip": skip}
    if n <= skip:
        out["problem"] = f"{n} steps, none after the {skip} skipped"
        return out
    # each rank's own window: the end of its step ``skip`` to the end of its last step (ranks start
    # apart by a process launch; their collectives keep them together after)
    windows, samples, gens = {}, 0, []
    score_s = optimizer_s = 0.0
    forwards: dict[str, dict[str, float]] = {}
    for r, ev in events.items():
        start = steps[r][skip - 1]["t"] if skip else min(e["t"] for e in ev if e["event"] == "start")
        end = steps[r][n - 1]["t"]
        windows[r] = end - start
        samples += sum(e["new_samples"] for e in steps[r][skip:n])
        gens += [e for e in ev if e["event"] == "generate" and start <= e["t0"] and e["t1"] <= end]
        for e in steps[r][skip:n]:  # what ran since the step before: inside the window
            score_s += e.get("score_s", 0.0)
            optimizer_s += e.get("optimizer_s", 0.0)
            for phase, c in (e.get("forwards") or {}).items():
                into = forwards.setdefault(phase, {})
                for k, v in c.items():
                    into[k] = into.get(k, 0) + v
    gpu_s = sum(windows.values()) * n_gpus / len(events)  # GPU-seconds of the window (one rank a GPU)
    window = max(windows.values())
    gen_s = sum(e["t1"] - e["t0"] for e in gens)
    tokens = sum(e["tokens"] for e in gens)
    generating = sum(1 for ev in events.values() if any(e["event"] == "generate" for e in ev)) or 1
    first = events[min(events)]
    launched = next((e.get("launched_at") for e in first if e["event"] == "start"), None)
    first_step = steps[min(events)][0]["t"]
    peaks = [e["peak_gib"] for s in steps.values() for e in s if e.get("peak_gib") is not None]
    out.update(
        window_s=window, gpu_s=gpu_s, samples=samples, generate_s=gen_s, tokens=tokens,
        samples_per_s_per_gpu=samples / gpu_s if gpu_s > 0 else None,
        # each generating rank's sampler seconds are its own GPU's: tokens / (seconds summed over ranks)
        rollout_tokens_per_s_per_gpu=tokens / gen_s if gen_s else None, generating_gpus=generating,
        learner_s_per_sample=(gpu_s - gen_s) / samples if samples else None,
        first_step_s=first_step - launched if launched is not None else None,
        peak_memory_gib=max(peaks) if peaks else None,
        # the roofline's inputs (roofline.py): GPU-seconds by activity (every rank's, summed; what the
        # events do not cover is the learner's, waits included) and every forward the release ran
        seconds={"generate": gen_s, "score": score_s, "optimizer": optimizer_s,
                 "learner": max(0.0, gpu_s - gen_s - score_s - optimizer_s)},
        forwards=forwards,
    )
    return out


def project_figures(record: dict, *, n_gpus: int) -> dict[str, Any]:
    """The same figures from bench_system.py's ``job`` part (its report's figures over the steps
    after its ``--skip``): samples / step wall / n_gpus; the rollout workers' tokens per second
    generating; the learner ranks' median train seconds x ranks / samples per step; the command's
    start to the first step; the largest peak of a learner rank or a rollout worker."""
    f = record.get("figures") or {}
    if not f.get("steps"):
        return {"steps": 0, "problem": "no step finished"}
    timed = [s for s in f["per_step"] if s["step"] in set(f["timed_steps"])]
    samples = sum(s.get("learner/samples") or 0 for s in timed)
    ranks = len(f.get("learner_peak_gpu_gb") or {}) or sum(1 for a in f["actors"] if a.startswith("learner"))
    workers = sum(1 for a in f["actors"] if a.startswith("rollout"))
    per_step_samples = samples / len(timed) if timed else 0
    peaks = list((f.get("learner_peak_gpu_gb") or {}).values())
    peaks += [a["peak_memory_gib"] for a in f["actors"].values() if a.get("peak_memory_gib")]
    tokens_per_s = f.get("rollout_tokens_per_s_generating")
    return {
        "steps": f["steps"],
        "timed_steps": f.get("timed_steps"),
        "ranks": ranks,
        "workers": workers,
        "n_gpus": n_gpus,
        "samples": samples,
        "samples_per_s_per_gpu": f["samples_per_s"] / n_gpus if f.get("samples_per_s") else None,
        # the report's rate is every worker's tokens over every worker's generating seconds
        "rollout_tokens_per_s_per_gpu": tokens_per_s,
        "learner_s_per_sample": f["train_s_median"] * ranks / per_step_samples if per_step_samples else None,
        "first_step_s": f.get("first_step_s"),
        "peak_memory_gib": max(peaks) if peaks else None,
        "learner_mfu": f.get("learner_mfu"),
        "compiles_timed": f.get("compiles_timed"),  # graphs compiled in the timed steps, rollout and learner
        # every step, the warm-up's too: where the time went and which steps compiled
        "per_step": [{"step": s["step"], "step_s": s.get("time/step"), "train_s": s.get("time/train"),
                      "generate_s": s.get("time/generate"),
                      "compiles": {side: s.get(f"{side}/compiles") for side in ("rollout", "learner")}}
                     for s in f["per_step"]],
    }


def compare(project: dict, peer: dict) -> dict[str, Optional[float]]:
    """project / peer for the rates, peer / project for the times and memory: > 1 = the project is better."""
    out: dict[str, Optional[float]] = {}
    for k in FIGURES:
        a, b = project.get(k), peer.get(k)
        if not a or not b:
            out[k] = None
        else:
            out[k] = a / b if k in HIGHER_IS_BETTER else b / a
    return out


def verdict(ratio: Optional[float], target: float) -> str:
    if ratio is None:
        return "not measured"
    return "met" if ratio >= target else "short"

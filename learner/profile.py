"""One learner step under torch.profiler, when asked from the environment (diagnostics):

    STABLEDRL_PROFILE_STEP=3 STABLEDRL_PROFILE_DIR=/tmp/prof stabledrl train ...

makes learner rank 0 profile a short window of its 3rd step and write ``learner_rank0_step3.json``
there: the window's wall time, the device's busy time (the sum of kernel times), kernels and host
ops, the top kernels by device time and the top host ops by their own CPU time. Wall well above
device busy means the step waits on the host (Python, launches, ZeRO hooks) or on communication
that does not overlap compute. Ray actors inherit the variables of the job's process on a local
instance (set them on every node of a cluster).

The window is the step's first ``STABLEDRL_PROFILE_FORWARDS`` forwards of the policy (default 1:
the first micro-batch's forward and backward, up to the next forward), not the whole step: the
profiler slows what it records several-fold (a whole 8B staircase step took 154 s under it against
17 s plain), and the rest of the step runs at full speed. ``STABLEDRL_PROFILE_FORWARDS=0`` records
the whole step.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Iterator, Optional

import torch


@contextlib.contextmanager
def profiled_step(step: int, rank: int, module: Optional[torch.nn.Module] = None) -> Iterator[None]:
    """Profile the window of ``step`` on ``rank`` 0 (see the module docstring); ``module`` is the
    policy whose forwards bound the window (None: the whole step)."""
    wanted = os.environ.get("STABLEDRL_PROFILE_STEP")
    directory = os.environ.get("STABLEDRL_PROFILE_DIR")
    if rank != 0 or not directory or wanted != str(step):
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    forwards = int(os.environ.get("STABLEDRL_PROFILE_FORWARDS", "1"))
    cuda = torch.cuda.is_available()
    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
    state = {"forwards": 0, "wall": None, "t0": 0.0}

    def stop() -> None:
        if state["wall"] is None:
            if cuda:
                torch.cuda.synchronize()
            state["wall"] = time.perf_counter() - state["t0"]
            prof.stop()

    def before_forward(*_) -> None:
        if state["wall"] is None and forwards > 0 and state["forwards"] == forwards:
            stop()  # the window's forwards and their backwards are done: the rest runs unprofiled
        state["forwards"] += 1

    handle = module.register_forward_pre_hook(before_forward) if module is not None else None
    if cuda:
        torch.cuda.synchronize()
    prof.start()
    state["t0"] = time.perf_counter()
    try:
        yield
    finally:
        stop()
        if handle is not None:
            handle.remove()
    whole = module is None or forwards <= 0 or state["forwards"] <= forwards
    Path(directory).mkdir(parents=True, exist_ok=True)
    summary = {"step": step, "rank": rank, "window": "whole step" if whole else f"first {forwards} forward(s)",
               "forwards_profiled": min(state["forwards"], forwards) if forwards > 0 else state["forwards"],
               "forwards_in_step": state["forwards"], **summarise(prof.key_averages(), state["wall"])}
    (Path(directory) / f"learner_rank{rank}_step{step}.json").write_text(json.dumps(summary, indent=1))


def summarise(events, wall_s: float, top: int = 20) -> dict:
    def device_us(e) -> float:
        return float(getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0) or 0)

    kernels = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA") and device_us(e) > 0]
    host = [e for e in events if e.key.startswith("aten::")]
    busy_us = sum(device_us(e) for e in kernels)
    return {
        "wall_s": wall_s,
        "device_busy_s": busy_us / 1e6 if kernels else None,
        "device_busy_fraction": busy_us / 1e6 / wall_s if kernels else None,
        "kernels": sum(e.count for e in kernels),
        "host_aten_ops": sum(e.count for e in host),
        "top_kernels": [
            {"name": e.key[:120], "calls": e.count, "s": device_us(e) / 1e6, "share_of_busy": device_us(e) / busy_us}
            for e in sorted(kernels, key=device_us, reverse=True)[:top]
        ],
        "top_host_ops": [
            {"name": e.key[:120], "calls": e.count, "self_cpu_s": e.self_cpu_time_total / 1e6}
            for e in sorted(host, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
        ],
    }

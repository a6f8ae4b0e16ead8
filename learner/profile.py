"""One learner step under torch.profiler, when asked from the environment (diagnostics):

    STABLEDRL_PROFILE_STEP=3 STABLEDRL_PROFILE_DIR=/tmp/prof stabledrl train ...

makes learner rank 0 profile its 3rd step and write ``learner_rank0_step3.json`` there: the
step's wall time, the device's busy time (the sum of kernel times), kernels and host ops per
step, the top kernels by device time and the top host ops by their own CPU time. Wall well
above device busy means the step waits on the host (Python, launches, ZeRO hooks) or on
communication that does not overlap compute. Ray actors inherit the variables of the job's
process on a local instance (set them on every node of a cluster).
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Iterator

import torch


@contextlib.contextmanager
def profiled_step(step: int, rank: int) -> Iterator[None]:
    wanted = os.environ.get("STABLEDRL_PROFILE_STEP")
    directory = os.environ.get("STABLEDRL_PROFILE_DIR")
    if rank != 0 or not directory or wanted != str(step):
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        yield
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    Path(directory).mkdir(parents=True, exist_ok=True)
    summary = {"step": step, "rank": rank, **summarise(prof.key_averages(), wall)}
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
        "top_kernels": [{"name": e.key[:120], "calls": e.count, "s": device_us(e) / 1e6,
                         "share_of_busy": device_us(e) / busy_us} for e in sorted(kernels, key=device_us, reverse=True)[:top]],
        "top_host_ops": [{"name": e.key[:120], "calls": e.count, "self_cpu_s": e.self_cpu_time_total / 1e6}
                         for e in sorted(host, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]],
    }

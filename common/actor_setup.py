"""What every actor process sets up first: threads, the device, quiet third-party logs."""
from __future__ import annotations

import logging
import os
import warnings

import torch


def setup_actor_process() -> torch.device:
    """cuda:0 where Ray gave the actor a GPU (it sees only that one), else the CPU with one torch
    thread, so that several actors share a few cores without oversubscribing them. Silences the
    deprecation chatter of torch.distributed, transformers and DeepSpeed in the job's output."""
    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed otherwise warns while it probes for one
        torch.set_num_threads(1)
        device = torch.device("cpu")
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()  # "Loading weights" bars, one per actor
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    return device


def settle_gpu(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a no-op on a CPU), so that a timer around it
    measures the GPU's time and not only the launches."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hand_back_gpu_memory(shared: bool) -> None:
    """An actor that shares its GPU with another process (``cluster.colocate``) returns the blocks
    its allocator caches after each turn, so the other one can use them; a no-op otherwise."""
    if shared and torch.cuda.is_available():
        torch.cuda.empty_cache()

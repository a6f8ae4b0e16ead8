"""Ray on this machine's GPUs for one GPU test module's fixture (the GPU tests' counterpart of
tests/e2e/harness.py ``local_ray``): skipped where there are fewer GPUs than the module needs."""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from types import ModuleType
from typing import Iterator

import pytest


@contextmanager
def local_gpu_ray(needs: int, *by_value: ModuleType) -> Iterator[int]:
    """Ray over every GPU here, its log forwarded, yielding the number of GPUs; skips the module's
    tests where there are fewer than ``needs``. ``by_value``: the modules whose actors' classes the
    workers cannot import (the test module, tests/e2e/harness.py), pickled by value."""
    import ray
    import torch

    if torch.cuda.device_count() < needs:
        pytest.skip("needs CUDA" if needs == 1 else f"needs {needs} GPUs")
    sys.path.insert(0, os.getcwd())
    for module in by_value:
        ray.cloudpickle.register_pickle_by_value(module)
    ray.init(address="local", num_gpus=torch.cuda.device_count(), include_dashboard=False, log_to_driver=True)
    try:
        yield torch.cuda.device_count()
    finally:
        ray.shutdown()

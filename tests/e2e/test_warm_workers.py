"""The tests' warm process (tests/helpers/warm_workers.py): a worker is forked from it only where the
packages it preloaded would have read the worker's environment as the warm process's; otherwise the
worker starts as a fresh process."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

import warm_workers  # tests/helpers, on the path (tests/conftest.py)

pytestmark = pytest.mark.e2e

SCRIPT = """
import sys
preloaded = "torch._dynamo" in sys.modules
import torch._dynamo
print(preloaded, repr(torch._dynamo.config.debug_backend_override))
"""


def worker(tmp_path, **env) -> list[str]:
    """What a worker started through the warm process's client prints, with ``env`` added."""
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    command = [*shlex.split(warm_workers.start()), str(script)]  # as the raylet runs py_executable
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("started fresh" in done.stderr) == (done.stdout.split()[:1] == ["False"]), done.stderr[-3000:]
    return done.stdout.split()


def test_a_worker_is_forked_with_the_preloaded_packages_where_its_environment_agrees(tmp_path):
    import deepspeed  # noqa: F401  (it sets PYTORCH_NVML_BASED_CUDA_CHECK in this process, as in the warm one)

    assert worker(tmp_path) == ["True", "''"]
    # inductor's cache folder is read at each compile, not at import; DeepSpeed's accelerator is the one
    # every actor sets: no reason to start cold
    assert worker(tmp_path, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), DS_ACCELERATOR="cpu") == ["True", "''"]


def test_a_worker_whose_import_time_environment_differs_starts_fresh(tmp_path):
    assert sys.executable in warm_workers.start()
    assert worker(tmp_path, TORCH_COMPILE_OVERRIDE_BACKENDS=">=0:aot_eager") == ["False", "'>=0:aot_eager'"]

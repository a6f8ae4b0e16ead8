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


def test_python_command_lines_it_runs_and_those_it_leaves_to_a_fresh_interpreter():
    cmd = warm_workers.python_command
    assert cmd(["run.py", "-m", "x"]) == ("script", "run.py", ["-m", "x"], set())
    assert cmd(["-u", "-B", "-m", "stabledrl", "train"]) == ("module", "stabledrl", ["train"], {"-u", "-B"})
    assert cmd(["-c", "print(1)", "a"]) == ("code", "print(1)", ["a"], set())
    assert cmd(["-I", "sandbox.py"]) is None and cmd(["-X", "dev", "x.py"]) is None and cmd(["-m"]) is None


def test_the_benchmark_python_forks_scripts_modules_and_code_with_their_streams_and_descriptors(tmp_path):
    """warm_workers.python(): what the benchmark rehearsals start their runners with, and the runners
    their scripts (STABLEDRL_BENCH_PYTHON). Each command line runs forked from the warm process of its
    environment (torch imported before its first line), with its arguments, working directory,
    exit status and the descriptors its parent passed it; one it cannot run starts fresh."""
    python, env = warm_workers.python()
    assert env["STABLEDRL_BENCH_PYTHON"] == python and "RAY_JOB_CONFIG_JSON_ENV_VAR" in env
    (tmp_path / "script.py").write_text(
        "import os, sys\nprint('torch' in sys.modules, sys.argv[1:], os.getcwd() == sys.argv[1])\n"
        "os.write(int(sys.argv[2]), b'through the descriptor')\nsys.exit(3)\n")
    read, write = os.pipe()
    done = subprocess.run([python, str(tmp_path / "script.py"), str(tmp_path), str(write)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180, pass_fds=(write,))
    os.close(write)
    assert done.returncode == 3, done.stderr[-3000:]
    assert done.stdout.split("\n")[0] == f"True ['{tmp_path}', '{write}'] True"
    assert os.read(read, 100) == b"through the descriptor"
    os.close(read)
    module = subprocess.run([python, "-u", "-m", "json.tool", "--compact"], input='{"a": [1, 2]}', env=env,
                            capture_output=True, text=True, timeout=180)
    assert module.returncode == 0 and module.stdout.strip() == '{"a":[1,2]}', module.stderr[-3000:]
    code = subprocess.run([python, "-c", "import sys; print('torch' in sys.modules, sys.argv)", "x"], env=env,
                          capture_output=True, text=True, timeout=180)
    assert code.stdout.strip() == "True ['-c', 'x']" and "started fresh" not in code.stderr
    fresh = subprocess.run([python, "-I", "-c", "import sys; print('torch' in sys.modules)"], env=env,
                           capture_output=True, text=True, timeout=180)
    assert fresh.stdout.strip() == "False" and "a command line it does not run" in fresh.stderr
    # another import-time environment: a warm process of its own, not a fresh start
    python2, env2 = warm_workers.python({"TORCH_COMPILE_OVERRIDE_BACKENDS": ">=0:aot_eager"})
    assert python2 != python
    other = subprocess.run([python2, "-c", "import sys; print('torch' in sys.modules)"], env=env2,
                           capture_output=True, text=True, timeout=180)
    assert other.stdout.strip() == "True" and "started fresh" not in other.stderr, other.stderr[-3000:]

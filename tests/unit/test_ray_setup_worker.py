"""The tests' stand-in for Ray's setup_worker.py (tests/helpers/ray_setup/setup_worker.py): the warm
client's context is run in place, any other goes to Ray's own script unchanged. Every end-to-end
test's workers start through the first path (tests/e2e/harness.py: local_ray)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
SCRIPT = HELPERS / "ray_setup" / "setup_worker.py"
sys.path.insert(0, str(SCRIPT.parent))
import setup_worker  # noqa: E402  (tests/helpers/ray_setup, on the path just above)

WARM = f"{sys.executable} -S {HELPERS / 'warm_workers.py'} /tmp/warm-1.sock"


def context(**fields) -> str:
    return json.dumps({"command_prefix": [], "env_vars": {}, "py_executable": WARM,
                       "override_worker_entrypoint": None, "java_jars": [], **fields})


def test_it_reads_the_raylets_options_in_either_form_and_keeps_the_workers_command():
    argv = ["default_worker.py", "--node-ip-address=127.0.0.1", "--language=PYTHON",
            f"--serialized-runtime-env-context={context()}", "--worker-id=ab"]
    ctx, language, rest = setup_worker.parse(argv)
    assert language == "PYTHON" and ctx["py_executable"] == WARM
    assert rest == ["default_worker.py", "--node-ip-address=127.0.0.1", "--worker-id=ab"]
    assert setup_worker.parse(["--language", "JAVA", "--serialized-runtime-env-context", "{}", "w.py"]) == (
        {}, "JAVA", ["w.py"])


def test_only_the_warm_clients_context_is_run_in_place():
    warm = json.loads(context())
    assert setup_worker.warm_socket(warm, "PYTHON") == "/tmp/warm-1.sock"
    assert setup_worker.warm_socket({**warm, "env_vars": {"A": "1"}}, "PYTHON") == "/tmp/warm-1.sock"
    for other in ({**warm, "py_executable": sys.executable}, {**warm, "command_prefix": ["conda", "run"]},
                  {**warm, "override_worker_entrypoint": "w.py"}, {**warm, "java_jars": ["a.jar"]}):
        assert setup_worker.warm_socket(other, "PYTHON") is None, other
    assert setup_worker.warm_socket(warm, "JAVA") is None and setup_worker.warm_socket(None, "PYTHON") is None


def test_any_other_context_runs_through_rays_own_script_with_its_env_vars():
    ctx = context(py_executable=sys.executable, env_vars={"SETUP_CHECK": "${SETUP_BASE}/x${SETUP_NONE}"})
    done = subprocess.run([sys.executable, str(SCRIPT), f"--serialized-runtime-env-context={ctx}", "--language=PYTHON",
                           "-c", "import os; print(os.environ['SETUP_CHECK'])"],
                          capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "SETUP_BASE": "b"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["b/x"]  # expanded, the unset one emptied, as Ray's update_envs does

"""The first process of a Ray worker in the tests' local Ray instances, in place of Ray's own
setup_worker.py (tests/e2e/harness.py: local_ray names it; the raylet finds it by this file name).

Ray starts each worker of a job with a runtime_env as ``python setup_worker.py
--serialized-runtime-env-context=JSON --language=PYTHON default_worker.py ARGS``. Ray's script
imports Ray to read the context (~0.4 CPU-seconds a worker), applies its env_vars and execs
``bash -c "exec PY_EXECUTABLE default_worker.py ARGS"``. Where the context holds only env_vars and a
``py_executable`` that is the warm process's client (tests/helpers/warm_workers.py), this script
applies the env_vars as Ray does and runs the client in this process, without importing Ray; any
other context, or another language, goes to Ray's own script unchanged.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys

HELPERS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARM_CLIENT = os.path.join(HELPERS, "warm_workers.py")


def ray_setup_worker() -> str:
    """Ray's own setup_worker.py, found without importing Ray."""
    import importlib.util

    spec = importlib.util.find_spec("ray")
    return os.path.join(os.path.dirname(spec.origin), "_private", "workers", "setup_worker.py")


def parse(argv: list[str]) -> tuple[dict | None, str | None, list[str]]:
    """(context, language, the worker's command) as Ray's argparse reads them: both options in
    either ``--opt=value`` or ``--opt value`` form, anywhere before the worker's arguments."""
    context, language, rest, i = None, None, [], 0
    while i < len(argv):
        arg = argv[i]
        for name in ("--serialized-runtime-env-context", "--language"):
            if arg == name and i + 1 < len(argv):
                value, i = argv[i + 1], i + 1
            elif arg.startswith(name + "="):
                value = arg[len(name) + 1:]
            else:
                continue
            if name == "--language":
                language = value
            else:
                context = json.loads(value)
            break
        else:
            rest.append(arg)
        i += 1
    return context, language, rest


def warm_socket(context: dict | None, language: str | None) -> str | None:
    """The warm process's socket where the context is the warm client and env_vars only."""
    if context is None or language != "PYTHON":
        return None
    if context.get("command_prefix") or context.get("override_worker_entrypoint") or context.get("java_jars"):
        return None
    words = shlex.split(context.get("py_executable") or "")
    if len(words) == 4 and words[1] == "-S" and os.path.abspath(words[2]) == WARM_CLIENT:
        return words[3]
    return None


def main(argv: list[str]) -> None:
    context, language, rest = parse(argv)
    path = warm_socket(context, language)
    if path is None:
        os.execv(sys.executable, [sys.executable, ray_setup_worker(), *argv])
    for key, value in (context.get("env_vars") or {}).items():  # as Ray's update_envs
        os.environ[key] = re.sub(r"\$\{[A-Z0-9_]+\}", "", os.path.expandvars(value))
    sys.path.insert(0, HELPERS)
    import warm_workers

    warm_workers.client(path, rest)


if __name__ == "__main__":
    main(sys.argv[1:])

"""`stabledrl scale`: show or change the rollout workers of a running job, from any machine that
reaches the cluster.

    stabledrl scale --job quickstart --workers 4      # ask for 4 rollout workers
    stabledrl scale --job quickstart                  # status only

It finds the job's control actor (coordinator/runtime/control.py) by the job's name, asks it for the
new size and prints the status the driver last reported. The driver acts on a request after
its current step. With token authentication (deploy/README.md) the token is found as Ray finds
it (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token); ``--address`` needs no
RAY_AUTH_MODE set by hand.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import ray

from stabledrl.coordinator.runtime.control import NAMESPACE, actor_name


def running_jobs() -> list[str]:
    return sorted(a["name"].removeprefix("job:") for a in ray.util.list_named_actors(all_namespaces=True)
                  if a.get("namespace") == NAMESPACE and a["name"].startswith("job:"))


def find_job(job_name: str) -> Any:
    try:
        return ray.get_actor(actor_name(job_name), namespace=NAMESPACE)
    except ValueError:
        jobs = running_jobs()
        raise LookupError(f"no running stabledrl job named {job_name!r} on this cluster; running: "
                          f"{', '.join(jobs) if jobs else 'none'}") from None


def scale(job_name: str, workers: Optional[int], timeout_s: float = 30.0) -> tuple[Optional[str], dict[str, Any]]:
    """(the answer to the request or None, the job's status); ValueError for a count out of range."""
    control = find_job(job_name)
    answer = None
    if workers is not None:
        try:
            answer = ray.get(control.request_workers.remote(workers), timeout=timeout_s)
        except ray.exceptions.RayTaskError as e:
            raise ValueError(str(e.cause) if getattr(e, "cause", None) else str(e)) from None
    return answer, ray.get(control.get_status.remote(), timeout=timeout_s)


def auth_env(env: dict[str, str]) -> dict[str, str]:
    """``RAY_AUTH_MODE=token`` when it is unset and a token is at hand: Ray turns token auth on by
    itself only for a cluster it finds locally, never for an explicit ``--address``."""
    if env.get("RAY_AUTH_MODE") is not None:
        return {}
    path = Path(env.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    return {"RAY_AUTH_MODE": "token"} if env.get("RAY_AUTH_TOKEN") or path.is_file() else {}


def gcs_unreachable(address: str, timeout_s: float = 5.0) -> str:
    """Why the GCS at ``address`` (HOST:PORT) cannot be reached ('' when it answers, or for 'auto',
    which Ray resolves itself): Ray's own client retries an unreachable address for minutes."""
    import socket

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return ""
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        return (f"cannot reach the cluster's GCS at {address} ({e.strerror or e}): is the cluster up, and is --address "
                "its head's HOST:PORT (port 6379 unless ray start --port said otherwise)?")
    return ""


def scale_command(job_name: str, workers: Optional[int], address: str) -> int:
    """``stabledrl scale``: connect to the cluster, ask, print the job's status; exit status 2 when
    the job is not found or the count is out of range."""
    import logging
    import sys

    unreachable = gcs_unreachable(address)
    if unreachable:
        print(f"stabledrl scale: {unreachable}", file=sys.stderr)
        return 2
    token = auth_env(os.environ)
    if token:
        os.environ.update(token)
        from ray._raylet import Config  # Ray caches its settings at import: re-read them, as ray.init does itself

        Config.initialize("")
    ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING, log_to_driver=False)
    try:
        answer, status = scale(job_name, workers)
    except (LookupError, ValueError) as e:
        print(f"stabledrl scale: {e}", file=sys.stderr)
        return 2
    finally:
        ray.shutdown()
    if answer:
        print(answer)
    print(f"job {job_name!r}: " + ", ".join(f"{k} {v}" for k, v in status.items() if k != "job"))
    return 0

"""A running job's control handle: a small named Ray actor, found by the job's name.

    stabledrl scale --job quickstart --workers 4      # from any machine that can reach the cluster
    stabledrl scale --job quickstart                  # status only

The driver starts ``JobControl`` as ``job:<run.job_name>`` in the Ray namespace ``stabledrl`` and
polls it between steps (an asynchronous call: the answer is an event for the scheduler): it
reports its status (step, version, workers) and takes the newest requested worker count, which
the scheduler then reaches by starting or retiring workers. ``stabledrl scale`` (stabledrl/cli/scale.py)
is the other end.
The actor is not detached: it dies with the driver, so a finished or crashed job leaves no name
behind. A request outside [rollout.min_workers, rollout.max_workers] is refused by the actor
itself, so the command answers at once with the allowed range.
"""
from __future__ import annotations

from typing import Any, Optional

import ray

NAMESPACE = "stabledrl"


def actor_name(job_name: str) -> str:
    return f"job:{job_name}"


class JobControl:
    def __init__(self, job_name: str, min_workers: int, max_workers: int) -> None:
        self.job_name, self.min_workers, self.max_workers = job_name, min_workers, max_workers
        self.target: Optional[int] = None
        self.status: dict[str, Any] = {"job": job_name, "state": "starting"}

    def request_workers(self, workers: int) -> str:
        """Ask for ``workers`` rollout workers; the driver acts on it after its current step."""
        if not self.min_workers <= workers <= self.max_workers:
            raise ValueError(f"job {self.job_name!r}: {workers} workers is outside rollout.min_workers .. "
                             f"rollout.max_workers = {self.min_workers} .. {self.max_workers}")
        self.target = workers
        return f"job {self.job_name!r}: {workers} rollout workers requested (now {self.status.get('workers', '?')})"

    def poll(self, status: dict[str, Any]) -> Optional[int]:
        """The driver: record its status, take the pending request (None if there is none)."""
        self.status = {"job": self.job_name, **status}
        target, self.target = self.target, None
        return target

    def get_status(self) -> dict[str, Any]:
        return {**self.status, "requested": self.target}


def start_control(job_name: str, min_workers: int, max_workers: int) -> Any:
    """The job's control actor; an error naming the job when one of that name already runs."""
    name = actor_name(job_name)
    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        pass
    else:
        raise RuntimeError(f"a job named {job_name!r} is already running on this Ray cluster "
                           f"(namespace {NAMESPACE!r}); give this one another run.name")
    actor = ray.remote(num_cpus=0)(JobControl).options(name=name, namespace=NAMESPACE, max_concurrency=4)
    return actor.remote(job_name, min_workers, max_workers)

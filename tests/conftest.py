"""Shared test set-up: CPU-only defaults, GPU tests skipped where there is no CUDA, and a time limit
on every test (pytest-timeout): the default of pyproject.toml for the fast tier, E2E_TIMEOUT_S for
a test marked e2e or gpu that names no limit of its own."""
from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# no idle workers at a Ray instance's first driver: the tests' jobs start theirs through a warm process
# (tests/helpers/warm_workers.py, a runtime_env), which such a worker cannot serve
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")

import sys
from pathlib import Path

import pytest
import torch

# helper modules the tests share (a scripted scheduler, crafted pickles), importable from any folder
sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))

from job_lines import job_lines  # noqa: E402  (from the folder just put on the path)


# an end-to-end test starts Ray and DeepSpeed processes and runs a job (its module's fixtures count
# towards its first test): minutes under load on a shared 2-core machine, never a quarter of an hour
E2E_TIMEOUT_S = 1200


def pytest_collection_modifyitems(config, items):
    for item in items:
        # pytest-xdist (--dist loadgroup, make test): a module's tests stay on one worker, so that its
        # Ray instance and module fixtures start once; a module of tests that share nothing says so
        # (TESTS_STAND_ALONE) and its tests spread over the workers
        module = getattr(item, "module", None)
        if item.get_closest_marker("xdist_group") is None and not getattr(module, "TESTS_STAND_ALONE", False):
            item.add_marker(pytest.mark.xdist_group(getattr(module, "__name__", "")))
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        if getattr(config.option, "loadgroup", False) and groups and hasattr(item, "_id"):
            # the group goes into the test's id, where the scheduler reads it: pytest-xdist writes it
            # to item._nodeid, which pytest 9 no longer reads (its id is item._id)
            item._id = type(item._id).parse(f"{item.nodeid}@{'_'.join(groups)}")
        if ("e2e" in item.keywords or "gpu" in item.keywords) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_S))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Tests run on a 2-core machine: one intra-op thread is ~10x faster than two when pytest shares
# the cores with Ray actors and other processes.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _deterministic_torch():
    torch.manual_seed(0)
    yield


@pytest.fixture
def job_log():
    """The job's log lines while the test runs (tests/helpers/job_lines.py)."""
    with job_lines() as lines:
        yield lines

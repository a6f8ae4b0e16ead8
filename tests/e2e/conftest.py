"""What the end-to-end modules share: a local Ray instance per test module (``cluster``), started
once for the module's tests (under pytest-xdist they stay on one worker: tests/conftest.py)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cluster(request):
    """Ray on this machine for the requesting module, with its actors' classes pickled by value
    (harness.local_ray); a module's RAY_CPUS sets the logical CPUs (default 4)."""
    import harness

    with harness.local_ray(request.module.__name__, num_cpus=getattr(request.module, "RAY_CPUS", 4)):
        yield

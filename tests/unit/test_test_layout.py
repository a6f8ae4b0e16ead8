"""The suite's own layout: pytest imports test modules by their basename (no packages under tests/),
so two test files of one name in different folders stop the whole run at collection; every test
runs under a time limit; and the tests' Ray instances start in one place."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_name():
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)
    assert not [n for n, c in names.items() if c > 1], {n: sorted(str(p.relative_to(TESTS)) for p in
                                                        TESTS.rglob(n)) for n, c in names.items() if c > 1}


def test_every_test_has_a_time_limit(request):
    """pytest-timeout is on with a default limit (pyproject.toml), and every e2e or gpu test of this
    run carries the longer one tests/conftest.py gives it, unless it names its own."""
    assert request.config.pluginmanager.hasplugin("timeout")
    assert float(request.config.getini("timeout")) > 0
    slow = [item for item in request.session.items if "e2e" in item.keywords or "gpu" in item.keywords]
    assert all(item.get_closest_marker("timeout") is not None for item in slow), [
        item.nodeid for item in slow if item.get_closest_marker("timeout") is None]


def test_a_fast_test_that_starts_ray_is_told_to_be_marked_e2e():
    """tests/unit/conftest.py refuses ray.init in a test of the fast tier (this one, unmarked)."""
    ray = pytest.importorskip("ray")
    with pytest.raises(AssertionError, match=r"calls ray.init: mark it @pytest.mark.e2e"):
        ray.init(address="local", num_cpus=1, include_dashboard=False)
    assert not ray.is_initialized()


# where a test's Ray instance may start: the e2e modules' (tests/e2e/harness.py: local_ray, behind
# tests/e2e/conftest.py's ``cluster``), the GPU tests' (tests/helpers/gpu_ray.py), the elastic test's
# cluster of several nodes, and the fast tier's guard above
RAY_STARTS = {"e2e/harness.py", "helpers/gpu_ray.py", "e2e/test_elastic.py", "unit/test_test_layout.py"}


def test_tests_start_ray_only_through_the_shared_helpers():
    starts = {str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py")
              if "__pycache__" not in p.parts and "benchmarks" not in p.parts and "ray.init(" in p.read_text()}
    assert starts <= RAY_STARTS, sorted(starts - RAY_STARTS)


def test_under_loadgroup_a_modules_tests_carry_its_group_in_their_ids(request):
    """``make test`` (``--dist loadgroup``) keeps a module's tests on one worker, so that its Ray
    instance and module fixtures start once: the scheduler reads the group from each test's id
    (tests/conftest.py writes it there). Run without it, the ids carry no group."""
    if not getattr(request.config.option, "loadgroup", False):
        assert "@" not in request.node.nodeid
        return
    assert request.node.nodeid.endswith("@test_test_layout"), request.node.nodeid
    for item in request.session.items:
        alone = getattr(getattr(item, "module", None), "TESTS_STAND_ALONE", False)
        assert alone or "@" in item.nodeid, item.nodeid

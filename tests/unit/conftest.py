"""The fast tier's guard: `make test-fast` runs tests/unit without the e2e-marked tests, so a test
there that is not marked e2e must start no Ray instance and no DeepSpeed engine in this process."""
from __future__ import annotations

import importlib
import sys

import pytest

# what a test of the fast tier may not call, by module: the call refused names the test's marker
HEAVY = {"ray": "init", "deepspeed": "initialize"}


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_ray_or_deepspeed(request, monkeypatch):
    if "e2e" in request.keywords:
        return
    importlib.import_module("ray")  # most code under test imports it already; DeepSpeed's import is slow:
    for module, name in HEAVY.items():  # it is guarded where the code under test imported it
        if module in sys.modules:
            monkeypatch.setattr(sys.modules[module], name, refusal(f"{module}.{name}", request.node.nodeid))


def refusal(call: str, test: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{test} calls {call}: mark it @pytest.mark.e2e (make test-fast starts neither Ray nor "
                             "DeepSpeed)")
    return refuse

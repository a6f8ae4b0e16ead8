"""Weight push through the Ray object store (CPU): learner rank 0 puts {version, tensors} once;
every rollout worker fetches that one object.

The handle carries the object's reference, so a receiver can be called with the handle before
the put has finished (Ray resolves a reference passed as an argument before the call runs): the
driver queues every worker's receive right behind the learner's send, and a worker's next
request runs after its receive.
"""
from __future__ import annotations

from typing import Optional

from stabledrl.common.transport.base import (
    WIRE_DTYPES, LoadFn, NamedTensors, SendsWeights, WeightHandle, WeightPushConfig,
)


class ObjectStorePush(SendsWeights):
    """Rank 0 puts {version, tensors} in the Ray object store; receivers ray.get it."""

    def __init__(self, cfg: WeightPushConfig) -> None:
        self.cfg = cfg
        self._latest: Optional[WeightHandle] = None  # keeps the newest object alive for late joiners

    def send(self, named_tensors: NamedTensors, version: int) -> WeightHandle:
        import ray

        wire = WIRE_DTYPES.get(self.cfg.dtype)
        tensors = {name: t.detach().to("cpu", dtype=wire or t.dtype, copy=True) for name, t in named_tensors}
        self._latest = WeightHandle(version, "object_store", ray.put({"version": version, "tensors": tensors}))
        return self._latest

    def receive(self, handle: WeightHandle, load: LoadFn) -> int:
        import ray
        from ray.exceptions import GetTimeoutError

        try:
            payload = ray.get(handle.ref, timeout=self.cfg.timeout_s)
        except GetTimeoutError:
            raise TimeoutError(
                f"weight push: waited {self.cfg.timeout_s:.0f} s for weights version {handle.version} "
                f"from learner rank 0 (object {handle.ref})"
            ) from None
        if payload["version"] != handle.version:
            raise RuntimeError(f"weight push: expected version {handle.version}, object holds {payload['version']}")
        load(list(payload["tensors"].items()))
        return handle.version

    def close(self) -> None:
        self._latest = None

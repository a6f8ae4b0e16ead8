"""Where actors run: one placement-group bundle per actor, reserved all at once or not at all.

Each role gets a placement group (one bundle per actor) so that Ray reserves the whole role or
nothing: M learner ranks that must all exist to form their process group, N rollout workers. A
rollout worker added later gets a group of its own (coordinator/pool.py).
"""
from __future__ import annotations

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from common.config.job import ActorResources
from coordinator.events import ActorFailure


def bundle(resources: ActorResources) -> dict[str, float]:
    out = {"CPU": resources.num_cpus}
    if resources.num_gpus:
        out["GPU"] = resources.num_gpus
    out.update(resources.resources)  # custom resources: only nodes that offer them (cluster.*.resources)
    return out


def reserve(name: str, resources: ActorResources, count: int, strategy: str, timeout_s: float) -> PlacementGroup:
    """A placement group of ``count`` bundles, ready within ``timeout_s`` or an error saying what
    the cluster lacks."""
    group = placement_group([bundle(resources)] * count, strategy=strategy, name=name)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise ActorFailure(
            f"placement group {name!r} ({count} x {bundle(resources)}, {strategy}) was not placed within "
            f"{timeout_s:.0f} s; the cluster offers {ray.available_resources()} (cluster.* resources in the config)"
        )
    return group


def in_group(group: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)


def has_room(resources: ActorResources) -> bool:
    """Free resources for one more bundle of ``resources`` somewhere in the cluster."""
    need, available = bundle(resources), ray.available_resources()
    return all(available.get(k, 0.0) >= v for k, v in need.items())

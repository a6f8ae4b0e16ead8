"""Where actors run: one placement-group bundle per actor, reserved all at once or not at all.

Each role gets a placement group (one bundle per actor) so that Ray reserves the whole role or
nothing: M learner ranks that must all exist to form their process group, N rollout workers. A
rollout worker added later gets a group of its own (coordinator/runtime/pool.py). With
``cluster.colocate`` one group of M shared bundles holds both roles: learner rank i and rollout
worker i in bundle i, each asking for half of its GPU (``shared_bundle``, ``shared_gpus``).
"""
from __future__ import annotations

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from stabledrl.common.config.job import ActorResources
from stabledrl.coordinator.decisions.events import ActorFailure


def bundle(resources: ActorResources) -> dict[str, float]:
    out = {"CPU": resources.num_cpus}
    if resources.num_gpus:
        out["GPU"] = resources.num_gpus
    out.update(resources.resources)  # custom resources: only nodes that offer them (cluster.*.resources)
    return out


def shared_bundle(learner: ActorResources, rollout: ActorResources) -> dict[str, float]:
    """One bundle for a learner rank and the rollout worker beside it (``cluster.colocate``):
    their CPUs and custom resources added, the GPU they share once."""
    out = {"CPU": learner.num_cpus + rollout.num_cpus}
    if learner.num_gpus:
        out["GPU"] = learner.num_gpus
    for name in sorted(set(learner.resources) | set(rollout.resources)):
        out[name] = learner.resources.get(name, 0.0) + rollout.resources.get(name, 0.0)
    return out


def shared_gpus(resources: ActorResources) -> float:
    """What each of the two actors of a shared bundle asks Ray for: half of the GPU."""
    return resources.num_gpus / 2


def reserve(name: str, resources: ActorResources | dict[str, float], count: int, strategy: str,
            timeout_s: float) -> PlacementGroup:
    """A placement group of ``count`` bundles (``resources``' bundle, or a bundle as given), ready
    within ``timeout_s`` or an error saying what the cluster lacks."""
    one = resources if isinstance(resources, dict) else bundle(resources)
    group = placement_group([one] * count, strategy=strategy, name=name)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise ActorFailure(
            f"placement group {name!r} ({count} x {one}, {strategy}) was not placed within "
            f"{timeout_s:.0f} s; the cluster offers {ray.available_resources()} (cluster.* resources in the config)"
        )
    return group


def in_group(group: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)


def has_room(resources: ActorResources) -> bool:
    """Free resources for one more bundle of ``resources`` somewhere in the cluster."""
    need, available = bundle(resources), ray.available_resources()
    return all(available.get(k, 0.0) >= v for k, v in need.items())

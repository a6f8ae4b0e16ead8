"""The weight push's plan (common/transport/plan.py): one function decides the transport, the
sending ranks, staging and what of a LoRA learner travels, at the job's start and at each build
of a push group; the driver and the dry run read the same plan."""
from __future__ import annotations

import pytest

from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, LoraConfig
from stabledrl.common.transport.base import WeightPushConfig
from stabledrl.common.transport.plan import PushInputs, plan_push


def learner(stage: int = 3, ranks: int = 3, lora_push: str | None = None) -> LearnerConfig:
    lora = None if lora_push is None else LoraConfig(rank=8, alpha=16, push=lora_push)
    return LearnerConfig(num_ranks=ranks, deepspeed=DeepSpeedConfig(zero_stage=stage), lora=lora)


def sources(weights: WeightPushConfig, learner_cfg: LearnerConfig) -> int:
    return plan_push(PushInputs(weights, learner_cfg)).sources


def test_the_sending_ranks_follow_the_zero_stage_the_transport_and_the_lora_push():
    nccl = WeightPushConfig(backend="nccl")
    assert sources(nccl, learner(3)) == 3  # every ZeRO-3 rank holds a partition
    assert sources(nccl, learner(2)) == 1  # ZeRO-1/2: rank 0 holds it all
    assert sources(nccl, learner(3, lora_push="merged")) == 0  # merged LoRA pushes gather
    assert sources(nccl, learner(3, lora_push="adapters")) == 3  # the adapters' partitions
    assert sources(WeightPushConfig(backend="object_store"), learner(3)) == 0
    ipc = WeightPushConfig(backend="ipc")  # every ZeRO-3 rank fills its own buffer through one all-gather
    assert sources(ipc, learner(3)) == 3
    assert sources(ipc, learner(3, ranks=1)) == 0  # one rank: whole parameters
    assert sources(ipc, learner(2)) == 0
    assert sources(ipc, learner(3, lora_push="merged")) == 0
    assert sources(ipc, learner(3, lora_push="adapters")) == 0  # ipc: LoRA pushes gather
    assert sources(nccl, learner(2, lora_push="adapters")) == 1  # ZeRO-2: rank 0's whole A, B
    # auto resolves first, and the rule reads the resolved transport
    assert plan_push(PushInputs(WeightPushConfig(), learner(3), gpus=True)).sources == 3
    assert plan_push(PushInputs(WeightPushConfig(), learner(3), gpus=False)).sources == 0  # the object store


def test_auto_offers_the_peer_pull_for_groups_on_one_host_only_where_it_costs_no_memory():
    """``auto`` on GPUs (the broadcast): a group whose members all share the learner's host is
    pulled over peer, where the push is sharded (the partitions read where they lie) in the
    learner's dtype (a LoRA job's adapters too; its merged push gathers); a choice the user made
    is kept."""
    auto = PushInputs(WeightPushConfig(), learner(3), gpus=True)
    assert plan_push(auto).backend == "nccl" and plan_push(auto, one_host=True).backend == "peer"
    assert plan_push(auto).by_host and plan_push(auto, one_host=True).by_host
    assert plan_push(auto, one_host=True).transport.staging == WeightPushConfig().staging
    chosen = PushInputs(WeightPushConfig(backend="nccl"), learner(3), gpus=True)
    assert plan_push(chosen, one_host=True).backend == "nccl" and not plan_push(chosen).by_host
    assert plan_push(PushInputs(WeightPushConfig(), learner(3)), one_host=True).backend == "object_store"  # no GPUs
    bf16 = PushInputs(WeightPushConfig(dtype="bf16"), learner(3), gpus=True)
    assert plan_push(bf16, one_host=True).backend == "nccl"
    for push, backend in (("adapters", "peer"), ("merged", "nccl")):
        lora = PushInputs(WeightPushConfig(), learner(3, ranks=2, lora_push=push), gpus=True)
        assert plan_push(lora, one_host=True).backend == backend, push
    # a pull auto chose failed: every later group is broadcast, on one host too, and no longer by host
    after = plan_push(auto, one_host=True, peer_failed=True)
    assert after.backend == "nccl" and not after.by_host


def test_staging_lora_and_the_order_travel_with_the_plan():
    gloo = PushInputs(WeightPushConfig(backend="gloo"), learner(2), keep_order=True)
    plan = plan_push(gloo)
    assert plan.staged and plan.collective and plan.keep_order and plan.lora == "none" and not plan.partial
    assert not plan_push(PushInputs(WeightPushConfig(backend="gloo", staging=False), learner(2))).staged
    assert not plan_push(PushInputs(WeightPushConfig(backend="object_store"), learner(2))).staged  # not collective
    adapters = plan_push(PushInputs(WeightPushConfig(backend="gloo"), learner(2, lora_push="adapters")))
    assert adapters.lora == "adapters" and adapters.partial and adapters.adapters.rank == 8
    merged = plan_push(PushInputs(WeightPushConfig(backend="gloo"), learner(2, lora_push="merged")))
    assert merged.lora == "merged" and merged.partial and merged.adapters is None


@pytest.mark.parametrize("views, expected", [(None, "view"), ("learner.lora", "copy")])
def test_colocated_workers_in_turns_read_over_ipc_and_view_where_they_can(views, expected):
    inputs = PushInputs(WeightPushConfig(), learner(2), gpus=True, colocated=True, in_turns=True, views=views)
    plan = plan_push(inputs)
    assert plan.backend == "ipc" and plan.transport.ipc == expected and plan.views == (expected == "view")
    apart = PushInputs(WeightPushConfig(), learner(2), gpus=True, colocated=True)  # not in turns
    assert plan_push(apart).backend == "object_store"
    cpus = PushInputs(WeightPushConfig(), learner(2), colocated=True, in_turns=True)
    assert plan_push(cpus).backend == "object_store"

"""A LoRA push of the adapters only (common/transport/adapters.py): the receiver merges A and B into
its own unmerged copy of each target weight, so every push yields exactly W + s·B·A of the
weights it loaded (no error carried from one push to the next), also when the pair is split
across buckets and when the push is staged beside a running request."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from stabledrl.common.transport.adapters import AdapterMerger, merged_weight
from stabledrl.common.transport.staging import StagedWeights
from stabledrl.common.transport.base import ParameterLoader, WeightHandle


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q = nn.Linear(8, 6, bias=False, dtype=torch.bfloat16)
        self.norm = nn.LayerNorm(6, dtype=torch.bfloat16)


class FakePush:
    """Hands the named tensors to the loader in buckets of ``per_bucket`` (a reused buffer, as the
    broadcast's: every tensor is overwritten after its bucket is loaded)."""

    def __init__(self, named: list[tuple[str, torch.Tensor]], per_bucket: int) -> None:
        self.named, self.per_bucket = named, per_bucket

    def receive(self, handle: WeightHandle, load) -> int:
        for i in range(0, len(self.named), self.per_bucket):
            bucket = [(n, t.clone()) for n, t in self.named[i : i + self.per_bucket]]
            load(bucket)
            for _, t in bucket:
                t.fill_(float("nan"))  # the buffer is reused: a loader that kept a view would see this
        return handle.version


def adapters(seed: int, rank: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rank, 8, generator=g).bfloat16(), torch.randn(6, rank, generator=g).bfloat16()


def push(net: Net, merger: AdapterMerger, a: torch.Tensor, b: torch.Tensor, version: int, per_bucket: int) -> None:
    loader = ParameterLoader(net, partial=True)
    FakePush([("q.lora_A", a), ("q.lora_B", b)], per_bucket).receive(WeightHandle(version, "gloo"), merger.wrap(loader))
    loader.finish()


@pytest.mark.parametrize("per_bucket", [1, 2])
def test_every_push_merges_into_the_unmerged_weight(per_bucket):
    net = Net()
    base, norm = net.q.weight.detach().clone(), net.norm.weight.detach().clone()
    merger = AdapterMerger(net, scale=0.5)
    for version in range(1, 4):
        a, b = adapters(version)
        push(net, merger, a, b, version, per_bucket)
        assert torch.equal(net.q.weight, merged_weight(base, a, b, 0.5))  # not merged onto the previous push
        assert torch.equal(net.norm.weight, norm)  # not pushed: as loaded
    a, b = adapters(0)
    push(net, merger, a, torch.zeros_like(b), 4, per_bucket)  # B = 0: exactly the loaded weight again
    assert torch.equal(net.q.weight, base)


def test_a_staged_adapter_push_is_merged_into_the_staging_copy_and_applied_later():
    net = Net()
    base = net.q.weight.detach().clone()
    merger = AdapterMerger(net, scale=2.0)
    staged = StagedWeights(net)
    a, b = adapters(7)
    fake = FakePush([("q.lora_A", a), ("q.lora_B", b)], 1)
    assert staged.receive(fake, WeightHandle(1, "gloo"), keep_order=True, timeout_s=5, partial=True,
                          wrap=merger.wrap) == 1
    assert torch.equal(net.q.weight, base)  # staged, not applied yet
    assert staged.apply() == 1 and torch.equal(net.q.weight, merged_weight(base, a, b, 2.0))


def test_adapters_of_a_module_the_receiver_does_not_have_or_of_the_wrong_shape_fail():
    net = Net()
    merger = AdapterMerger(net, scale=1.0)
    a, b = adapters(1)
    with pytest.raises(KeyError, match="k"):
        FakePush([("k.lora_A", a), ("k.lora_B", b)], 2).receive(WeightHandle(1, "gloo"), merger.wrap(lambda x: None))
    with pytest.raises(ValueError, match="adapters of q"):
        FakePush([("q.lora_A", a), ("q.lora_B", b.t())], 2).receive(
            WeightHandle(1, "gloo"), merger.wrap(lambda x: None)
        )


def test_the_learner_sends_a_and_b_of_every_target_and_no_frozen_weight():
    from stabledrl.common.config.learner import LoraConfig
    from stabledrl.common.models.presets import build_tiny_policy
    from stabledrl.learner.lora import add_adapters, adapter_named_parameters

    policy = build_tiny_policy("llada", vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               num_key_value_heads=2, intermediate_size=48, mask_token_id=2, eos_token_id=1,
                               pad_token_id=0, bos_token_id=3)
    plain = {n: p.detach().clone() for n, p in policy.named_parameters()}
    adapted = add_adapters(policy, LoraConfig(rank=4, alpha=8.0))
    for a in adapted:  # trained adapters (B starts at 0)
        a.lora_B.data.normal_()
    sent = dict(adapter_named_parameters(adapted, zero_stage=2, bucket_bytes=1 << 20, receive=True))
    assert set(sent) == {f"{a.path}{s}" for a in adapted for s in (".lora_A", ".lora_B")}
    # a worker holding the plain policy merges them into what the learner computes with
    receiver = {n: t.clone() for n, t in plain.items()}
    merger = AdapterMerger(receiver, scale=8.0 / 4)
    loader = ParameterLoader(receiver, partial=True)
    merger.wrap(loader)(list(sent.items()))
    loader.finish()
    for a in adapted:
        assert torch.equal(receiver[a.weight_name], merged_weight(a.base, a.lora_A, a.lora_B, a.scale))

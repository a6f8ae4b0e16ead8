"""A LoRA push of the adapters only: a rollout worker holds A and B unmerged (common/models/lora.py)
under the names the learner sends, so every push replaces the previous adapters exactly and leaves
the loaded weights untouched, also when the pair is split across buckets, when the push is staged
beside a running request and when the worker's push is set up again."""
from __future__ import annotations

import pytest
import torch

from stabledrl.common.config.learner import LoraConfig
from stabledrl.common.models.lora import LoraLinear, adapted_paths
from stabledrl.common.models.presets import build_tiny_policy
from stabledrl.common.transport.base import WeightHandle
from stabledrl.rollout.engine import TorchRolloutEngine

LORA = LoraConfig(rank=2, alpha=4.0, target_modules=["q_proj", "up_proj"])
QUERY = "model.model.layers.0.self_attn.q_proj"


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


def worker() -> TorchRolloutEngine:
    engine = TorchRolloutEngine(build_tiny_policy("llada", seed=0))
    engine.hold_adapters(LORA)
    return engine


def adapters(engine: TorchRolloutEngine, seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(n, torch.randn(p.shape, generator=g)) for n, p in engine.policy.named_parameters()
            if n.endswith((".lora_A", ".lora_B"))]


def logits(engine: TorchRolloutEngine) -> torch.Tensor:
    with torch.no_grad():
        return engine.policy(torch.arange(4, 16)[None]).logits


@pytest.mark.parametrize("per_bucket", [1, 3])
def test_every_push_replaces_the_adapters_and_leaves_the_weights(per_bucket):
    engine = worker()
    weights = {n: p.detach().clone() for n, p in engine.policy.named_parameters() if not n.endswith("lora_A")
               and not n.endswith("lora_B")}
    plain = logits(engine)  # A = B = 0: the loaded model's function
    torch.testing.assert_close(plain, logits(TorchRolloutEngine(build_tiny_policy("llada", seed=0))), rtol=0, atol=0)
    held = dict(engine.policy.named_parameters())
    for version in range(1, 4):
        sent = adapters(engine, version)
        assert engine.update_weights(FakePush(sent, per_bucket), WeightHandle(version, "gloo"), partial=True) == version
        assert all(torch.equal(held[n], t) for n, t in sent)  # this push's adapters, nothing of the last
        assert all(torch.equal(held[n], w) for n, w in weights.items())  # the loaded weights, untouched
        assert not torch.allclose(logits(engine), plain)
    zeros = [(n, torch.zeros_like(t)) for n, t in adapters(engine, 0)]
    engine.update_weights(FakePush(zeros, per_bucket), WeightHandle(4, "gloo"), partial=True)
    torch.testing.assert_close(logits(engine), plain, rtol=0, atol=0)


def test_a_staged_adapter_push_is_applied_with_the_next_update():
    engine = worker()
    sent = adapters(engine, 7)
    assert engine.stage_weights(FakePush(sent, 1), WeightHandle(1, "gloo"), partial=True, keep_order=True,
                                timeout_s=5) == 1
    held = dict(engine.policy.named_parameters())
    assert all(not t.any() for n, t in held.items() if n.endswith(".lora_B"))  # staged, not applied yet
    assert engine.update_weights(FakePush([], 1), WeightHandle(1, "gloo"), partial=True) == 1
    assert all(torch.equal(held[n], t) for n, t in sent)


def test_adapters_of_a_module_the_worker_holds_none_for_or_of_the_wrong_shape_fail():
    engine = worker()
    name = "model.model.layers.0.self_attn.k_proj.lora_A"  # k_proj is no target
    with pytest.raises(KeyError, match="k_proj.lora_A"):
        engine.update_weights(FakePush([(name, torch.zeros(2, 64))], 1), WeightHandle(1, "gloo"), partial=True)
    with pytest.raises(ValueError, match="q_proj.lora_A has shape"):
        engine.update_weights(FakePush([(f"{QUERY}.lora_A", torch.zeros(3, 64))], 1), WeightHandle(1, "gloo"),
                              partial=True)


def test_setting_the_push_up_again_keeps_the_adapters_held_and_another_rank_is_refused():
    engine = worker()
    sent = adapters(engine, 3)
    engine.update_weights(FakePush(sent, 2), WeightHandle(1, "gloo"), partial=True)
    engine.hold_adapters(LORA)
    held = dict(engine.policy.named_parameters())
    assert all(torch.equal(held[n], t) for n, t in sent)
    with pytest.raises(ValueError, match="rank 2"):
        engine.hold_adapters(LORA.model_copy(update={"rank": 4}))


def test_the_learner_sends_a_and_b_of_exactly_the_modules_a_worker_holds_adapters_for():
    from stabledrl.learner.lora import adapter_named_parameters, add_adapters

    for cfg in (LORA, LoraConfig(rank=4, alpha=8.0, module_names="llada", target_modules=["q_proj", "ff_out"])):
        adapted = add_adapters(build_tiny_policy("llada", seed=0), cfg)
        sent = dict(adapter_named_parameters(adapted, zero_stage=2, bucket_bytes=1 << 20, receive=True))
        engine = TorchRolloutEngine(build_tiny_policy("llada", seed=0))
        engine.hold_adapters(cfg)
        held = {n: p for n, p in engine.policy.named_parameters() if n.endswith((".lora_A", ".lora_B"))}
        assert {n: tuple(t.shape) for n, t in sent.items()} == {n: tuple(p.shape) for n, p in held.items()}
        assert all(isinstance(engine.policy.model.get_submodule(p), LoraLinear) for p in adapted_paths(
            engine.policy.model))
    assert "model.lm_head.lora_B" in sent  # LLaDA's ff_out names its output head too


def test_taking_on_adapters_drops_the_steps_and_compiled_layers_built_over_the_plain_modules():
    from stabledrl.rollout.sampling.compiled import _ATTR, decoder_layers

    engine = TorchRolloutEngine(build_tiny_policy("llada", seed=0))
    graphs, layers = engine.graphs, decoder_layers(engine.policy)
    for layer in layers:  # as compiled_layers leaves them
        layer.__dict__[_ATTR] = "compiled over the plain Linear modules"
    engine.hold_adapters(LORA)
    assert engine.graphs is not graphs and not any(_ATTR in layer.__dict__ for layer in layers)
    graphs = engine.graphs
    layers[0].__dict__[_ATTR] = "compiled over the adapters"
    engine.hold_adapters(LORA)  # the same adapters again: what was built over them stays
    assert engine.graphs is graphs and _ATTR in layers[0].__dict__

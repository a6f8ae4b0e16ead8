"""``learner.compile`` (learner/fused.py): the RMSNorms', the gated MLPs' and the attention rotations'
elementwise work through torch.compile, the modules still called as modules. In fp32 the compiled
functions give the eager modules' loss and gradients to rounding, with activation checkpointing too;
the update under ZeRO-3 is checked against plain torch in tests/e2e/test_learner_engine.py."""
from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from stabledrl.common.models import build_tiny_policy
from stabledrl.learner.fused import fuse_elementwise
from stabledrl.learner.zero import enable_gradient_checkpointing

torch.set_num_threads(1)


def loss_and_grads(policy, ids, positions):
    policy.zero_grad()
    logits = policy(ids, position_ids=positions, logits_from=8).logits
    loss = logits.float().logsumexp(-1).mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in policy.named_parameters()}


@pytest.mark.parametrize("family, norms", [("llada", 5), ("sdar", 9)])  # sdar: q_norm and k_norm too
@pytest.mark.parametrize("checkpointing", [False, True])
def test_fused_norms_and_activation_give_the_eager_gradients(family, norms, checkpointing):
    eager = build_tiny_policy(family).float().train()
    fused = copy.deepcopy(eager)
    calls = []
    fused.model.get_decoder().layers[0].mlp.gate_proj.register_forward_hook(lambda *_: calls.append(1))
    assert fuse_elementwise(fused) == {"rms_norm": norms, "mlp": 2, "rotation": 2}
    if checkpointing:
        assert enable_gradient_checkpointing(eager) and enable_gradient_checkpointing(fused)
    g = torch.Generator().manual_seed(0)
    ids, positions = torch.randint(3, 90, (3, 20), generator=g), torch.arange(20).expand(3, 20)
    before = counters["stats"]["unique_graphs"]
    loss, grads = loss_and_grads(fused, ids, positions)
    assert counters["stats"]["unique_graphs"] > before or checkpointing  # compiled (cached after the first case)
    assert calls  # the MLP's Linears are still called as modules (their hooks run)
    ref_loss, ref_grads = loss_and_grads(eager, ids, positions)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_rotation_is_compiled_inside_each_attention_call_only(monkeypatch):
    """Each attention forward of a fused policy rotates through the compiled function (activation
    checkpointing's re-run included: it calls the same forward); outside those calls the modeling
    module's own function is back, so an unfused model in the same process rotates eagerly."""
    import stabledrl.learner.fused as fused_module
    from transformers.models.llama import modeling_llama

    from stabledrl.common.models.full_precision_rope import rotate_in_table_dtype

    policy = build_tiny_policy("llada").float().train()
    plain = copy.deepcopy(policy)
    rotations = []
    real = fused_module.compiled_once

    def spy(fn, options=None):
        compiled = real(fn, options)
        if fn is not rotate_in_table_dtype:
            return compiled
        return lambda *a, **k: rotations.append(1) or compiled(*a, **k)

    monkeypatch.setattr(fused_module, "compiled_once", spy)
    assert fuse_elementwise(policy)["rotation"] == 2
    assert enable_gradient_checkpointing(policy)
    ids, positions = torch.randint(3, 90, (2, 12), generator=torch.Generator().manual_seed(1)), torch.arange(12)[None]
    loss_and_grads(policy, ids, positions.expand(2, 12))
    assert len(rotations) == 4  # 2 layers, each forward run twice (the backward's re-run)
    assert modeling_llama.apply_rotary_pos_emb is rotate_in_table_dtype  # LLaDA's eager one, restored
    plain(ids, position_ids=positions.expand(2, 12), logits_from=8)
    assert len(rotations) == 4


def test_a_model_without_the_known_classes_is_refused():
    with pytest.raises(ValueError, match="learner.compile"):
        fuse_elementwise(torch.nn.Sequential(torch.nn.Linear(4, 4)))

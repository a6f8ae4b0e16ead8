"""A bf16 ZeRO-2 update without DeepSpeed's per-tensor overflow test (learner/zero.deepspeed_config):
a step never runs that test, a non-finite gradient still skips the update (weights and Adam
moments untouched, reported as skipped with an inf grad norm), and the next finite step applies.
One gloo rank in a child process, so this test process never joins a process group."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from stabledrl.common.config.learner import DeepSpeedConfig, OptimizerConfig
from stabledrl.learner.zero import deepspeed_config

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import json, math
    import torch
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
    from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, LoraConfig, OptimizerConfig
    from stabledrl.common.models.presets import build_tiny_policy
    from stabledrl.learner.engine import LearnerEngine
    from stabledrl.learner.group import init_learner_group, reserve_port

    torch.set_num_threads(1)
    checks = []
    overflow = DeepSpeedZeroOptimizer.has_overflow
    DeepSpeedZeroOptimizer.has_overflow = lambda self, *a, **k: checks.append(1) or overflow(self, *a, **k)
    init_learner_group("127.0.0.1", reserve_port(), 0, 1, backend="gloo", timeout_s=60)
    lora = LoraConfig(rank=4, alpha=8.0, dropout=0.0, module_names="llada", target_modules=["q_proj", "up_proj"])
    cfg = LearnerConfig(optimizer=OptimizerConfig(lr=1e-2, grad_clip=1.0), lora=lora,
                        deepspeed=DeepSpeedConfig(zero_stage=2, dtype="bf16"))
    engine = LearnerEngine(build_tiny_policy("llada", seed=0, dtype=torch.bfloat16), cfg)
    ids = torch.randint(3, 90, (2, 12), generator=torch.Generator().manual_seed(0))

    def loss_fn(model, poison):
        logits = model(ids).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
        if poison:  # finite loss, NaN gradient: d sqrt(|x|)/dx at x = 0
            loss = loss + torch.sqrt((logits - logits.detach()).sum().abs())
        return loss, {}

    def adapters():
        return {n: p.detach().clone() for n, p in engine.module.named_parameters() if p.requires_grad}

    def moments():
        return [v.clone() for s in engine.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]

    out = {}
    engine.train_step([False], loss_fn)  # a first update: the moments exist
    before, m_before = adapters(), moments()
    bad = engine.train_step([True], loss_fn)
    after = adapters()
    out["bad"] = {"skipped": float(bad["train/skipped"]), "grad_norm": float(bad["train/grad_norm"]),
                  "weights_equal": all(torch.equal(before[n], after[n]) for n in before),
                  "moments_equal": all(torch.equal(a, b) for a, b in zip(m_before, moments()))}
    good = engine.train_step([False], loss_fn)
    out["good"] = {"skipped": float(good["train/skipped"]), "grad_norm": float(good["train/grad_norm"]),
                   "moved": any(not torch.equal(after[n], p) for n, p in adapters().items())}
    out["overflow_checks"] = len(checks)
    print("RESULT" + json.dumps(out))
    """
)


def test_bf16_config_leaves_the_per_tensor_overflow_test_out():
    for stage in (2, 3):
        config = deepspeed_config(DeepSpeedConfig(zero_stage=stage), OptimizerConfig(), torch.bfloat16, 1)
        assert config["bf16"] == {"enabled": True, "check_grad_overflow": False}
    assert deepspeed_config(DeepSpeedConfig(zero_stage=2), OptimizerConfig(), torch.float32, 1)["bf16"]["enabled"] \
        is False


def test_a_nan_gradient_skips_a_bf16_zero2_update_without_the_overflow_test():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT"):])
    assert out["overflow_checks"] == 0
    assert out["bad"] == {"skipped": 1.0, "grad_norm": float("inf"), "weights_equal": True, "moments_equal": True}
    assert out["good"]["skipped"] == 0.0 and out["good"]["moved"]
    assert 0.0 < out["good"]["grad_norm"] < float("inf")

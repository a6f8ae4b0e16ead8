"""Under LoRA the rollout policy is the learner's, on a GPU at a wider shape (the CPU test:
tests/unit/rollout/test_lora_rollout_policy.py): a worker holding the pushed adapters unmerged
scores a batch with the learner's per-token log-probs within the forward's own noise on this card,
and keeps the whole of a small update where the merged push keeps a part.

The learner is peft's LoRA with d1's scale (r 128, alpha 64) on a bf16 LLaDA-family model of width
1024 (W ~ N(0, 0.02)), A at peft's initialisation, B ~ N(0, 1e-4). The noise is measured here: the
learner's log-probs of the batch against each row scored alone (another GEMM shape: the op-order
change between a learner's micro-batch and a worker's request). The test prints every figure (the
merged worker's difference beside that noise, the bf16-vs-fp32 difference, the share of the update
each worker keeps, and seconds per generation with and without the adapters' matmuls) for the
record; it asserts no time.

    pytest -q -m gpu tests/gpu/test_lora_rollout_gpu.py -s
"""
from __future__ import annotations

import copy
import time

import pytest
import torch

from stabledrl.common.config.estimator import MeanFieldConfig
from stabledrl.common.config.learner import LoraConfig
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.estimators import estimate
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.transport.base import WeightHandle
from stabledrl.common.types import SequenceBatch, left_pad
from stabledrl.learner.lora import adapter_named_parameters, add_adapters, plain_named_parameters
from stabledrl.rollout.engine import TorchRolloutEngine

pytestmark = pytest.mark.gpu
SHAPE = dict(vocab_size=4096, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
             num_key_value_heads=16)
LORA = LoraConfig(rank=128, alpha=64.0)  # d1's
ESTIMATOR = MeanFieldConfig()


class Push:
    def __init__(self, named) -> None:
        self.named = [(n, t.detach().clone()) for n, t in named]

    def receive(self, handle: WeightHandle, load) -> int:
        for i in range(0, len(self.named), 8):
            load(self.named[i : i + 8])
        return handle.version


def batch(vocab: int, rows: int = 8, completion: int = 128) -> tuple[SequenceBatch, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(4, vocab, (int(n),), generator=g) for n in torch.randint(8, 48, (rows,), generator=g)]
    ids, prompt_mask = left_pad(prompts, pad_id=0)
    completions = torch.randint(4, vocab, (rows, completion), generator=g)
    b = SequenceBatch(input_ids=torch.cat([ids, completions], 1), prompt_mask=prompt_mask,
                      completion_mask=torch.ones_like(completions, dtype=torch.bool))
    return b, torch.arange(rows) + 100


def token_logps(policy, b: SequenceBatch, seeds: torch.Tensor, alone: bool = False) -> torch.Tensor:
    device = next(policy.parameters()).device
    with torch.no_grad():
        if not alone:
            return estimate(policy, b.to(device), seeds, ESTIMATOR).token.float()
        return torch.cat([estimate(policy, b.select([r]).to(device), seeds[r : r + 1], ESTIMATOR).token.float()
                          for r in range(len(seeds))])


def kept_share(policy, learner, base, b, seeds) -> float:
    """In fp32 arithmetic over the stored parameters: the share of the learner's update to the
    log-probs that ``policy`` reproduces."""
    start = token_logps(copy.deepcopy(base).float(), b, seeds)
    moved = token_logps(copy.deepcopy(learner).float(), b, seeds) - start
    return float(((token_logps(copy.deepcopy(policy).float(), b, seeds) - start) * moved).sum() / moved.pow(2).sum())


def seconds_per_generation(engine: TorchRolloutEngine, vocab: int, device: torch.device, reps: int = 3) -> float:
    prompts = [torch.randint(4, vocab, (32,), generator=torch.Generator().manual_seed(i)) for i in range(16)]
    cfg = SamplerConfig(gen_length=128, block_length=32, steps=64, temperature=1.0, max_batch_size=16)
    times = []
    for _ in range(reps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        engine.generate(prompts, torch.arange(16), cfg)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[len(times[1:]) // 2]


def measure(device: torch.device, shape: dict, lora: LoraConfig, timed: bool = True) -> dict[str, float]:
    """Every figure the test prints and checks, at ``shape`` on ``device``."""
    torch.set_float32_matmul_precision("highest")  # the fp32 arithmetic below must not be TF32
    base = build_tiny_policy("llada", dtype=torch.bfloat16, seed=0, **shape).to(device)  # Linear ~ N(0, 0.02)
    learner = copy.deepcopy(base)
    adapted = add_adapters(learner, lora)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for a in adapted:
            a.lora_B.copy_(torch.randn(a.lora_B.shape, generator=g) * 1e-4)
    workers = {}
    for push, named in (("adapters", adapter_named_parameters(adapted, zero_stage=0, bucket_bytes=1 << 26,
                                                              receive=True)),
                        ("merged", plain_named_parameters(learner, adapted, zero_stage=0, bucket_bytes=1 << 26,
                                                          receive=True, only_adapted=True))):
        engine = TorchRolloutEngine(copy.deepcopy(base))
        engine.hold_adapters(lora if push == "adapters" else None)
        engine.update_weights(Push(named), WeightHandle(1, "nccl"), partial=True)
        workers[push] = engine
    b, seeds = batch(shape["vocab_size"])
    theirs = token_logps(learner, b, seeds)
    out = {"noise_rows_alone_max": (theirs - token_logps(learner, b, seeds, alone=True)).abs().max().item(),
           "bf16_vs_fp32_mean": (theirs - token_logps(copy.deepcopy(learner).float(), b, seeds)).abs().mean().item(),
           "update_mean": (theirs - token_logps(base, b, seeds)).abs().mean().item()}
    for push, engine in workers.items():
        diff = (token_logps(engine.policy, b, seeds) - theirs).abs()
        out[f"{push}_max"], out[f"{push}_mean"] = diff.max().item(), diff.mean().item()
        out[f"{push}_kept_share"] = kept_share(engine.policy, learner, base, b, seeds)
        if timed:
            out[f"{push}_generate_s"] = seconds_per_generation(engine, shape["vocab_size"], device)
    return out


@pytest.fixture(scope="module")
def figures():
    out = measure(torch.device("cuda", 0), SHAPE, LORA)
    print("\nLoRA rollout policy on", torch.cuda.get_device_name(0), {k: round(v, 8) for k, v in out.items()})
    return out


def test_the_adapters_worker_scores_within_the_forwards_own_noise(figures):
    assert figures["adapters_max"] <= figures["noise_rows_alone_max"]
    assert figures["update_mean"] > 0  # the update moves the learner's log-probs


def test_the_adapters_worker_keeps_the_update_the_merged_one_loses_most(figures):
    assert figures["adapters_kept_share"] == pytest.approx(1.0, abs=1e-3)
    assert figures["merged_kept_share"] < 0.5


def test_steps_captured_before_the_adapters_arrive_are_captured_again():
    """A worker that sampled with CUDA graphs before its push was set up (they replay the plain
    Linear modules) samples with the adapters afterwards: the same tokens as a fresh worker."""
    shape = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2)
    lora = LoraConfig(rank=8, alpha=16.0)
    cfg = SamplerConfig(gen_length=32, block_length=None, steps=32, temperature=0.9, cuda_graph=True,
                        stop_at_eos=False)
    prompts, seeds = [torch.arange(10, 15), torch.arange(30, 38)], torch.arange(2)
    learner = add_adapters(build_tiny_policy("sdar", block_size=4, seed=0, **shape), lora)
    with torch.no_grad():
        for a in learner:
            a.lora_B.normal_(0.0, 0.5)
    named = list(adapter_named_parameters(learner, zero_stage=0, bucket_bytes=1 << 26, receive=True))
    engines = []
    for warm in (True, False):
        engine = TorchRolloutEngine(build_tiny_policy("sdar", block_size=4, seed=0, **shape).cuda())
        if warm:  # captured over the plain modules
            engine.generate(prompts, seeds, cfg)
            assert engine.graphs.captures > 0
        engine.hold_adapters(lora)
        engine.update_weights(Push(named), WeightHandle(1, "nccl"), partial=True)
        engines.append(engine.generate(prompts, seeds, cfg))
    assert torch.equal(engines[0].completion_ids, engines[1].completion_ids)

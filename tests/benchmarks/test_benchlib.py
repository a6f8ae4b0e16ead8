"""The FLOP counts behind every MFU / %-of-matmul figure of the benchmarks, checked against torch's
own FLOP counter (``torch.utils.flop_counter.FlopCounterMode``) on the tiny shapes, and the
on-device model builder the benchmarks use. Attention FLOPs are left out of the comparison
(the counter does not see the CPU sdpa kernel): ``heads=0`` drops that term, so what is compared
is every matrix product of the Linear layers and the LM head, for the exact sequence of forwards
each benchmark runs."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib as bl  # noqa: E402
from stabledrl.common.attention import full_mask  # noqa: E402
from stabledrl.common.config.sampler import SamplerConfig  # noqa: E402
from stabledrl.rollout.sampling import generate  # noqa: E402


def counted(fn) -> int:
    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops()


def no_attention(sc: bl.ShapeCount) -> bl.ShapeCount:
    return dataclasses.replace(sc, heads=0)


@pytest.mark.parametrize("shape", ["tiny-llada", "tiny-sdar", "tiny-qwen2"])
def test_forward_flops_match_the_counter(shape):
    p = bl.build_policy(shape, torch.device("cpu"), torch.float32)
    sc = no_attention(bl.count_shape(p))
    b, length, lo, hi = 3, 24, 10, 18
    ids = torch.randint(4, 500, (b, length))
    mask = full_mask(torch.ones(b, length, dtype=torch.bool))
    with torch.no_grad():
        got = counted(lambda: p(ids, attention_mask=mask, position_ids=torch.arange(length).expand(b, length),
                                logits_from=lo, logits_to=hi))
    assert got == bl.forward_flops(sc, rows=b, query_len=length, key_len=length, logit_positions=hi - lo)


def test_naive_generation_flops_are_steps_times_one_forward():
    p = bl.build_policy("tiny-llada", torch.device("cpu"), torch.float32)
    sc = no_attention(bl.count_shape(p))
    prompts = bl.random_prompts(3, 16, p.vocab_size, seed=0)
    cfg = SamplerConfig(gen_length=32, block_length=8, steps=8, cache="none", stop_at_eos=False)
    got = counted(lambda: generate(p, prompts, torch.arange(3), cfg))
    assert got == 8 * bl.forward_flops(sc, rows=3, query_len=48, key_len=48, logit_positions=8)


@pytest.mark.parametrize("steps", [8, 16])
def test_block_diffusion_generation_flops(steps):
    import bench_block_diffusion as bd

    p = bl.build_policy("tiny-sdar", torch.device("cpu"), torch.float32, block_size=4)
    sc = no_attention(bl.count_shape(p))
    a = argparse.Namespace(batch=3, block=4, prompt=16, gen=16)
    prompts = bl.random_prompts(3, 16, p.vocab_size, seed=0)
    cfg = SamplerConfig(gen_length=16, block_length=None, steps=steps, cache="prefix", stop_at_eos=False)
    out = generate(p, prompts, torch.arange(3), cfg)
    got = counted(lambda: generate(p, prompts, torch.arange(3), cfg))
    assert got == bd.generation_flops(sc, a, steps, out.num_forwards)


@contextlib.contextmanager
def head_rows(policy):
    """Yields [positions the LM head ran on] (one item, filled while inside)."""
    rows = [0]
    hook = policy.model.get_output_embeddings().register_forward_hook(
        lambda _m, inp, _out: rows.__setitem__(0, rows[0] + inp[0].reshape(-1, inp[0].shape[-1]).shape[0]))
    try:
        yield rows
    finally:
        hook.remove()


def test_learner_step_is_three_forwards_of_both_masks():
    import bench_learner as bln
    from stabledrl.common.config.estimator import ElboMCConfig
    from stabledrl.common.config.loss import StableDrlLossConfig

    p = bl.build_policy("tiny-qwen2", torch.device("cpu"), torch.float32).train()
    sc = no_attention(bl.count_shape(p))
    a = argparse.Namespace(groups_per_step=1, world=1, group_size=4, prompt=8, gen=16, estimator="elbo_mc")
    mb = bln.micro_batches(a, 0, p.vocab_size)[0]
    loss_fn = bln.stabledrl_loss_fn(
        ElboMCConfig(num_draws=2, weighting="mean", masks="independent"), StableDrlLossConfig()
    )

    def step():
        loss, _ = loss_fn(p, mb)
        loss.backward()

    with head_rows(p) as scored:
        got = counted(step)
    # the LM head runs at the scored (masked) positions only (half of the 2G x C in expectation)
    assert 0 < scored[0] < 2 * a.group_size * a.gen
    forward = bl.forward_flops(sc, rows=2 * a.group_size, query_len=a.prompt + a.gen, key_len=0, logit_positions=0)
    forward += 2.0 * sc.head * scored[0]
    # the LM head's input gradient and every weight gradient: backward = 2 x forward for every product
    assert got == pytest.approx(3 * forward, rel=1e-9)


def test_d1_learner_step_with_lora_is_two_forwards_and_the_adapters():
    """--estimator mean_field --lora: the frozen base takes no weight gradients, so a step is the
    forward and the input gradients (the 2F the benchmark counts, the head over the whole masked
    completion) plus the adapters' forward and backward (3 x 2·T·r·(in + out) per adapted Linear)."""
    import bench_learner as bln
    from stabledrl.common.config.estimator import MeanFieldConfig
    from stabledrl.common.config.learner import LoraConfig
    from stabledrl.common.config.loss import GrpoLossConfig
    from stabledrl.learner.lora import add_adapters

    p = bl.build_policy("tiny-llada", torch.device("cpu"), torch.float32)
    adapted = add_adapters(p, LoraConfig(rank=2, alpha=4.0, module_names="llada",
                                         target_modules=["q_proj", "k_proj", "v_proj", "up_proj"]))
    p.train()
    sc = no_attention(bl.count_shape(p))
    a = argparse.Namespace(groups_per_step=1, world=1, group_size=4, prompt=8, gen=16, estimator="mean_field")
    mb = bln.micro_batches(a, 0, p.vocab_size)[0]
    loss_fn = bln.grpo_loss_fn(MeanFieldConfig(), GrpoLossConfig(kl_beta=0.0, level="token"))

    def step():
        loss, _ = loss_fn(p, mb)
        loss.backward()

    with head_rows(p) as scored:
        got = counted(step)
    assert scored[0] == a.group_size * a.gen  # the whole completion is masked and scored
    tokens = a.group_size * (a.prompt + a.gen)
    forward = bl.forward_flops(sc, rows=a.group_size, query_len=a.prompt + a.gen, key_len=0, logit_positions=a.gen)
    adapters = sum(2.0 * tokens * 2 * (x.base.shape[0] + x.base.shape[1]) for x in adapted)
    # at most: the input gradient of every product; the first layer's attention inputs need none
    # (the embedding is frozen), so the step comes in below it, and far below full training's 3F
    assert 0.9 * 2 * forward < got <= 2 * forward + 3 * adapters < 2.2 * forward


@pytest.mark.parametrize("kernel", ["sdpa", "flex"])
def test_staircase_learner_step_is_three_forwards_over_prompt_and_both_copies(kernel):
    """--estimator staircase: one forward of G rows over P + 2C tokens (left-padded prompts), under
    either --staircase-attention setting; the job-formula MFU counts only the real tokens."""
    import bench_learner as bln
    from stabledrl.common.config.estimator import StaircaseConfig
    from stabledrl.common.config.loss import StableDrlLossConfig
    from stabledrl.common.models.flex_staircase import uses_flex_staircase

    p = bl.build_policy("tiny-sdar", torch.device("cpu"), torch.float32, block_size=4).train()
    bln.set_staircase_attention(p, kernel)
    assert uses_flex_staircase(p) == (kernel == "flex")
    sc = no_attention(bl.count_shape(p))
    a = argparse.Namespace(groups_per_step=1, world=1, group_size=4, prompt=8, gen=16, estimator="staircase")
    mb = bln.micro_batches(a, 0, p.vocab_size)[0]
    assert not mb["batch"].prompt_mask.all() and mb["batch"].prompt_mask[:, -4:].all()  # left-padded, >= P/2 real
    loss_fn = bln.stabledrl_loss_fn(StaircaseConfig(t_min=0.1, t_max=0.9, num_draws=1), StableDrlLossConfig())

    def step():
        loss, _ = loss_fn(p, mb)
        loss.backward()

    with head_rows(p) as scored:
        got = counted(step)
    assert 0 < scored[0] < a.group_size * a.gen  # the masked positions of the noisy copy only
    forward = bl.forward_flops(sc, rows=a.group_size, query_len=a.prompt + 2 * a.gen, key_len=0, logit_positions=0)
    assert got == pytest.approx(3 * (forward + 2.0 * sc.head * scored[0]), rel=1e-9)
    real = int(mb["batch"].prompt_mask.sum()) + a.group_size * a.gen
    got = bln.job_formula_mfu(a, [mb], sc, {"step_s_median": 2.0}, peak=1.0)
    assert got["real_tokens_per_step"] == real
    assert got["mfu_job_formula"] == pytest.approx(6 * sc.total * real / 2.0 / 1e12)


def test_builder_makes_the_requested_dtype_with_exact_rope():
    p = bl.build_policy("tiny-llada", torch.device("cpu"), torch.bfloat16)
    assert {t.dtype for t in p.parameters()} == {torch.bfloat16}
    cfg = p.model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    exact = 1.0 / 500000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    rotary = [m for m in p.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)]
    assert rotary and all(torch.equal(m.inv_freq, exact) for m in rotary)
    norms = [t for n, t in p.named_parameters() if n.endswith("norm.weight")]
    assert norms and all(bool((t == 1).all()) for t in norms)  # transformers' own init ran
    assert torch.get_default_dtype() == torch.float32  # the builder restores the default dtype


def test_profile_covers_the_requested_forwards_and_ends_the_run_early():
    p = bl.build_policy("tiny-sdar", torch.device("cpu"), torch.float32, block_size=4)
    prompts = bl.random_prompts(2, 8, p.vocab_size, seed=0)
    c = SamplerConfig(gen_length=32, block_length=None, steps=32, temperature=0.9, cache="prefix", stop_at_eos=False)
    seen: list[int] = []
    hook = p.model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:
        prof = bl.profile_forwards(p.model, lambda: generate(p, prompts, torch.arange(2), c), torch.device("cpu"),
                                   skip=4, active=3)
    finally:
        hook.remove()
    assert len(seen) == 7  # the generation (32 forwards) stopped right after the profiled window
    assert prof["forwards_profiled"] == 3 and prof["wall_ms_per_forward"] > 0
    assert prof["host_aten_ops_per_forward"] > 10 and prof["top_host_ops"]
    assert prof["device_busy_ms_per_forward"] is None  # no device kernels on a CPU


def test_profiled_kernels_fall_into_categories():
    from types import SimpleNamespace

    assert bl.kernel_category("nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_TNT") == "matmul"
    assert bl.kernel_category("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma") == "attention"
    assert bl.kernel_category("triton_poi_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "triton (compiled)"
    assert bl.kernel_category("void at::native::reduce_kernel<512, 1, MeanOps>") == "reduce"
    assert bl.kernel_category("void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>") == "copy / cast"
    assert bl.kernel_category("void at::native::vectorized_elementwise_kernel<4, silu_kernel>") == "elementwise / other"
    events = [SimpleNamespace(key="nvjet_a", count=4, us=300.0), SimpleNamespace(key="nvjet_b", count=2, us=100.0),
              SimpleNamespace(key="silu_kernel", count=8, us=40.0)]
    table = bl.kernel_categories(events, lambda e: e.us, per=2.0)
    assert list(table) == ["matmul", "elementwise / other"]  # by time, largest first
    assert table["matmul"] == {"kernels_per_forward": 3.0, "ms_per_forward": 0.2}

"""LearnerEngine on real Ray actors and real DeepSpeed (CPU, gloo, 2 ranks, ZeRO-2 and ZeRO-3).

The reference for every update is plain torch in this process: the tiny policy, the loss of *all*
micro-batches of both ranks, torch's grad-norm clipping and torch's AdamW. Adam's ε is set large
(1.0) so that the update is close to linear in the gradient and a wrong gradient scale cannot
hide behind Adam's normalisation; the grad norm is compared too.
"""
from __future__ import annotations

import math
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from stabledrl.common.trust.checkpoint_files import FORMAT  # noqa: E402
from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, OptimizerConfig  # noqa: E402
from stabledrl.common.models.presets import build_tiny_policy  # noqa: E402
from stabledrl.coordinator.runtime.checkpoint import write_state  # noqa: E402
from stabledrl.learner.losses.statistics import Metric  # noqa: E402

pytestmark = pytest.mark.e2e

VOCAB, LENGTH = 97, 12
TIMES: dict[str, float] = {}


def record(key: str, seconds: float) -> None:
    """Keep the first measurement (imports and warm-up included) and the latest one."""
    TIMES.setdefault(f"{key}_first", seconds)
    TIMES[key] = seconds


def make_micro_batch(seed: int, rows: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(3, VOCAB, (rows, LENGTH), generator=g),
        "targets": torch.randint(3, VOCAB, (rows, LENGTH), generator=g),
    }


def token_loss(model, mb: dict) -> tuple[torch.Tensor, dict]:
    """Σ token cross-entropy ÷ the global token count (the step's denominator over all ranks)."""
    logits = model(mb["input_ids"]).logits  # [b, L, V]
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), mb["targets"].flatten(), reduction="none")
    loss = nll.sum() / mb["denominator"]
    if mb.get("poison") == "loss":  # NaN in a detached term: finite gradients, NaN loss
        loss = loss + torch.tensor(float("nan"))
    if mb.get("poison") == "grad":  # finite loss, NaN gradient: d sqrt(|x|)/dx at x = 0
        loss = loss + torch.sqrt((logits - logits.detach()).sum().abs())
    return loss, {"nll": Metric.share(loss), "nll_max": Metric.max(nll.max()),
                  "tokens": torch.tensor(nll.numel() / mb["denominator"])}  # a bare tensor: a share


def shard(seeds_per_rank: list[list[tuple[int, int]]], **extra) -> list[list[dict]]:
    """Micro-batches per rank, with the global token count attached to each."""
    mbs = [[make_micro_batch(s, r) for s, r in seeds] for seeds in seeds_per_rank]
    denominator = float(sum(mb["targets"].numel() for rank in mbs for mb in rank))
    for rank in mbs:
        for mb in rank:
            mb.update(denominator=denominator, **extra)
    return mbs


@ray.remote(num_cpus=0.5)
class LearnerRank:
    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.engine = None

    def rendezvous_address(self):
        from stabledrl.learner.group import rendezvous_address

        return rendezvous_address()

    def init_group(self, addr: str, port: int, rank: int, world: int) -> float:
        from stabledrl.learner.group import init_learner_group

        t0 = time.perf_counter()
        init_learner_group(addr, port, rank, world, backend="gloo", timeout_s=60)
        return time.perf_counter() - t0

    def build(self, cfg: LearnerConfig, seed: int = 0) -> float:
        from stabledrl.learner.engine import LearnerEngine

        t0 = time.perf_counter()
        self.engine = LearnerEngine(build_tiny_policy("llada", vocab_size=VOCAB, seed=seed), cfg)
        return time.perf_counter() - t0

    def step(self, micro_batches: list[dict]) -> tuple[dict, float]:
        t0 = time.perf_counter()
        metrics = self.engine.train_step(micro_batches, token_loss)
        return metrics, time.perf_counter() - t0

    def weights(self) -> dict:
        return self.engine.state_dict_for_push(all_ranks=True)

    def save(self, directory: str, client_state: dict) -> str:
        return self.engine.save_checkpoint(directory, client_state)

    def load(self, directory: str) -> dict:
        return self.engine.load_checkpoint(directory)

    def rng(self) -> tuple[int, object]:
        return torch.initial_seed(), self.engine.resharded_from

    def moments(self) -> dict:
        """Every parameter's Adam moments, whole, as DeepSpeed's own accessor reads them (collective)."""
        from deepspeed.utils import safe_get_full_optimizer_state

        return {n: {k: safe_get_full_optimizer_state(p, k).clone() for k in ("exp_avg", "exp_avg_sq")}
                for n, p in self.engine.engine.module.named_parameters()}


@pytest.fixture(scope="module")
def ranks(cluster):
    actors = [LearnerRank.remote() for _ in range(2)]
    t0 = time.perf_counter()
    addr, port = ray.get(actors[0].rendezvous_address.remote())
    TIMES["first_actor_call"] = time.perf_counter() - t0
    TIMES["group_init"] = max(ray.get([a.init_group.remote(addr, port, r, 2) for r, a in enumerate(actors)]))
    yield actors
    print("\ntimes (s):", {k: round(v, 2) for k, v in TIMES.items()})


@pytest.fixture(scope="module")
def solo(ranks):
    """One more learner rank, in a group of its own (world size 1)."""
    actor = LearnerRank.remote()
    addr, port = ray.get(actor.rendezvous_address.remote())
    ray.get(actor.init_group.remote(addr, port, 0, 1))
    return [actor]


def build(ranks, cfg: LearnerConfig, seed: int = 0) -> None:
    record("deepspeed_init", max(ray.get([a.build.remote(cfg, seed) for a in ranks])))


def step(ranks, mbs: list[list[dict]]) -> dict:
    out = ray.get([a.step.remote(m) for a, m in zip(ranks, mbs)])
    record("train_step", max(t for _, t in out))
    a, b = out[0][0], out[1][0]
    assert a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a), \
        f"metrics must be identical on every rank: {a} vs {b}"
    return a


def gathered(ranks) -> dict[str, torch.Tensor]:
    w0, w1 = ray.get([a.weights.remote() for a in ranks])
    assert w0.keys() == w1.keys()
    for name in w0:
        assert torch.equal(w0[name], w1[name]), f"{name} differs between ranks"
    return w0


def config(stage: int, clip: float, warmup: int = 2, compile: bool = False) -> LearnerConfig:
    return LearnerConfig(
        num_ranks=2,
        compile=compile,
        optimizer=OptimizerConfig(lr=1e-2, betas=(0.9, 0.99), eps=1.0, weight_decay=0.1, grad_clip=clip,
                                  warmup_steps=warmup),
        deepspeed=DeepSpeedConfig(zero_stage=stage, dtype="fp32", param_persistence_threshold=0,
                                  gradient_checkpointing=stage == 3),
    )


class Reference:
    """One process on all the data: the loss of every micro-batch, torch clipping, torch AdamW
    with the engine's parameter groups and warm-up."""

    def __init__(self, opt: OptimizerConfig, seed: int = 0) -> None:
        from stabledrl.learner.zero import build_optimizer

        self.opt = opt
        self.model = build_tiny_policy("llada", vocab_size=VOCAB, seed=seed).train()
        self.optimizer = build_optimizer(self.model, opt)
        self.applied = 0

    def step(self, mbs: list[list[dict]]) -> tuple[float, float]:
        from stabledrl.learner.zero import lr_at

        self.optimizer.zero_grad()
        outs = [token_loss(self.model, mb) for rank in mbs for mb in rank]
        total = sum(loss for loss, _ in outs)
        self.nll_max = max(float(metrics["nll_max"].value) for _, metrics in outs)
        total.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.opt.grad_clip or float("inf"))
        for g in self.optimizer.param_groups:
            g["lr"] = lr_at(self.opt, self.applied)
        self.optimizer.step()
        self.applied += 1
        return float(total.detach()), float(norm)

    def weights(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.model.named_parameters()}


def assert_update_close(before: dict, after: dict, ref_after: dict, rtol: float = 1e-4) -> None:
    num = sum(((after[n] - ref_after[n]) ** 2).sum() for n in before)
    den = sum(((ref_after[n] - before[n]) ** 2).sum() for n in before)
    assert den > 0
    assert (num / den).sqrt() < rtol, f"relative update error {(num / den).sqrt():.2e}"


# rank 0 holds 2 micro-batches, rank 1 holds 3 of other sizes: uneven counts exercise the padding
STEP1 = [[(11, 2), (12, 3)], [(13, 1), (14, 2), (15, 2)]]
STEP2 = [[(21, 3)], [(22, 2), (23, 1)]]


@pytest.mark.parametrize("stage, compile", [(2, False), (3, False), (3, True)], ids=["2", "3", "3-compiled"])
def test_sharded_steps_equal_one_process_on_all_data(ranks, stage, compile):
    """``compile``: learner.compile's fused norms and activation (learner/fused.py) under ZeRO-3's
    gathers and checkpointing give the eager reference's update."""
    probe = Reference(config(stage, clip=0.0).optimizer)
    _, norm = probe.step(shard(STEP1))
    cfg = config(stage, clip=0.5 * norm, compile=compile)  # clipping active on the first step
    ref = Reference(cfg.optimizer)
    build(ranks, cfg)
    before = gathered(ranks)
    assert all(torch.equal(before[n], p) for n, p in ref.weights().items())

    for data in (STEP1, STEP2):
        start = ref.weights()
        mbs = shard(data)
        metrics = step(ranks, mbs)
        ref_loss, ref_norm = ref.step(mbs)
        after = gathered(ranks)  # identical on both ranks
        assert metrics["train/skipped"] == 0.0
        assert metrics["train/micro_batches"] == sum(len(r) for r in data)
        assert metrics["train/loss"] == pytest.approx(ref_loss, rel=1e-5)
        assert metrics["train/nll"] == pytest.approx(ref_loss, rel=1e-5)
        assert metrics["train/nll_max"] == pytest.approx(ref.nll_max, rel=1e-5)  # a max over ranks, not a sum
        assert metrics["train/tokens"] == pytest.approx(1.0, rel=1e-6)  # Σ of globally normalised parts
        assert metrics["train/grad_norm"] == pytest.approx(ref_norm, rel=1e-4)
        assert_update_close(start, after, ref.weights())
    assert metrics["train/lr"] == pytest.approx(1e-2)  # second update: warm-up (2 steps) is over


@pytest.mark.parametrize("stage", [2, 3])
def test_non_finite_loss_or_grad_skips_the_step(ranks, stage):
    cfg = config(stage, clip=1.0)
    build(ranks, cfg)
    before = gathered(ranks)
    # NaN loss with finite gradients on rank 1 only, then a NaN gradient with finite loss on rank 0:
    # both ranks must skip, weights bit-identical, Adam moments and the lr schedule untouched
    for poisoned_rank, poison in ((1, "loss"), (0, "grad")):
        mbs = shard(STEP1)
        for mb in mbs[poisoned_rank]:
            mb["poison"] = poison
        metrics = step(ranks, mbs)
        assert metrics["train/skipped"] == 1.0
        after = gathered(ranks)
        assert all(torch.equal(before[n], after[n]) for n in before), f"{poison}: weights moved"
    assert metrics["train/skipped_total"] == 2.0
    # the next good step equals a first step from scratch (fresh moments, lr at warm-up position 0)
    ref = Reference(cfg.optimizer)
    mbs = shard(STEP1)
    metrics = step(ranks, mbs)
    ref_loss, ref_norm = ref.step(mbs)
    assert metrics["train/skipped"] == 0.0 and metrics["train/lr"] == pytest.approx(5e-3)
    assert metrics["train/grad_norm"] == pytest.approx(ref_norm, rel=1e-4)
    assert_update_close(before, gathered(ranks), ref.weights())


@pytest.mark.parametrize("stage", [2, 3])
def test_checkpoint_resume_equals_uninterrupted(ranks, stage, tmp_path):
    cfg = config(stage, clip=1.0)
    build(ranks, cfg)
    step(ranks, shard(STEP1))
    saved = gathered(ranks)
    client = {"version": 1, "cursor": 17}
    assert ray.get([a.save.remote(str(tmp_path), client) for a in ranks]) == ["step1", "step1"]
    write_state(
        tmp_path / "step1", {"format": FORMAT, "step": 1, "config": {}, "parameter_shapes": {}}
    )  # as the job does
    uninterrupted = step(ranks, shard(STEP2))
    expected = gathered(ranks)

    build(ranks, cfg, seed=1)  # fresh engines from other random weights
    assert ray.get([a.load.remote(str(tmp_path)) for a in ranks]) == [client, client]
    restored = gathered(ranks)
    assert all(torch.equal(saved[n], restored[n]) for n in saved)
    resumed = step(ranks, shard(STEP2))
    assert resumed == uninterrupted  # same loss, grad norm, lr (schedule position restored)
    result = gathered(ranks)
    assert all(torch.equal(expected[n], result[n]) for n in expected), "resumed step differs"


def test_a_checkpoint_resumes_at_another_rank_count_and_zero_stage(ranks, solo, tmp_path):
    """2 ranks ZeRO-2 -> 1 rank ZeRO-3 -> 2 ranks ZeRO-3 and ZeRO-2 (learner/reshard.py). What moves is exact:
    weights, fp32 masters and Adam moments bit for bit, the schedule position, the client state.
    The update after it equals the uninterrupted 2-rank run to fp32 rounding, not bit for bit: the
    rank count changes the order of the gradient and grad-norm sums (and of nothing else)."""
    from stabledrl.learner.engine import rank_rng_seed
    from stabledrl.learner.reshard import read_shards

    cfg2 = config(2, clip=1.0)
    build(ranks, cfg2)
    step(ranks, shard(STEP1))
    saved = gathered(ranks)
    client = {"step": 1, "version": 1, "cursor": 17}
    two, one = tmp_path / "two", tmp_path / "one"
    ray.get([a.save.remote(str(two), client) for a in ranks])
    write_state(two / "step1", {"format": FORMAT, "step": 1, "config": {}, "parameter_shapes": {}})
    uninterrupted = step(ranks, shard(STEP2))
    expected = gathered(ranks)

    def close(a: dict, b: dict) -> None:  # every element within fp32 rounding of the tensor's scale
        for n in a:
            assert (a[n] - b[n]).abs().max() <= 1e-6 * a[n].abs().max(), n

    cfg1 = config(3, clip=1.0).model_copy(update={"num_ranks": 1})
    build(solo, cfg1, seed=1)
    assert ray.get(solo[0].load.remote(str(two))) == client
    seed, resharded = ray.get(solo[0].rng.remote())
    assert resharded == (2, 2) and seed == rank_rng_seed(0, 1, 0)  # derived, not rank 0's saved stream
    restored = ray.get(solo[0].weights.remote())
    assert all(torch.equal(saved[n], restored[n]) for n in saved)
    ray.get(solo[0].save.remote(str(one), client))
    write_state(one / "step1", {"format": FORMAT, "step": 1, "config": {}, "parameter_shapes": {}})
    (a, adam_a), (b, adam_b) = read_shards(two / "step1"), read_shards(one / "step1")
    a, b = dict(a), dict(b)
    assert a.keys() == b.keys() and torch.equal(adam_a, adam_b)
    assert all(torch.equal(a[n][k], b[n][k]) for n in a for k in ("fp32", "exp_avg", "exp_avg_sq"))
    resumed, _ = ray.get(solo[0].step.remote([mb for rank in shard(STEP2) for mb in rank]))
    assert resumed["train/lr"] == uninterrupted["train/lr"] and resumed["train/micro_batches"] == 3
    assert resumed["train/loss"] == pytest.approx(uninterrupted["train/loss"], rel=1e-9)
    assert resumed["train/grad_norm"] == pytest.approx(uninterrupted["train/grad_norm"], rel=1e-6)
    close(expected, ray.get(solo[0].weights.remote()))

    for stage in (3, 2):  # and back to 2 ranks, ZeRO-3 and ZeRO-2, from the 1-rank checkpoint
        build(ranks, config(stage, clip=1.0), seed=1)
        assert ray.get([r.load.remote(str(one)) for r in ranks]) == [client, client]
        assert [s for s, _ in ray.get([r.rng.remote() for r in ranks])] == [rank_rng_seed(0, 1, r) for r in (0, 1)]
        restored = gathered(ranks)
        assert all(torch.equal(saved[n], restored[n]) for n in saved), stage
        moments = ray.get([r.moments.remote() for r in ranks])[0]  # read before any step: linked at the load
        assert all(torch.equal(moments[n][k], b[n][k]) for n in b for k in ("exp_avg", "exp_avg_sq")), stage
        again = step(ranks, shard(STEP2))
        assert again["train/loss"] == pytest.approx(uninterrupted["train/loss"], rel=1e-9)
        close(expected, gathered(ranks))
    # back at the shape of the uninterrupted run (2 ranks, ZeRO-2), via 1 rank: bit for bit
    assert again == uninterrupted
    result = gathered(ranks)
    assert all(torch.equal(expected[n], result[n]) for n in expected)

"""The optimisation options through the real learner (DeepSpeed on CPU, gloo, 2 ranks on Ray actors):
the lr schedule is what the updates use, LoRA trains only its adapters under ZeRO-2 and ZeRO-3, a
LoRA checkpoint resumes bit for bit, in a whole job (coordinator, rollout workers, weight push,
export) the workers and the exported model compute the learner's logits, and a LoRA job resumed
through the coordinator repeats the uninterrupted one.

Families: the tiny LLaDA and Dream presets (Dream has biased q/k/v projections and shifted logits).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

ray = pytest.importorskip("ray")

from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, LoraConfig, OptimizerConfig  # noqa: E402
from stabledrl.common.models import load_policy  # noqa: E402
from stabledrl.common.models.presets import build_tiny_policy  # noqa: E402
from stabledrl.common.trust.checkpoint_files import FORMAT  # noqa: E402
from stabledrl.coordinator.runtime.checkpoint import write_state  # noqa: E402
import harness  # noqa: E402
from stabledrl.learner.worker import LearnerWorker  # noqa: E402

pytestmark = pytest.mark.e2e

VOCAB, LENGTH = 97, 10
PROBE = torch.arange(3, 3 + LENGTH).repeat(2, 1)  # [2, L] ids whose logits the tests compare
LORA = LoraConfig(rank=4, alpha=8.0)


def micro_batches(step: int, rank: int) -> list[dict]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return [{"input_ids": torch.randint(3, VOCAB, (2, LENGTH), generator=g), "denominator": 4.0 * LENGTH}]


def ce_loss(model, mb: dict):
    logits = model(mb["input_ids"], logits_from=1).logits  # position 0 is no prediction for Dream
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), mb["input_ids"][:, 1:].flatten(),
                                            reduction="sum")
    return nll / mb["denominator"], {}


@ray.remote(num_cpus=0.5)
class LearnerRank:
    def __init__(self, rank: int) -> None:
        torch.set_num_threads(1)
        self.rank, self.engine = rank, None

    def rendezvous_address(self):
        from stabledrl.learner.group import rendezvous_address

        return rendezvous_address()

    def init_group(self, addr: str, port: int) -> None:
        from stabledrl.learner.group import init_learner_group

        init_learner_group(addr, port, self.rank, 2, backend="gloo", timeout_s=60)

    def build(self, cfg: LearnerConfig, family: str = "llada", seed: int = 0) -> None:
        from stabledrl.learner.engine import LearnerEngine

        self.engine = LearnerEngine(build_tiny_policy(family, vocab_size=VOCAB, seed=seed), cfg)

    def step(self, step: int) -> dict:
        return self.engine.train_step(micro_batches(step, self.rank), ce_loss)

    def raw_weights(self) -> dict:
        """Every parameter under its name in the engine (adapters and frozen bases apart), gathered."""
        from stabledrl.learner.zero import gathered_named_parameters

        named = gathered_named_parameters(self.engine.module, self.engine.cfg.deepspeed.zero_stage, 1 << 20, True)
        return {n: t.to("cpu", copy=True) for n, t in named}

    def offload(self) -> dict:
        """Whether DeepSpeed runs the optimizer (and the parameters) offloaded to the host."""
        engine = self.engine.engine
        return {"optimizer": bool(engine.zero_cpu_offload()),
                "params": bool(engine.zero_optimization_stage() == 3 and engine.zero_offload_param())}

    def adam_elements(self) -> int:
        """Elements of this rank's Adam first moments (its partition of the trained parameters)."""
        return sum(s["exp_avg"].numel() for s in self.engine.optimizer.state.values())

    def save(self, directory: str) -> str:
        return self.engine.save_checkpoint(directory, {"step": 1})

    def load(self, directory: str) -> dict:
        return self.engine.load_checkpoint(directory)


@pytest.fixture(scope="module")
def ranks(cluster):
    actors = [LearnerRank.remote(r) for r in range(2)]
    addr, port = ray.get(actors[0].rendezvous_address.remote())
    ray.get([a.init_group.remote(addr, port) for a in actors])
    return actors


def build(ranks, cfg: LearnerConfig, family: str = "llada", seed: int = 0) -> None:
    ray.get([a.build.remote(cfg, family, seed) for a in ranks])


def raw_weights(ranks) -> dict:
    """Rank 0's gathered parameters (every rank takes part in the ZeRO-3 gathers)."""
    return ray.get([r.raw_weights.remote() for r in ranks])[0]


def step(ranks, k: int) -> dict:
    a, b = ray.get([r.step.remote(k) for r in ranks])
    assert a == b
    return a


def learner_config(stage: int, **optimizer) -> LearnerConfig:
    return LearnerConfig(num_ranks=2, optimizer=OptimizerConfig(**{"lr": 1e-2, "eps": 1e-3, **optimizer}),
                         deepspeed=DeepSpeedConfig(zero_stage=stage, dtype="fp32", param_persistence_threshold=0,
                                                   gradient_checkpointing=stage == 3),
                         lora=LORA)


def test_the_updates_use_the_scheduled_lr(ranks):
    """Full fine-tuning, ZeRO-2: 4 updates of warm-up 1 then linear decay over 5, against torch's
    AdamW in this process with the lrs written out by hand."""
    opt = dict(lr=1e-2, eps=1e-3, weight_decay=0.1, grad_clip=0.0, warmup_steps=1, schedule="linear", total_updates=5)
    cfg = LearnerConfig(num_ranks=2, optimizer=OptimizerConfig(**opt),
                        deepspeed=DeepSpeedConfig(zero_stage=2, dtype="fp32"))
    build(ranks, cfg)
    reference = build_tiny_policy("llada", vocab_size=VOCAB, seed=0).train()
    from stabledrl.learner.zero import build_optimizer

    adam = build_optimizer(reference, cfg.optimizer)
    for k, lr in enumerate([1e-2, 1e-2, 7.5e-3, 5e-3]):  # k=0 warm-up end, then 1 - (k-1)/4
        metrics = step(ranks, k)
        assert metrics["train/lr"] == pytest.approx(lr, rel=1e-12)
        adam.zero_grad()
        sum(ce_loss(reference, mb)[0] for r in range(2) for mb in micro_batches(k, r)).backward()
        for group in adam.param_groups:
            group["lr"] = lr
        adam.step()
    learner = raw_weights(ranks)
    expected = {n: p.detach() for n, p in reference.named_parameters()}
    error = max(float((learner[n] - p).abs().max()) for n, p in expected.items())
    assert error < 1e-5, f"the engine's weights differ from AdamW at the scheduled lrs by {error:.2e}"


@pytest.mark.parametrize("stage, params", [(2, "none"), (3, "cpu")])
def test_cpu_offload_trains_as_adamw_does(ranks, stage, params):
    """learner.deepspeed.offload_optimizer: cpu (ZeRO-2; ZeRO-3 with offload_params: cpu too): the
    master weights and moments live on the host and torch's AdamW steps there; 3 full-parameter
    updates equal AdamW's in this process."""
    opt = dict(lr=1e-2, eps=1e-3, weight_decay=0.1, grad_clip=0.0)
    cfg = LearnerConfig(num_ranks=2, optimizer=OptimizerConfig(**opt),
                        deepspeed=DeepSpeedConfig(zero_stage=stage, dtype="fp32", param_persistence_threshold=0,
                                                  offload_optimizer="cpu", offload_params=params))
    build(ranks, cfg)
    offloaded = ray.get(ranks[0].offload.remote())
    assert offloaded == {"optimizer": True, "params": params == "cpu"}
    reference = build_tiny_policy("llada", vocab_size=VOCAB, seed=0).train()
    from stabledrl.learner.zero import build_optimizer

    adam = build_optimizer(reference, cfg.optimizer)
    for k in range(3):
        assert step(ranks, k)["train/skipped"] == 0.0
        adam.zero_grad()
        sum(ce_loss(reference, mb)[0] for r in range(2) for mb in micro_batches(k, r)).backward()
        adam.step()
    learner = raw_weights(ranks)
    error = max(float((learner[n] - p.detach()).abs().max()) for n, p in reference.named_parameters())
    assert error < 1e-5, f"the offloaded engine's weights differ from AdamW by {error:.2e}"


@pytest.mark.parametrize("stage, family", [(2, "llada"), (3, "llada"), (3, "dream")])
def test_lora_training_changes_only_the_adapters(ranks, stage, family):
    build(ranks, learner_config(stage), family)
    before = raw_weights(ranks)
    for k in range(3):
        assert step(ranks, k)["train/skipped"] == 0.0
    after = raw_weights(ranks)
    adapters = {n for n in before if ".lora_A." in n or ".lora_B." in n}
    assert adapters and before.keys() == after.keys()
    frozen = [n for n in before if n not in adapters]
    assert all(torch.equal(before[n], after[n]) for n in frozen), "a frozen weight moved"
    assert all(not torch.equal(before[n], after[n]) for n in adapters if ".lora_B." in n)
    # Adam's moments are the adapters' only (ZeRO pads each rank's partition by a few elements)
    trained = sum(after[n].numel() for n in adapters)
    held = sum(ray.get([r.adam_elements.remote() for r in ranks]))
    assert trained <= held < trained + 64 and held < 0.5 * sum(after[n].numel() for n in frozen)


@pytest.mark.parametrize("stage", [2, 3])
def test_a_lora_checkpoint_resumes_exactly(ranks, stage, tmp_path):
    cfg = learner_config(stage, warmup_steps=1, schedule="linear", total_updates=6)
    build(ranks, cfg)
    step(ranks, 0)
    saved = raw_weights(ranks)
    assert ray.get([r.save.remote(str(tmp_path)) for r in ranks]) == ["step1", "step1"]
    write_state(
        tmp_path / "step1", {"format": FORMAT, "step": 1, "config": {}, "parameter_shapes": {}}
    )  # as the job does
    uninterrupted = [step(ranks, k) for k in (1, 2)]
    expected = raw_weights(ranks)

    build(ranks, cfg)  # a fresh engine on the same model.path: adapters back at their initial values
    fresh = raw_weights(ranks)
    assert any(not torch.equal(fresh[n], saved[n]) for n in saved if ".lora_B." in n)
    ray.get([r.load.remote(str(tmp_path)) for r in ranks])
    restored = raw_weights(ranks)
    assert all(torch.equal(saved[n], restored[n]) for n in saved)
    resumed = [step(ranks, k) for k in (1, 2)]
    assert resumed == uninterrupted  # loss, grad norm and the lr's schedule position
    assert [m["train/lr"] for m in resumed] == pytest.approx([1e-2, 1e-2 * 4 / 5])  # updates 1, 2 of W=1, T=6
    result = raw_weights(ranks)
    assert all(torch.equal(expected[n], result[n]) for n in expected), "the resumed steps differ"
    # the checkpoint holds what trains, not the frozen model
    import glob

    states = glob.glob(str(tmp_path / "step1" / "*model_states.pt"))
    module = torch.load(states[0], map_location="cpu", weights_only=False)["module"]
    assert module is None or all(".lora_" in n for n in module), sorted(module)[:4]


# ---- a whole job with LoRA -------------------------------------------------------------------
class LoraLearner(LearnerWorker):
    def pushed(self):
        return self.engine.state_dict_for_push()  # rank 0: the merged adapted matrices (collective)

    def exported(self):
        return self.engine.state_dict_for_export()  # rank 0: the whole merged policy (collective)

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # every rank runs the forward: ZeRO-3 gathers are collective
            return self.engine.module(ids, logits_from=1).logits.float()


class LoraRollout(harness.InspectedRollout):
    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.engine.policy(ids, logits_from=1).logits.float()


def lora_config(out, family: str, backend: str, push: str, **sections):
    """A LoRA job under ZeRO-3 (2 ranks, 1 rollout worker); ``sections`` update the sections key by key."""
    learner = {"deepspeed": {"zero_stage": 3, "param_persistence_threshold": 0},
               "lora": {**LORA.model_dump(), "push": push}, **sections.pop("learner", {})}
    return harness.job_config(out, model={"preset": f"tiny-{family}"}, learner=learner, weights={"backend": backend},
                              rollout={"num_workers": 1}, **sections)


def run_lora_job(cfg, final_save: bool) -> SimpleNamespace:
    """Train, let the rollouts land, save (``final_save``: a checkpoint after the last step), export;
    then what the learner pushes and exports, its logits of PROBE, and each worker's weights and logits."""
    from stabledrl.coordinator.driver import Driver

    driver = Driver(cfg, rollout_cls=LoraRollout, learner_cls=LoraLearner)
    driver.setup()
    try:
        driver.train()
        driver.drain()
        if final_save:
            driver.save_checkpoint()
        driver.export()
        driver.finish_checkpoint(120)  # as Driver.run: the background write completes before the close
        learners = driver.actors.learners
        pushed = ray.get([a.pushed.remote() for a in learners])[0]
        exported = ray.get([a.exported.remote() for a in learners])[0]
        learner_logits = ray.get([a.logits.remote(PROBE) for a in learners])[0]
        workers = ray.get([w.weights.remote() for w in driver.active_rollouts()])
        worker_logits = ray.get([w.logits.remote(PROBE) for w in driver.active_rollouts()])
    finally:
        driver.close()
    return SimpleNamespace(cfg=cfg, out=cfg.run.output_dir, driver=driver, pushed=pushed, exported=exported,
                           learner_logits=learner_logits, workers=workers, worker_logits=worker_logits)


def resumable(out, **run):
    """η = 0, in-order batches, a linear lr decay: 3 steps, a checkpoint after step 2 (Dream, the adapters
    pushed by gloo)."""
    return lora_config(out, "dream", "gloo", "adapters", task={"source": {"kind": "generated", "n": 64}},
                       algorithm={"max_staleness": 0, "in_order": True},
                       learner={"optimizer": {"lr": 1e-2, "schedule": "linear"}},
                       run={"steps": 3, "checkpoint_every": 2, **run})


@pytest.fixture(scope="module")
def adapters_job(cluster, tmp_path_factory):
    """The ``push: adapters`` job, which is also the uninterrupted run a resumed job repeats: its
    checkpoint is the one after step 2 (no save after the last step)."""
    return run_lora_job(resumable(tmp_path_factory.mktemp("straight")), final_save=False)


@pytest.mark.parametrize("family, backend, push", [("llada", "object_store", "merged"), ("dream", "gloo", "adapters")])
def test_a_lora_job_pushes_what_changed_and_exports_the_merged_model(cluster, request, tmp_path, family, backend,
                                                                    push):
    """``push: merged``: the merged adapted matrices travel; ``adapters`` (the default): only A and
    B, which the workers hold unmerged (the gloo push is received at the first push, which builds
    the group, and staged at the second). The merged job trains 2 steps and saves after the last;
    the adapters job is ``adapters_job`` (3 steps, its checkpoint after step 2)."""
    if push == "adapters":
        job = request.getfixturevalue("adapters_job")
    else:
        job = run_lora_job(lora_config(tmp_path, family, backend, push, run={"steps": 2}), final_save=True)
    assert job.cfg.model.preset == f"tiny-{family}" and job.cfg.learner.lora.push == push
    cfg, out, driver, pushed, exported = job.cfg, job.out, job.driver, job.pushed, job.exported
    learner_logits, workers, worker_logits = job.learner_logits, job.workers, job.worker_logits
    # its checkpoint passes a resume's checks, and only with the same adapters
    from stabledrl.coordinator.runtime import checkpoint

    config = driver.config_json()
    assert checkpoint.verify(checkpoint.checkpoint_dir(out), config).tag == "step2"
    config["learner"]["lora"]["rank"] = 8
    with pytest.raises(checkpoint.CheckpointError, match=r"learner\.lora\.rank: checkpoint 4, config 8"):
        checkpoint.verify(checkpoint.checkpoint_dir(out), config)

    initial, _ = load_policy(cfg.model)
    initial_logits = initial(PROBE, logits_from=1).logits
    adapted = {f"{n}.weight" for n, m in initial.named_modules() if n.rsplit(".", 1)[-1] in LORA.target_modules}
    if push == "merged":
        assert set(pushed) == adapted  # the push carries the adapted matrices and nothing else
    else:  # A [r, in] and B [out, r] of every adapted module, and nothing else
        assert set(pushed) == {n[: -len(".weight")] + s for n in adapted for s in (".lora_A", ".lora_B")}
        shapes = dict(initial.named_parameters())
        for name in adapted:
            a, b = pushed[name[: -len(".weight")] + ".lora_A"], pushed[name[: -len(".weight")] + ".lora_B"]
            assert a.shape == (LORA.rank, shapes[name].shape[1]) and b.shape == (shapes[name].shape[0], LORA.rank)
        assert sum(t.numel() for t in pushed.values()) < 0.5 * sum(shapes[n].numel() for n in adapted)
    for version, weights in workers:
        assert version == cfg.run.steps
        for name, p in initial.named_parameters():
            if name in adapted and push == "merged":  # merged on the learner: the export's bits
                assert torch.equal(weights[name], exported[name]) and not torch.equal(p, exported[name])
            else:  # frozen (the adapters' workers hold W as loaded, and A and B beside it)
                assert torch.equal(weights[name], p), f"{name} is frozen and was not pushed, yet it changed"
        if push == "adapters":
            assert all(torch.equal(weights[n], t) for n, t in pushed.items())
    for logits in worker_logits:  # the learner runs W·x + s·B·(A·x): so do the adapters' workers, merged (W + s·B·A)·x
        assert not torch.allclose(logits, initial_logits, atol=1e-4)
        torch.testing.assert_close(logits, learner_logits, rtol=1e-4, atol=1e-5)
    for record in driver.history:
        assert record["learner/trained_parameters"] < 0.5 * record["learner/parameters"]
        assert math.isfinite(record["time/weight_push"])
        # every rank's own peak reaches the record, which otherwise holds rank 0's values
        ranks = {k.rsplit("/", 1)[-1] for k in record if k.startswith("learner/peak_rss_gb/")}
        assert ranks == {"rank0", "rank1"}
        assert all(0.1 < record[f"learner/peak_rss_gb/rank{r}"] < 64 for r in (0, 1))

    # the export is a plain checkpoint of the merged policy, read back by the loader
    model, _ = load_policy(cfg.model.model_copy(update={"path": out / "final_model", "preset": None}))
    assert {n: p for n, p in model.named_parameters()}.keys() == exported.keys()
    assert all(torch.equal(p, exported[n]) for n, p in model.named_parameters())
    assert push == "adapters" or all(torch.equal(exported[n], pushed[n]) for n in pushed)
    # and the adapters themselves, a PEFT folder for the base (model.path): the learner's A and B
    from stabledrl.common.models.adapter_folder import read_adapter_folder

    folder = read_adapter_folder(out / "final_adapter", family)
    assert (folder.rank, folder.alpha) == (LORA.rank, LORA.alpha)
    held = {f"model.{p}{s}": t for p, pair in folder.pairs.items() for s, t in zip((".lora_A", ".lora_B"), pair)}
    assert held.keys() == {n[: -len(".weight")] + s for n in adapted for s in (".lora_A", ".lora_B")}
    assert push == "merged" or all(torch.equal(held[n], pushed[n]) for n in pushed)
    torch.testing.assert_close(model(PROBE, logits_from=1).logits, learner_logits, rtol=1e-4, atol=1e-5)


class MergedLearner(LearnerWorker):
    def weights(self):
        # rank 0: every weight of the merged policy, and the adapters A and B it pushes (collective)
        merged, adapters = self.engine.state_dict_for_export(), self.engine.state_dict_for_push()
        return None if merged is None else {**merged, **adapters}


def test_a_resumed_lora_job_repeats_the_uninterrupted_one(adapters_job, tmp_path):
    """η = 0, in-order batches, ZeRO-3, a linear lr decay: the 3 steps of ``adapters_job``, against
    its steps 1-2, its checkpoint, and step 3 in a second job resumed from it (the frozen weights
    come from the preset again, the adapters, Adam's moments and the schedule position from the
    checkpoint)."""
    straight = adapters_job.driver
    straight_weights = {**adapters_job.exported, **adapters_job.pushed}  # what MergedLearner.weights gives
    resumed, weights, workers = harness.run_driver(
        resumable(tmp_path / "resumed", resume_from=adapters_job.out / "checkpoints"), learner_cls=MergedLearner,
        workers=True)
    assert [r["version"] for r in resumed.history] == [3.0]
    for key in (*harness.DETERMINISTIC, "train/lr"):
        assert resumed.history[0][key] == straight.history[2][key], key
    assert straight.history[2]["train/lr"] == pytest.approx(1e-2 / 3)  # update 2 of 3: 1 - 2/3
    assert weights.keys() == straight_weights.keys()
    assert all(torch.equal(weights[n], straight_weights[n]) for n in weights), "the resumed step differs"
    adapted = {n.removesuffix(".lora_A") + ".weight" for n in weights if n.endswith(".lora_A")}
    assert adapted
    for version, held in workers:  # the adapters, and every weight but the adapted ones (merged, frozen there)
        assert version == 3 and held.keys() == weights.keys()
        assert all(torch.equal(held[n], weights[n]) for n in weights if n not in adapted)


def test_a_d1_shaped_lora_job_forwards_two_micro_batches_at_once_to_the_same_update(cluster, tmp_path):
    """d1's learner in a whole job: LoRA under ZeRO-2 over 2 ranks, mean-field estimates, GRPO with
    its KL to the frozen base (the adapters off, no second model), micro_batch normalisation, 2
    micro-batches of 4 rows a rank, μ = 2. Forwarding the two together (learner.micro_batches_per_forward
    2) gives the losses, the KL and the weights of one forward each."""
    from stabledrl.common.config.base import validate
    from stabledrl.common.config.job import JobConfig

    def config(out, per_forward):
        cfg = harness.job_config(
            out,
            algorithm={"max_staleness": 0, "in_order": True, "micro_batch_size": 4, "inner_iterations": 2},
            learner={"lora": LORA.model_dump(), "loss_normalisation": "micro_batch",
                     "micro_batches_per_forward": per_forward, "optimizer": {"lr": 1e-3, "eps": 1e-3},
                     "deepspeed": {"zero_stage": 2, "dtype": "fp32"}},
            rollout={"num_workers": 1}, run={"steps": 1})
        return validate(JobConfig, {**cfg.model_dump(), "estimator": {"name": "mean_field"},
                                    "loss": {"name": "grpo", "kl_beta": 0.04, "level": "token"}})

    runs = [harness.run_driver(config(tmp_path / f"k{k}", k), learner_cls=MergedLearner) for k in (1, 2)]
    (one, one_weights, _), (two, two_weights, _) = runs
    first, second = one.history[0], two.history[0]
    assert first["train/micro_batches"] == 4 and second["train/micro_batches"] == 2  # forwards over both ranks
    assert first["train/kl/k3_mean"] > 0  # the second iteration's adapters moved away from the base
    for key in ("train/loss", "train/loss_first", "train/kl/k3_mean", "train/grad_norm", "rollout/reward_mean"):
        assert second[key] == pytest.approx(first[key], rel=1e-4, abs=1e-9), key
    assert one_weights.keys() == two_weights.keys()
    for name in one_weights:
        torch.testing.assert_close(two_weights[name], one_weights[name], rtol=1e-4, atol=1e-6)

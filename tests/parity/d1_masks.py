"""Check: ``estimator.masks: per_iteration`` draws d1's masks and takes d1's loss, iteration by iteration.

    python tests/parity/d1_masks.py --d1 ~/d1 [--iterations 4]

d1's own functions run from the checkout given (``diffu-grpo/diffu_grpo_trainer.py``:
``forward_process``, ``_get_per_token_logps``, ``compute_loss``, ``_prepare_inputs``), on an instance
made without TRL's constructor; the modules that file imports from TRL and wandb are stubbed (their
classes and decorators are not called by those functions). Both sides use the fp32 tiny LLaDA of
tests/parity/d1_generate.py (d1 calls it as ``model(ids).logits``), a reference model of other
weights for the KL term, and two of d1's micro-batches (its GSM8K config's gradient accumulation):
the 6 completions of each of two prompts.

The project side is the learner itself: ``LearnerWorker._updates`` with d1's GSM8K loss settings
(grpo, token level, clip 0.5, KL 0.04, per micro-batch token mean) and an engine whose update is a
plain SGD step. The d1 side gets, for each micro-batch, the μ seeds the project derives for it as
its ``mask_seeds``, scores its old and reference log-probs under all of them before any update (as
its ``_generate_and_score_completions`` does), then runs the μ updates through its own
``_prepare_inputs`` and TRL's counters, which pick the mask each micro-step reads. Compared: the
mask index and the prompt positions masked at each (iteration, micro-batch), the loss of each
iteration and the weights after the last update. Printed too: the index d1 reads over a round of
μ = 12 with gradient accumulation 2 (each micro-batch meets 6 of its 12 masks, twice each), and how
many old-policy forwards the project's scoring pass ran (once per mask a micro-batch meets).

Prints one JSON line; exits 1 on a difference. ``project_figures()`` is what
tests/unit/learner/test_per_iteration_masks.py pins to the figures printed here.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.machinery
import importlib.util
import json
import sys
import types
from collections import defaultdict
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
PROMPT, COMPLETION, ROWS, LR = 9, 12, 6, 0.05
GROUPS = 2  # d1's micro-batches a update on a device (its GSM8K config's gradient accumulation)
CLIP, KL, P_MASK = 0.5, 0.04, 0.15


def _generate_module():
    spec = importlib.util.spec_from_file_location("d1_generate_parity", HERE / "d1_generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_case(groups: int = 1):
    """(policy, reference, group): the tiny fp32 LLaDA, another one for the KL term, and 6 completions
    of one prompt with their first EOS at different places (EOS-filled after it, as the sampler leaves
    them); ``groups`` > 1: a list of that many groups, each of its own prompt (d1's micro-batches)."""
    from stabledrl.common.types import Group, Sample

    gen = _generate_module()
    policy, _, _ = gen.tiny_case()
    reference = copy.deepcopy(policy)
    with torch.no_grad():
        for i, p in enumerate(reference.parameters()):
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(500 + i)))
    g = torch.Generator().manual_seed(11)
    out = []
    for m in range(groups):
        prompt = torch.cat([torch.tensor([gen.BOS]), torch.randint(4, gen.VOCAB, (PROMPT - 1,), generator=g)])
        samples = []
        for i in range(ROWS):
            length = 4 + (i * 3 + m) % (COMPLETION - 3)  # up to and including the first EOS
            body = torch.randint(4, gen.VOCAB, (COMPLETION,), generator=g)
            body[length - 1:] = gen.EOS
            samples.append(Sample(sample_id=f"q{m}/{i}", prompt_id=f"q{m}", index=i, prompt_ids=prompt,
                                  completion_ids=body, completion_length=length,
                                  reward=float((i + m) % 3 == 0) + 0.5 * float(i % 2), mask_seed=1000 + 100 * m + i))
        out.append(Group(f"q{m}", samples))
    return policy, reference, (out[0] if groups == 1 else out)


class _SgdEngine:
    """The two engine calls ``LearnerWorker._updates`` makes, on one process: evaluate without grad;
    train_step as a sum of micro-batch losses, then p -= LR * grad."""

    def __init__(self, policy):
        self.policy, self.losses, self.scoring_forwards = policy, [], 0

    def evaluate(self, mbs, fn):
        hook = self.policy.register_forward_hook(lambda *_: setattr(self, "scoring_forwards",
                                                                      self.scoring_forwards + 1))
        try:
            with torch.no_grad():
                return [fn(self.policy, mb) for mb in mbs]
        finally:
            hook.remove()

    def train_step(self, mbs, loss_fn):
        total = sum(loss_fn(self.policy, mb)[0] for mb in mbs)
        total.backward()
        with torch.no_grad():
            for p in self.policy.parameters():
                if p.grad is not None:
                    p.sub_(LR * p.grad)
                    p.grad = None
        self.losses.append(float(total.detach()))
        return {}


def project_figures(iterations: int) -> dict:
    """The project's masks, mask indices and seeds on ``tiny_case(GROUPS)``, each iteration's loss,
    the scoring pass's old-policy forwards and a weight checksum after the step."""
    from stabledrl.common.config.estimator import MeanFieldConfig
    from stabledrl.common.config.learner import LearnerConfig
    from stabledrl.common.config.loss import GrpoLossConfig
    from stabledrl.common.config.model import ModelConfig
    from stabledrl.common.estimators import learner_seeds, per_iteration_index
    from stabledrl.common.estimators.mean_field import mean_field_views
    from stabledrl.learner.rl_batch import global_counts, micro_batches
    from stabledrl.learner.worker import LearnerWorker

    policy, reference, groups = tiny_case(GROUPS)
    estimator = MeanFieldConfig(masks="per_iteration", prompt_mask_prob=P_MASK)
    worker = LearnerWorker(0, 1, ModelConfig(preset="tiny-llada"), LearnerConfig(loss_normalisation="micro_batch"),
                           estimator, GrpoLossConfig(clip_eps=CLIP, kl_beta=KL, level="token"),
                           inner_iterations=iterations, advantage_scale="none", micro_batch_size=ROWS)
    worker.reference, worker.pad_token_id = reference, 0
    worker.engine = _SgdEngine(policy)
    worker._updates(groups, version=0, group_offset=0)
    mbs = micro_batches(groups, group_offset=0, pad_token_id=0, advantage_scale="none", micro_batch_size=ROWS,
                        whole_groups=False, counts=global_counts(groups))
    index, masks = [], []
    for k in range(iterations):
        index.append([per_iteration_index(k, mb.unit, mb.units, iterations) for mb in mbs])
        row = []
        for mb in mbs:
            mb_k = mb.for_iteration("per_iteration", k, iterations)
            views = mean_field_views(mb_k.batch, mb_k.seeds, estimator)
            row.append([views.prompt[i, 0].nonzero().flatten().tolist() for i in range(ROWS)])
        masks.append(row)
    # each micro-batch's μ seeds by mask index: what d1 draws per generated batch (its mask_seeds)
    seeds = [[int(learner_seeds(mb.mask_seeds, "per_iteration", i)[0]) for i in range(iterations)] for mb in mbs]
    return {"seeds": seeds, "index": index, "masks": masks, "losses": worker.engine.losses,
            "weights": _checksum(policy), "scoring_forwards": worker.engine.scoring_forwards}


def _checksum(model) -> float:
    return float(sum(p.detach().double().abs().sum() for p in model.parameters()))


# ---- d1's side --------------------------------------------------------------------------------------
def _stub_trl() -> None:
    """The names diffu_grpo_trainer.py imports from TRL and wandb (none is called by the functions run)."""
    def module(name: str, **attrs) -> None:
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)  # libraries probe optional imports by spec
        m.__dict__.update(attrs)
        sys.modules[name] = m

    unused = lambda *a, **k: None  # noqa: E731
    module("trl")
    module("trl.trainer")
    module("trl.trainer.grpo_trainer", GRPOTrainer=type("GRPOTrainer", (), {}))
    module("trl.trainer.grpo_config", GRPOConfig=type("GRPOConfig", (), {}))
    module("trl.extras")
    module("trl.extras.profiling", profiling_decorator=lambda f: f,
           profiling_context=lambda *a: contextlib.nullcontext())
    module("trl.import_utils", is_rich_available=lambda: False, is_vllm_available=lambda: False)
    module("trl.data_utils", apply_chat_template=unused, is_conversational=unused, maybe_apply_chat_template=unused)
    module("trl.models", create_reference_model=unused, prepare_deepspeed=unused, unwrap_model_for_generation=unused)
    module("trl.trainer.utils", generate_model_card=unused, get_comet_experiment_url=unused, pad=unused,
           print_prompt_completions_sample=unused, selective_log_softmax=unused)
    module("wandb")


def _d1_trainer(d1_dir: Path, iterations: int):
    _stub_trl()
    spec = importlib.util.spec_from_file_location("d1_diffu_grpo_trainer",
                                                  d1_dir / "diffu-grpo" / "diffu_grpo_trainer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gen = _generate_module()
    trainer = object.__new__(module.DiffuGRPOTrainer)
    trainer.args = types.SimpleNamespace(num_iterations=iterations, p_mask_prompt=P_MASK, mask_id=gen.MASK,
                                         cfg_scale=0.0, gradient_accumulation_steps=2)
    trainer.num_iterations, trainer.beta, trainer.epsilon = iterations, KL, CLIP
    trainer.control = types.SimpleNamespace(should_evaluate=False)
    trainer.accelerator = types.SimpleNamespace(gather_for_metrics=lambda t: t)
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    return trainer


class _Logits(torch.nn.Module):
    """The policy as d1 calls a model: ``model(ids).logits`` over every position."""

    def __init__(self, policy):
        super().__init__()
        self.policy = policy

    def forward(self, ids):
        return self.policy(ids)


def d1_figures(d1_dir: Path, iterations: int, seeds: list[list[int]]) -> dict:
    """d1's masks, mask indices, losses and weights on ``tiny_case(GROUPS)``: each group one of d1's
    micro-batches, generated with the μ mask seeds ``seeds[m]`` and scored as its
    ``_generate_and_score_completions`` scores (old and reference under all μ masks), then the μ
    updates driven through d1's own ``_prepare_inputs`` and counters (gradient accumulation
    GROUPS, each micro-step's loss over GROUPS as the HF Trainer scales it, then the SGD step)."""
    policy, reference, groups = tiny_case(GROUPS)
    trainer = _d1_trainer(d1_dir, iterations)
    model, ref = _Logits(policy), _Logits(reference)
    prompt_index = torch.arange(PROMPT + COMPLETION) < PROMPT
    generated = []
    for group, group_seeds in zip(groups, seeds):
        prompt_ids = torch.stack([s.prompt_ids for s in group.samples])
        completion_ids = torch.stack([s.completion_ids for s in group.samples])
        expanded = torch.cat([prompt_ids, completion_ids], dim=1).unsqueeze(0).expand(iterations, -1, -1)
        with torch.no_grad():
            old = trainer._get_per_token_logps(model, expanded, COMPLETION, group_seeds)
            ref_logps = trainer._get_per_token_logps(ref, expanded, COMPLETION, group_seeds)
        rewards = torch.tensor([s.reward for s in group.samples])
        completion_mask = torch.stack([(torch.arange(COMPLETION) < s.completion_length).int()
                                       for s in group.samples])
        generated.append({"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids),
                          "completion_ids": completion_ids, "completion_mask": completion_mask,
                          "old_per_token_logps": old, "ref_per_token_logps": ref_logps,
                          "advantages": rewards - rewards.mean(), "mask_seeds": group_seeds})
    feed = iter(generated)
    trainer._generate_and_score_completions = lambda inputs: next(feed)
    trainer._step, trainer._buffered_inputs = 0, [None] * GROUPS
    trainer.state = types.SimpleNamespace(global_step=0)
    index, masks, losses = [], [], []
    for k in range(iterations):
        trainer.state.global_step = k
        index.append([]), masks.append([])
        total = 0.0
        for _ in range(GROUPS):
            inputs = trainer._prepare_inputs({})
            i = trainer._step % iterations  # the index its compute_loss reads
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            noisy, _ = trainer.forward_process(ids, prompt_index, trainer.args.mask_id, seed=inputs["mask_seeds"][i])
            index[-1].append(i)
            masks[-1].append([(noisy[r, :PROMPT] == trainer.args.mask_id).nonzero().flatten().tolist()
                              for r in range(ROWS)])
            loss = trainer.compute_loss(model, inputs) / GROUPS
            loss.backward()
            total += float(loss.detach())
        with torch.no_grad():
            for p in policy.parameters():
                if p.grad is not None:
                    p.sub_(LR * p.grad)
                    p.grad = None
        losses.append(total)
    return {"index": index, "masks": masks, "losses": losses, "weights": _checksum(policy),
            "iteration_index": d1_iteration_index(trainer, 12, 2)}


def d1_iteration_index(trainer, iterations: int, accumulation: int) -> list[list[int]]:
    """The mask index d1's compute_loss reads, [optimizer step][micro-step], over one round of
    ``iterations`` steps: d1's ``_prepare_inputs`` driven as the HF Trainer drives it (global_step
    advancing after each accumulation cycle, TRL's ``_step`` from 0)."""
    trainer.args.gradient_accumulation_steps, trainer.num_iterations = accumulation, iterations
    trainer.args.num_iterations = iterations
    trainer._step, trainer._buffered_inputs = 0, [None] * accumulation
    trainer._generate_and_score_completions = lambda inputs: {}
    trainer.state = types.SimpleNamespace(global_step=0)
    out = []
    for step in range(iterations):
        trainer.state.global_step = step
        row = []
        for _ in range(accumulation):
            trainer._prepare_inputs({})
            row.append(trainer._step % iterations)
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d1", required=True, help="a checkout of dllm-reasoning/d1 (its diffu-grpo/ trainer is run)")
    ap.add_argument("--iterations", type=int, default=4, help="inner iterations μ of the step compared")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    ours = project_figures(args.iterations)
    theirs = d1_figures(Path(args.d1).expanduser(), args.iterations, ours["seeds"])
    same_masks = ours["masks"] == theirs["masks"] and ours["index"] == theirs["index"]
    loss_error = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours["losses"], theirs["losses"]))
    weight_error = abs(ours["weights"] - theirs["weights"]) / theirs["weights"]
    ok = same_masks and loss_error < 1e-5 and weight_error < 1e-6
    print(json.dumps({"ok": ok, "seeds": ours["seeds"], "same_masks": same_masks, "d1_index": theirs["index"],
                      "d1_masks": theirs["masks"], "d1_losses": theirs["losses"], "project_losses": ours["losses"],
                      "loss_max_rel_error": loss_error, "d1_weights": theirs["weights"],
                      "project_weights": ours["weights"], "weight_rel_error": weight_error,
                      "project_scoring_forwards": ours["scoring_forwards"],
                      "d1_iteration_index_mu12_ga2": theirs["iteration_index"]}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Every published recipe (deploy/configs/recipe_*.yaml) runs 2 steps end to end on CPU: real Ray
actors, a DeepSpeed learner on gloo, a tiny checkpoint of the recipe's family at the released
vocabulary with the family's real chat template. Only what sets the shape is overridden (the model,
lengths, batch sizes, one learner rank and one rollout worker on CPU, local data files, no checkpoint
or export); the rest runs as shipped: estimator, loss, optimizer and schedule, LoRA, μ, rewards,
templates, and the d1 protocol evaluated on the rollout workers before and after training
(eval.protocol)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from stabledrl.common.config.job import load_job_config  # noqa: E402
from stabledrl.common.models import load_tokenizer  # noqa: E402
from stabledrl.common.models.release_tokenizers import write_tiny_release_checkpoint  # noqa: E402
from stabledrl.coordinator.driver import Driver  # noqa: E402
from stabledrl.recipes.stages import JOB_STAGES  # noqa: E402

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
RECIPES = {  # config -> (family, the first tokens of every prompt: the chat template's opening)
    "recipe_stabledrl_llada8b_gsm8k.yaml": ("llada", "<|startoftext|><|start_header_id|>user<|end_header_id|>"),
    "recipe_stabledrl_llada8b_math.yaml": ("llada", "<|startoftext|><|start_header_id|>user<|end_header_id|>"),
    "recipe_d1_llada8b_gsm8k_lora.yaml": ("llada", "<|startoftext|><|start_header_id|>user<|end_header_id|>"),
    "recipe_trado8b_math_staircase.yaml": ("sdar", "<|im_start|>user\n"),
}


RAY_CPUS = 2  # the logical CPUs of its Ray instance (tests/e2e/conftest.py)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def data_overrides(name: str, root: Path) -> list[str]:
    """The recipe's data as tiny local files in its own columns, and its protocol benchmark on them."""
    file = lambda path, **columns: json.dumps({"kind": "file", "path": path, "columns": columns})  # noqa: E731
    gsm = write_jsonl(root / "gsm.jsonl", [{"question": f"What is {a} plus {b}?", "answer": f"{a}+{b}\n#### {a + b}"}
                                           for a, b in ((2, 3), (4, 1), (6, 2), (1, 1))])
    if "trado" in name:
        train = write_jsonl(
            root / "math_train.jsonl",
            [{"question": f"What is {a}+{a}?", "ground_truth_answer": str(2 * a)} for a in range(1, 5)],
        )
        held = write_jsonl(root / "math500.jsonl", [{"problem": "What is 1+1?", "answer": "2"},
                                                    {"problem": "What is 3+3?", "answer": "6"}])
        return [f"task.source={file(train, prompt='question', answer='ground_truth_answer')}",
                f"task.held_out_source={file(held, prompt='problem', answer='answer')}", "eval.num_prompts=2"]
    if "math" in name:
        math = write_jsonl(
            root / "math.jsonl",
            [{"problem": f"What is {a}+{a}?", "solution": f"It is $\\boxed{{{2 * a}}}$.", "level": f"Level {a}"}
             for a in range(1, 5)],  # levels 1-4: the recipe keeps MATH's levels up to 4, as the release
        )
        return [f"task.source={file(math, prompt='problem', answer='solution')}",
                "eval.protocol.benchmarks=" + json.dumps({"math500": {"source": json.loads(file(math, prompt="problem",
                                                                                             answer="solution")),
                                                                      "num_prompts": 2}})]
    return [f"task.source={file(gsm, prompt='question')}",
            "eval.protocol.benchmarks=" + json.dumps({"gsm8k": {"source": json.loads(file(gsm, prompt="question")),
                                                                "num_prompts": 2}})]


def shape_overrides(name: str, model: Path, out: Path) -> list[str]:
    block = ["sampler.block_length=8", "sampler.steps=4"] if "trado" not in name else []
    if "stabledrl" in name:
        block.append("estimator.block_length=8")  # the SPG masks follow the sampler's blocks
    protocol = ["eval.protocol.gen_lengths=[8]", "eval.protocol.block_length=8"] if "trado" not in name else []
    return [
        f"model.path={model}", "model.dtype=float32", "model.checkpointed_layers=null",  # the tiny model has 2 layers
        "sampler.gen_length=8", *block, "sampler.max_batch_size=8",
        # compiled forwards are tested where they are the subject (tests/unit/rollout/test_sampler_compile.py,
        # tests/unit/learner/test_learner_fused.py, test_learner_engine's compiled ZeRO-3 steps); here each
        # recipe's new tiny shapes would cost inductor's CPU build about 25 s on a machine without its cache
        "sampler.compile=false", "learner.compile=false",
        "algorithm.group_size=2", "algorithm.groups_per_step=1", "algorithm.micro_batch_size=2",
        "rollout.num_workers=1", "rollout.prompts_per_request=1", "rollout.request_timeout_s=300",
        "learner.num_ranks=1", "learner.dist_timeout_s=300", "learner.deepspeed.dtype=fp32",
        "learner.deepspeed.param_persistence_threshold=0",
        "cluster.learner={num_cpus: 0.5, num_gpus: 0}", "cluster.rollout={num_cpus: 0.5, num_gpus: 0}",
        "cluster.start_timeout_s=300", "weights.backend=object_store", *protocol,
        "run.steps=2", f"run.output_dir={out}", "run.progress=false", "run.tensorboard=false",
        "run.checkpoint_every=0", "run.save_final_checkpoint=false", "run.export_final=false",
    ]


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
    """family -> its tiny release checkpoint, written once for the recipes of that family (they only read it)."""
    written: dict[str, Path] = {}

    def checkpoint(family: str) -> Path:
        if family not in written:
            written[family] = write_tiny_release_checkpoint(family, tmp_path_factory.mktemp(family) / "model")
        return written[family]

    return checkpoint


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_recipe_trains_two_steps_on_cpu_with_its_chat_template(cluster, tiny_checkpoints, tmp_path, name):
    family, opening = RECIPES[name]
    model = tiny_checkpoints(family)
    shipped = load_job_config(ROOT / "deploy" / "configs" / name)
    cfg = load_job_config(ROOT / "deploy" / "configs" / name,
                          shape_overrides(name, model, tmp_path / "run") + data_overrides(name, tmp_path))
    for section in ("estimator", "loss"):  # the method runs as shipped (the SPG masks follow the tiny blocks)
        assert cfg.model_dump()[section] == {
            **shipped.model_dump()[section],
            **({"block_length": 8} if section == "estimator" and "stabledrl" in name else {}),
        }
    schedule = cfg.learner.optimizer.model_dump(exclude={"total_updates"})  # a decay spans the (2-step) run
    assert schedule == shipped.learner.optimizer.model_dump(exclude={"total_updates"})
    assert cfg.learner.lora == shipped.learner.lora
    driver = Driver(cfg, record_batches=True, stages=JOB_STAGES)
    result = driver.run()
    assert result.steps == 2 and [r["version"] for r in driver.history] == [1, 2]
    tokenizer = load_tokenizer(model)
    prompt = [s for e in driver.batches[0] for s in e.group.samples][0].prompt_ids.tolist()
    assert tokenizer.decode(prompt).startswith(opening)  # through the family's chat template, once
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    if cfg.eval.protocol is not None:
        bench = next(iter(cfg.eval.protocol.benchmarks))
        logged = [r["step"] for r in records if f"protocol/{bench}@8" in r]
        assert logged == [0, 2]  # before and after training, on the rollout workers
        assert (tmp_path / "run" / "protocol" / "step2" / "table.md").is_file()
    else:
        assert result.before is not None and result.after is not None and result.after.num_prompts == 2

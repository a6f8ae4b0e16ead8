"""`stabledrl train --dry-run` without the model or the data: what is missing and how to get it, and
the run's plan (stabledrl/cli/dry_run.py)."""
from __future__ import annotations

import pytest
import yaml

from stabledrl.cli import main as cli
from stabledrl.common.models.model_dir import fetch_command

D1_RECIPE = "deploy/configs/recipe_d1_llada8b_gsm8k_lora.yaml"


@pytest.fixture
def empty_caches(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(cli, "train_job", lambda cfg: pytest.fail("train_job must not be reached"))


def dry_run(capsys, *args):
    code = cli.main(["train", "--config", D1_RECIPE, "--dry-run", *args])
    out = capsys.readouterr()
    return code, out.out, [line[2:] for line in out.out.splitlines() if line.startswith("# ")]


def test_dry_run_without_the_model_or_data_says_what_is_missing(capsys, empty_caches):
    import ray

    code, out, notes = dry_run(capsys)
    assert code == 0 and not ray.is_initialized()
    assert yaml.safe_load(out)["learner"]["lora"]["module_names"] == "llada"  # still the resolved config as YAML
    model = next(n for n in notes if n.strip().startswith("model:"))
    assert "GSAI-ML/LLaDA-8B-Instruct: MISSING" in model and fetch_command("GSAI-ML/LLaDA-8B-Instruct") in model
    data = [n for n in notes if "openai/gsm8k (main)" in n]
    assert len(data) == 2 and all("MISSING" in n and "datasets.load_dataset('openai/gsm8k', 'main')" in n for n in data)
    assert "[train]" in data[0] and "[test]" in data[1]  # the task's rows, then the protocol's GSM8K test split
    assert "3 missing" in out


def test_dry_run_plan_of_the_d1_recipe(capsys, empty_caches):
    code, _, notes = dry_run(capsys)
    plan = "\n".join(notes[notes.index("plan:"):])
    assert code == 0
    assert "GPUs: 8 (8 learner ranks × 1, each shared with a rollout worker: cluster.colocate)" in plan
    assert "8 learner ranks (DeepSpeed ZeRO-2, bf16, training LoRA r 128 on q_proj, k_proj, v_proj, up_proj)" in plan
    assert "steps: 4671 × 12 optimizer updates = 56,052 updates" in plan and "per micro-batch" in plan
    assert "samples per step: 16 prompts × 6 completions = 96" in plan
    assert "at most 24,576 per step (96 × gen_length 256, 128 denoising steps each" in plan
    assert "114,794,496 over the run" in plan
    assert "no held-out evaluation" in plan
    assert "protocol d1: before training, after training and every 100 steps (46 times): gsm8k (all rows) " \
           "at gen_length 256, greedy" in plan
    assert "checkpoints every 8 steps and after the last step in runs/d1-llada8b-gsm8k-lora/checkpoints" in plan
    assert "final policy: runs/d1-llada8b-gsm8k-lora/final_model" in plan
    assert "LoRA adapters: runs/d1-llada8b-gsm8k-lora/final_adapter (a PEFT adapter folder for model.path" in plan
    assert "rounded" not in plan  # the adapters are pushed and held unmerged
    _, _, merged = dry_run(capsys, "learner.lora.push=merged")
    assert "pushed merged into the weights' dtype: the rollout policy is the learner's rounded" in "\n".join(merged)
    # the plan follows the config
    _, _, notes = dry_run(capsys, "run.steps=10", "eval.every=0", "cluster.colocate=false", "learner.num_ranks=4",
                          "rollout.num_workers=2", "learner.lora=null")
    plan = "\n".join(notes)
    assert "GPUs: 6 (4 learner ranks × 1 + 2 rollout workers × 1)" in plan and "training every parameter" in plan
    assert "steps: 10 × 12 optimizer updates = 120 updates" in plan
    assert "protocol d1: before training, after training: gsm8k" in plan
    # 8 workers on the 8 learner ranks' GPUs; an NCCL push cannot reach a worker on its rank's GPU
    assert cli.main(["train", "--config", D1_RECIPE, "--dry-run", "weights.backend=nccl"]) == 2
    assert "weights.backend 'nccl' cannot push" in capsys.readouterr().err
    _, _, notes = dry_run(capsys)
    assert "weights: pushed through each learner rank's GPU buffer, mapped by the worker on the same GPU (CUDA " \
        "IPC) (weights.backend auto)" in "\n".join(notes)
    # without LoRA the workers view their ranks' parameters (weights.ipc auto: view): one copy a GPU
    _, _, viewed = dry_run(capsys, "learner.lora=null")
    assert "weights: read in place: each rollout worker's parameters are views of its learner rank's, on the GPU " \
        "they share (CUDA IPC; one copy of the weights a GPU, weights.ipc view) (weights.backend auto)" \
        in "\n".join(viewed)
    _, _, apart = dry_run(capsys, "cluster.colocate=false", "learner.num_ranks=4", "rollout.num_workers=4",
                          "weights.backend=nccl")
    assert "weights: pushed through an NCCL broadcast from the learner to the workers\n" in "\n".join(apart) + "\n"
    _, _, store = dry_run(capsys, "algorithm.max_staleness=1")
    assert "weights: pushed through Ray's object store (learner rank 0 puts, every worker fetches) (weights.backend " \
        "auto)" in "\n".join(store)
    # auto apart from the learner without LoRA: the pull on one host, the broadcast across hosts
    apart = ("cluster.colocate=false", "learner.num_ranks=4", "rollout.num_workers=4")
    _, _, full = dry_run(capsys, *apart, "learner.lora=null")
    assert "weights: pushed through each worker's read of the learner ranks' GPU memory with its copy engines (CUDA " \
        "IPC, one host) while every learner rank and rollout worker runs on one host, else through an NCCL broadcast " \
        "from the learner to the workers (weights.backend auto)" in "\n".join(full)
    assert "push plan: learner rank 0 sends its parameters as they lie; carries every parameter; on the wire in the " \
        "learner's dtype; staged beside generation (weights.staging)" in "\n".join(full)  # ZeRO-2
    _, _, zero3 = dry_run(capsys, *apart, "learner.lora=null", "learner.deepspeed.zero_stage=3")
    assert "push plan: learner ranks 0..3 each send their own ZeRO-3 partitions" in "\n".join(zero3)
    _, _, merged = dry_run(capsys, *apart, "learner.lora.push=merged", "weights.dtype=bf16", "weights.staging=false",
                           "learner.deepspeed.zero_stage=3")
    assert "push plan: learner rank 0 sends the full parameters (gathered first under ZeRO-3); carries the adapted " \
        "matrices, merged; on the wire in bf16; received between requests" in "\n".join(merged)
    _, _, peer = dry_run(capsys, *apart, "weights.backend=peer")  # a transport named outright
    assert "weights: pushed through each worker's read of the learner ranks' GPU memory" in "\n".join(peer)


def test_dry_run_with_everything_present_finds_it(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "train_job", lambda cfg: pytest.fail("train_job must not be reached"))
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n')
    code = cli.main(["train", "--config", "deploy/configs/quickstart.yaml", "--dry-run",
                     f"task.source={{kind: file, path: {data}}}"])
    out = capsys.readouterr().out
    assert code == 0 and "MISSING" not in out and "missing" not in out
    assert f"task data: {data}: found" in out and "model: preset tiny-llada: found" in out


def test_dry_run_plan_says_how_far_the_rollout_fleet_may_scale(capsys, empty_caches):
    cli.main(["train", "--config", "deploy/configs/llada8b_multinode.yaml", "--dry-run"])
    plan = capsys.readouterr().out
    assert "rollout workers: 16, elastic 8..32 (`stabledrl scale --job llada8b-math --workers N`)" in plan
    assert "autoscale" in plan
    cli.main(["train", "--config", "deploy/configs/llada8b_multinode.yaml", "--dry-run", "rollout.min_workers=16",
              "rollout.max_workers=null", "rollout.autoscale=false"])
    assert "rollout workers: 16, fixed" in capsys.readouterr().out

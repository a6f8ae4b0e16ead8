"""What the peer benchmark runs (run_peers.py): each pair's release and recipe, the project loops'
overrides (the recipe as committed and its named variants) and what a pair's project loops always set so
that both sides run the same algorithm. The named suites are tests/benchmarks/suites.py's."""
from __future__ import annotations

# the shipped fast paths (deploy/configs/llada8b_1node.yaml): Fast-dLLM's dual cache, threshold decoding (the
# recipes compile the exact sampler's forward; the cached one runs eager)
SAMPLER_FAST = ["sampler.cache=dual", "sampler.threshold=0.9", "sampler.compile=false"]
FAST = SAMPLER_FAST + ["algorithm.max_staleness=1"]  # placed apart: rollouts one step ahead
# cluster.colocate (what the recipes ship): a learner rank and a rollout worker on every GPU, taking turns (eta = 0)
COLOCATED = ["cluster.colocate=true", "weights.backend=auto", "algorithm.max_staleness=0"]
APART = ["cluster.colocate=false", "weights.backend=auto"]  # 1 learner rank and 1 worker, each on a GPU of its own
NO_CKPT = ["model.gradient_checkpointing=false", "model.checkpointed_layers=null"]  # every activation kept
# the fast sampler with its dual-cache step replayed as a CUDA graph (sampler.cuda_graph): at the few rows a
# colocated worker decodes, the eager step waits on its kernels' launches
FAST_GRAPH = SAMPLER_FAST + ["sampler.cuda_graph=true"]
VARIANTS = {"release_sampler": [],  # the recipe as committed (colocated)
            "fast": SAMPLER_FAST,  # the recipe with the fast sampler, still colocated at eta = 0
            "apart": APART, "apart_fast": APART + FAST,
            "colocated": COLOCATED, "colocated_fast": SAMPLER_FAST + COLOCATED,
            # the recipe's sampler with its forward eager: the before of sampler.compile
            "colocated_eager": COLOCATED + ["sampler.compile=false"],
            # the learner without activation checkpointing (at d1's 32 layers colocated on 80 GB it ran out of
            # memory at its second step): for a learner on a GPU of its own
            "colocated_no_ckpt": COLOCATED + NO_CKPT,
            "colocated_fast_no_ckpt": SAMPLER_FAST + COLOCATED + NO_CKPT,
            "fast_graph": FAST_GRAPH, "fast_graph_no_ckpt": FAST_GRAPH + NO_CKPT,
            # the graphed step compiled before its capture (sampler.compile, set after SAMPLER_FAST's false: the
            # later override wins): its elementwise kernels fused, each of which a graph still runs on its own
            "fast_graph_compiled": FAST_GRAPH + ["sampler.compile=true"]}
# what a pair's project loops always set, so that both sides run the same estimator on the same prompts
PAIR_SETS = {"stabledrl": [], "d1": ["estimator.masks=per_iteration", "task.long_prompts=keep_last"]}
FULL_LAYERS = 32  # LLaDA-8B's


def pair_spec(name: str, n_gpus: int, round_scale: float = 1.0) -> dict:
    """What a pair runs; ``groups``: the project's groups_per_step that trains, per step, as many
    samples as one round of the peer (every GPU); ``round_scale`` halves both (the release's
    accumulation rounds and the project's groups) for a shorter cycle of the same shape."""
    g = max(1, n_gpus)
    if name == "stabledrl":
        rounds = max(1, round(4 * round_scale))  # the release: 4 accumulation rounds x 1 prompt x 16 a GPU
        return {"recipe": "deploy/configs/recipe_stabledrl_llada8b_gsm8k.yaml", "script": "peer_stabledrl.py",
                "groups": g * rounds, "peer_dir": "StableDRL", "steps_per_round": 2,  # mu = 2
                "accelerate_config": "configs/accelerate/fsdp.yaml", "lora": False,
                "peer_sets": [] if rounds == 4 else [f"training_args.grad_accumulation={rounds}"],
                # the CPU rehearsal: one prompt a round, a generation of 2 blocks of 32 tokens in 8 steps
                "tiny": ["infer_kwargs.gen_length=64", "infer_kwargs.max_steps=8", "training_args.grad_accumulation=1"]}
    if name == "d1":
        return {"recipe": "deploy/configs/recipe_d1_llada8b_gsm8k_lora.yaml", "script": "peer_d1.py",
                "groups": g * 2, "peer_dir": "d1", "steps_per_round": 12,  # 6 rows x 2 accumulation / 6; mu = 12
                "accelerate_config": "diffu-grpo/accelerate.yaml", "lora": True, "peer_sets": [],
                # the CPU rehearsal: 2 blocks of 32 tokens in 8 steps, fp32 (no DeepSpeed, no bf16 autocast)
                "tiny": ["max_completion_length=64", "diffusion_steps=8", "bf16=false"]}
    raise SystemExit(f"unknown pair {name!r} (stabledrl, d1)")

#!/usr/bin/env bash
# LLaDA-8B's recipe (deploy/configs/llada8b_1node.yaml) on one node of 4 GPUs, 2 steps through the
# whole system, with full fine-tuning (VARIANT full) or LoRA r 128 / alpha 64 on the seven
# projections (VARIANT lora): 3 learner ranks (ZeRO-3, bf16, activation checkpointing) and 1
# rollout worker, weights pushed over NCCL. No weights can be downloaded, so the model is random
# at the real shape (vocab 126464, hidden 4096, 32 layers, MLP 12288), written once to $CKPT, and
# the task is the generated arithmetic one. 3 ranks, not 2: full fine-tuning needs ~18 bytes per
# parameter over the ranks (144 GB), which 2 ranks of an 80 GB H100 cannot hold. η = 0, so that a
# push never waits for a request the worker is still sampling: time/weight_push is the transfer.
# On one node of 4 GPUs with stabledrl installed (each run < 10 min; the first one also writes the 16 GB
# checkpoint):
#     bash deploy/lora_gpu.sh full
#     bash deploy/lora_gpu.sh lora
# Each prints the learner's peak GPU memory per rank, the push time and the parameters per step,
# and leaves $OUT/<variant>.metrics.jsonl and $OUT/<variant>.log.
# The CPU check of this exact script (tiny LLaDA preset, gloo push, the same recipe and overrides):
#     OUT=/tmp/lora_cpu PATH=.venv/bin:$PATH bash deploy/lora_gpu.sh lora --cpu
set -u
cd "$(dirname "$0")/.."
VARIANT="${1:?usage: deploy/lora_gpu.sh full|lora [--cpu] [overrides]}"
shift
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0 RAY_DEDUP_LOGS=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
OUT="${OUT:-runs/lora_gpu_out}"
CKPT="${CKPT:-/tmp/llada8b-random}"
RUNS="${RUNS:-/tmp/lora_gpu_runs}"  # checkpoints stay off $OUT
mkdir -p "$OUT" "$RUNS"

common=(
  "task={name: arithmetic, source: {kind: generated, n: 2000}, held_out: 0}"
  learner.num_ranks=3 rollout.num_workers=1 algorithm.groups_per_step=4 algorithm.max_staleness=0 sampler.steps=32
  run.steps=2 run.checkpoint_every=0 run.save_final_checkpoint=false run.export_final=false run.progress=false
  run.output_dir="$RUNS/$VARIANT"
)
if [ "${1:-}" = "--cpu" ]; then
  shift
  common+=(model.path=null model.preset=tiny-llada model.dtype=float32 learner.deepspeed.dtype=fp32
           learner.deepspeed.param_persistence_threshold=0 weights.backend=gloo
           cluster.learner.num_cpus=0.5 cluster.rollout.num_cpus=0.5 cluster.learner.num_gpus=0 cluster.rollout.num_gpus=0
           sampler.gen_length=8 sampler.block_length=8 sampler.steps=8 estimator.block_length=8
           algorithm.group_size=4 algorithm.micro_batch_size=4 run.peak_tflops=null)
else
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
  if [ ! -f "$CKPT/config.json" ]; then
    python3 - "$CKPT" <<'EOF' || exit 1
import sys, time
sys.path.insert(0, "tests/benchmarks")
import benchlib as bl, torch
from stabledrl.common.models import export_hf
from stabledrl.common.tokenizer import build_char_tokenizer
t0 = time.perf_counter()
policy = bl.build_policy("llada-8b", torch.device("cuda", 0), torch.bfloat16)
export_hf(policy, build_char_tokenizer(), sys.argv[1])
print(f"random LLaDA-8B ({sum(p.numel() for p in policy.parameters()) / 1e9:.2f}B) written to {sys.argv[1]} "
      f"in {time.perf_counter() - t0:.0f} s")
EOF
  fi
  common+=(model.path="$CKPT")
fi
# LoRA also saves its final checkpoint (the adapters, their Adam states and the RNGs: a few GB)
[ "$VARIANT" = lora ] && common+=(learner.lora.rank=128 learner.lora.alpha=64 run.save_final_checkpoint=true)

# the whole script is meant to end inside 10 minutes: the job gets what the checkpoint's writing left of 570 s
timeout -k 5 "${LORA_GPU_TIMEOUT_S:-$((570 - SECONDS))}" stabledrl train --config deploy/configs/llada8b_1node.yaml \
  "${common[@]}" "$@" 2>&1 | tee "$OUT/$VARIANT.log"
status=${PIPESTATUS[0]}
cp "$RUNS/$VARIANT/metrics.jsonl" "$OUT/$VARIANT.metrics.jsonl" 2>/dev/null
python3 - "$OUT/$VARIANT.metrics.jsonl" "$VARIANT" <<'EOF'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])] if __import__("os").path.exists(sys.argv[1]) else []
for r in (r for r in records if "train/loss" in r):
    peaks = {k.rsplit("/", 1)[-1]: round(v, 2) for k, v in r.items() if k.startswith("learner/peak_gpu_gb/")}
    reserved = {k.rsplit("/", 1)[-1]: round(v, 2) for k, v in r.items() if k.startswith("learner/peak_gpu_reserved_gb/")}
    host = {k.rsplit("/", 1)[-1]: round(v, 2) for k, v in r.items() if k.startswith("learner/peak_rss_gb/")}
    print(f"{sys.argv[2]} step {r['step']}: push {r['time/weight_push']:.3f} s, train {r['time/train']:.1f} s, "
          f"step {r['time/step']:.1f} s, parameters {r['learner/parameters'] / 1e6:.2f}M "
          f"(trained {r['learner/trained_parameters'] / 1e6:.2f}M), loss {r['train/loss']:.4g}, "
          f"peak GPU GiB allocated {peaks or 'n/a (CPU)'}, reserved {reserved or 'n/a'}, host RSS GiB {host}")
EOF
[ -d "$RUNS/$VARIANT/checkpoints" ] && du -sh "$RUNS/$VARIANT/checkpoints"
echo "$VARIANT exit status $status"
exit "$status"

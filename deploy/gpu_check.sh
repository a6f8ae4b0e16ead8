#!/usr/bin/env bash
# After installing stabledrl on a GPU node (README, "Install on GPUs"), check the install end to end:
# the CUDA build of torch is the one stabledrl runs on, the command line answers, and a tiny job
# trains on the first GPU through the whole system (a learner rank and a rollout worker sharing
# it, bf16, the weights pushed over CUDA IPC), then evaluates its export.
#
#     bash deploy/gpu_check.sh                 # about a minute; writes runs/gpu_check/
#     OUT=/tmp/check bash deploy/gpu_check.sh  # elsewhere
#
# Exit status 0 when every step passed; the first failing step is named.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/gpu_check}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (it needs a fabric manager many nodes lack)
step() { echo "== $*"; }
fail() { echo "gpu_check: FAILED at: $*" >&2; exit 1; }

step "torch with CUDA"
python3 - <<'PY' || fail "torch with CUDA (install the CUDA build of torch for your driver first)"
import torch
assert torch.cuda.is_available(), f"torch {torch.__version__} sees no GPU"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} x "
      f"{torch.cuda.get_device_name(0)}")
PY

step "stabledrl installed"
command -v stabledrl >/dev/null || fail "stabledrl on PATH (pip install -e . from the repository root)"
stabledrl --version
python3 -c "import stabledrl.common.models, stabledrl.rollout.engine, stabledrl.learner.engine" \
  || fail "importing stabledrl's modules"

step "a tiny job on one GPU (colocated learner rank and rollout worker, 4 steps)"
rm -rf "$OUT"
stabledrl train --config deploy/configs/quickstart.yaml --overwrite \
  run.output_dir="$OUT" run.steps=4 run.checkpoint_every=4 warmstart.steps=40 \
  learner.num_ranks=1 rollout.num_workers=1 cluster.colocate=true algorithm.max_staleness=0 \
  cluster.learner.num_gpus=1 cluster.rollout.num_gpus=1 learner.deepspeed.dtype=bf16 \
  eval.every=0 eval.num_prompts=32 2>&1 | tee "$OUT.log" | tail -n 5 \
  || fail "the tiny job (log: $OUT.log)"
grep -q "held-out accuracy" "$OUT.log" || fail "the job's last line (log: $OUT.log)"
[ -f "$OUT/final_model/config.json" ] || fail "the exported model ($OUT/final_model)"

step "evaluate the export on the GPU"
stabledrl eval --config deploy/configs/quickstart.yaml --model "$OUT/final_model" --num-prompts 32 \
  || fail "stabledrl eval"
echo "gpu_check: every step passed"

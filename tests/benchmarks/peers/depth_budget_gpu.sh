#!/usr/bin/env bash
# The depth budget on one H200 (BENCHMARKS.md, "At LLaDA-8B's full depth"): `run_peers.py --suite
# depth-budget-PAIR`, one command of at most 10 minutes each, in the repository root, its records in $OUT:
#
#   PEERS=DIR LIB=DIR bash tests/benchmarks/peers/depth_budget_gpu.sh stabledrl
#       the StableDRL recipe as committed at 24 layers (5 steps: its memory), then the release at 24 layers
#   PEERS=DIR LIB=DIR bash tests/benchmarks/peers/depth_budget_gpu.sh d1
#       d1's release and d1's recipe as committed at 32 layers
#
# Needs stabledrl installed on the GPU machine (README, "Install on GPUs") and the releases' code, which
# is never part of this project:
#   PEERS  a folder holding checkouts of github.com/JianyuanZhong/StableDRL (as StableDRL/) and of
#          github.com/dllm-reasoning/d1 (as d1/)
#   LIB    the older packages the release pins, first on its path only:
#          bash tests/benchmarks/peers/build_stabledrl_lib.sh LIB   (the StableDRL pair)
#          bash tests/benchmarks/peers/build_d1_lib.sh LIB          (the d1 pair)
# The table of both: python tests/benchmarks/peers/peers_table.py OUT/depth-stabledrl/results.json \
#   OUT/depth-d1/results.json
set -u
pair=${1:?usage: depth_budget_gpu.sh stabledrl|d1}
case "$pair" in
  stabledrl|d1) ;;
  *) echo "no pair $pair (stabledrl or d1)" >&2; exit 2 ;;
esac
: "${PEERS:?PEERS=DIR: checkouts of the releases (StableDRL/, d1/)}" "${LIB:?LIB=DIR: the packages the release pins}"
cd "$(dirname "$0")/../../.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (it needs a fabric manager many nodes lack)
python3 -c "import stabledrl.common, ray, deepspeed" || { echo "install stabledrl first (README, Install on GPUs)" >&2; exit 1; }
OUT=${OUT:-runs/depth}
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
# the random checkpoints (12-16 GB) go under /tmp: only the records land in $OUT
exec python3 tests/benchmarks/peers/run_peers.py --suite "depth-budget-$pair" --peer-root "$PEERS" \
  --peer-pythonpath "$LIB" --work "/tmp/depth-$pair" --out "$OUT/depth-$pair"

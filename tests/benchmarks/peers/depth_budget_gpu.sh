#!/usr/bin/env bash
# The depth budget on one H200 (BENCHMARKS.md, "The depth budget"): `run_peers.py --suite depth-budget-PAIR`
# on a GPU machine without a package index, in the repository root, its records in $OUT:
#
#   bash tests/benchmarks/peers/depth_budget_gpu.sh stabledrl   # beside .whl and .gpu_sdrl
#       the StableDRL recipe as committed at 24 layers (5 steps: its memory), then the release at 24 layers
#   bash tests/benchmarks/peers/depth_budget_gpu.sh d1          # beside .whl and .gpu_d1
#       d1's release and d1's recipe as committed at 32 layers
#
# Prepared on a machine with the releases' checkouts and a package index:
#   .whl/install.sh: wheels of ray, deepspeed and pydantic for the GPU machine's Python, and a script that
#   installs them into /tmp/site
#   mkdir -p /tmp/peers/d1 && git -C SDRL_GIT archive --prefix=StableDRL/ HEAD | tar -x -C /tmp/peers
#   git -C D1_GIT archive HEAD diffu-grpo | tar -x -C /tmp/peers/d1
#   mkdir -p /tmp/trl && git -C TRL_GIT archive 0f88c179e30b3439467942a08c3190f624d5c423 | tar -x -C /tmp/trl
#   BUNDLE=.gpu_sdrl PEERS=/tmp/peers bash tests/benchmarks/peers/build_stabledrl_lib.sh /tmp/peerlib_312
#   BUNDLE=.gpu_d1 PEERS=/tmp/peers TRL_SRC=/tmp/trl bash tests/benchmarks/peers/build_d1_lib.sh /tmp/peerlib_d1_312
#   printf '/.gpu_sdrl/\n/.gpu_d1/\n' >> .git/info/exclude
# The table of both: python tests/benchmarks/peers/peers_table.py OUT/depth-stabledrl/results.json \
#   OUT/depth-d1/results.json
set -u
pair=${1:?usage: depth_budget_gpu.sh stabledrl|d1}
cd "$(dirname "$0")/../../.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -d /tmp/site/ray ]; then  # the carried wheels, installed by an earlier call on this warm machine
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
elif [ -f .whl/install.sh ]; then  # the carried wheels (a machine without a package index)
  source .whl/install.sh || exit 1
fi
python3 -c "import ray, deepspeed, pydantic" || { echo "ray, deepspeed and pydantic are needed: carry .whl" >&2; exit 1; }
# stabledrl's namespace maps the repository's folders (setup.py): installed from this tree, editable, offline
python3 -c "import stabledrl.common" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation \
  --no-index -e . || { echo "stabledrl could not be installed from this tree (pip install -e .)" >&2; exit 1; }
OUT=${OUT:-/tmp/depth}
case "$pair" in
  stabledrl) bundle=.gpu_sdrl lib=/tmp/peerlib archive=peerlib.tar.gz ;;
  d1) bundle=.gpu_d1 lib=/tmp/peerlib_d1 archive=peerlib_d1.tar.gz ;;
  *) echo "no pair $pair (stabledrl or d1)" >&2; exit 2 ;;
esac
mkdir -p "$lib" && tar -xzf "$bundle/$archive" -C "$lib" || exit 1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
# the random checkpoints (12-16 GB) stay in /tmp: only the records come back in $OUT
exec python3 tests/benchmarks/peers/run_peers.py --suite "depth-budget-$pair" --peer-root "$PWD/$bundle/peers" \
  --peer-pythonpath "$lib" --work "/tmp/depth-$pair" --out "$OUT/depth-$pair"

#!/usr/bin/env bash
# The whole issue-4 benchmark suite in one device call (2 GPUs; ~4-5 min of an 8.5 min deadline).
# On the GPU machine, from the repository root:
#     source .whl/install.sh && bash tests/benchmarks/run_gpu.sh
# The short re-measure of the jobs changed since the first run (~2.5 min, deadline 190 s):
#     source .whl/install.sh && bash tests/benchmarks/run_gpu.sh --quick --only full_attention,block_diffusion,learner_1gpu,push
# One GPU (block diffusion eager + CUDA graphs, learner quick; ~2.5-3.5 min, 2-GPU jobs skipped):
#     source .whl/install.sh && DEADLINE_S=210 bash tests/benchmarks/run_gpu.sh --quick --only block_diffusion,learner_1gpu
# Results: $OUT/results.json, $OUT/table.md, $OUT/run.log (and a dated copy in tests/benchmarks/results/).
# Extra arguments go to run_all.py, e.g. --only full_attention,block_diffusion or --deadline-s 300
# (or DEADLINE_S=300 in the environment).
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader 2>/dev/null || true
python3 -c "import importlib.util as u; m = [n for n in ('deepspeed', 'pydantic', 'ray') if u.find_spec(n) is None]; m and print('warning: missing', m, '- was .whl/install.sh sourced? the learner and push jobs will fail')"
exec python3 tests/benchmarks/run_all.py --out "${OUT:-tests/benchmarks/results/latest}" ${DEADLINE_S:+--deadline-s "$DEADLINE_S"} "$@"

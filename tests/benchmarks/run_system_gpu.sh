#!/usr/bin/env bash
# The system benchmark of issues 11 and 15 in one device call (4 GPUs or 2, deadline 540 s; see
# tests/benchmarks/run_system.py). On the GPU machine, from the repository root:
#     source .whl/install.sh && bash tests/benchmarks/run_system_gpu.sh
# The second call (TraDo; a fresh machine has no checkpoints, so ckpt_sdar again), then the learner
# variants if time is left:
#     source .whl/install.sh && bash tests/benchmarks/run_system_gpu.sh --parts ckpt_sdar,matmul,system_trado
#     source .whl/install.sh && bash tests/benchmarks/run_system_gpu.sh --parts ckpt_llada,matmul,variant_prefetch_5e7,variant_micro_batch_32,variant_draw_batch_1
#     source .whl/install.sh && bash tests/benchmarks/run_system_gpu.sh --parts ckpt_llada,matmul,lora_llada
# On 2 GPUs (planned by itself: 1 learner rank + 1 rollout worker, full-parameter jobs at 11 layers):
#     source .whl/install.sh && bash tests/benchmarks/run_system_gpu.sh --parts ckpt_llada_short,matmul,push,system_llada
#     source .whl/install.sh && bash tests/benchmarks/run_system_gpu.sh --parts ckpt_llada,matmul,lora_llada
# Results: $OUT/results.json, $OUT/summary.md, $OUT/run.log. Extra arguments go to run_system.py.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader 2>/dev/null || true
df -h /dev/shm /tmp 2>/dev/null | tail -n +2 || true
python3 -c "import importlib.util as u; m = [n for n in ('deepspeed', 'pydantic', 'ray') if u.find_spec(n) is None]; m and print('warning: missing', m, '- was .whl/install.sh sourced? the jobs will fail')"
exec python3 tests/benchmarks/run_system.py --out "${OUT:-tests/benchmarks/results/system_latest}" ${DEADLINE_S:+--deadline-s "$DEADLINE_S"} "$@"

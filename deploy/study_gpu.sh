#!/usr/bin/env bash
# The stability study on one GPU (an H100 or H200, ~6 minutes; stabledrl installed: README, "Install on
# GPUs"), from the repository root:
#     bash deploy/study_gpu.sh
# Writes $OUT/study/ (study.json, METHOD/seedN/metrics.jsonl, table.md, results.json, figure.png when
# matplotlib is there), $OUT/study.log and $OUT/study_runs.tar.gz (the same runs in one file). Where the
# repository is checked out for the docs, from its root:
#     stabledrl study --report <copied>/study      # table + figure into docs/study.md (section "gpu")
# Extra arguments are dotted overrides of deploy/configs/study_gpu.yaml, e.g. job.learner.optimizer.lr=5e-5
# job.estimator.masks=shared report.section=gpu-shared-lr5e-5 report.figure=docs/study/study_gpu_shared_lr5e-5.png.
# The CPU check of this exact script (tiny model, 2 runs at once, no GPU):
#     OUT=/tmp/sg PATH=.venv/bin:$PATH bash deploy/study_gpu.sh job.model.dtype=float32 \
#         job.model.preset_shape.hidden_size=32 job.model.preset_shape.intermediate_size=64 \
#         job.model.preset_shape.num_hidden_layers=1 job.model.preset_shape.num_attention_heads=2 \
#         job.model.preset_shape.num_key_value_heads=2 job.warmstart.steps=20 job.run.steps=3 job.eval.every=2 \
#         job.eval.num_prompts=16 job.cluster.learner.num_gpus=0 job.cluster.rollout.num_gpus=0 concurrency=2 report=null
# report=null leaves docs/study.md and docs/study alone. ~6 min on a busy 2-core CPU; add deadline_s=150 to see
# runs stopped and not started, or prefix STUDY_TIMEOUT_S=100 to see the last-resort kill (exit status
# 124, no process left behind, `stabledrl study --report /tmp/sg/study` still draws the table).
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0 RAY_DEDUP_LOGS=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
OUT="${OUT:-runs/study_gpu_out}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi (CPU check)"
python3 -c "import importlib.util as u; m = [n for n in ('stabledrl', 'deepspeed', 'pydantic', 'ray') if u.find_spec(n) is None]; \
print('missing', m, '- install stabledrl first: pip install -e .' if m else ''); \
print('matplotlib:', 'yes' if u.find_spec('matplotlib') else 'missing; draw the figure later with stabledrl study --report')"
# Meant to finish inside 10 minutes of one GPU. The study's own deadline (deadline_s in study_gpu.yaml:
# 445 s after it starts) stops training and leaves time for stopping, Ray's shutdown and the report.
# The timeout is the last resort (then `stabledrl study --report` redraws the table from the metrics
# already in $OUT/study); STUDY_TIMEOUT_S sets it, e.g. to check that path on CPU.
timeout -k 5 "${STUDY_TIMEOUT_S:-530}" python3 -m stabledrl study --config deploy/configs/study_gpu.yaml \
  output_dir="$OUT/study" "$@" 2>&1 | tee "$OUT/study.log"
status=${PIPESTATUS[0]}
# the per-run directories as one plain file to carry off the GPU machine (a name with '+',
# stabledrl+dipod, does not survive every copy tool): tar -xzf study_runs.tar.gz && stabledrl study --report study
tar -czf "$OUT/study_runs.tar.gz" -C "$OUT" --exclude=checkpoints --exclude=final_model --exclude=tensorboard study \
  && echo "packed $OUT/study_runs.tar.gz ($(du -h "$OUT/study_runs.tar.gz" | cut -f1))"
echo "study exit status $status; $(du -sh "$OUT" | cut -f1) in $OUT"
exit "$status"

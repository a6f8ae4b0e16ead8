#!/usr/bin/env bash
# `stabledrl eval --protocol d1` over 2 GPUs: one EvalWorker actor per GPU, the d1 protocol at its
# three lengths (128, 256, 512; block 32, greedy) on 32 prompts of each of its four benchmarks, then
# the same command again, which must find every completion graded and print the same table. No
# weights or data can be downloaded, so the policy is a random LLaDA at the real vocabulary with the
# released tokenizer and chat template (hidden 512, 4 layers, written to $OUT/model) and the
# benchmarks are small files in the formats of the GSM8K test split, MATH500 and d1's Countdown and
# Sudoku files. Prints the two tables, the wall time of each run and the result lines (4 x 32 x 3).
# On a node of 2 GPUs with stabledrl installed (about a minute):
#     bash deploy/protocol_eval_gpu.sh
# The CPU check of this exact script (2 CPU workers, hidden 32, 4 prompts per benchmark, lengths 32, 64):
#     OUT=/tmp/protocol_cpu PATH=.venv/bin:$PATH bash deploy/protocol_eval_gpu.sh --cpu
set -eu
cd "$(dirname "$0")/.."
CPU=0; HIDDEN=512; PROMPTS=32
if [ "${1:-}" = "--cpu" ]; then CPU=1; HIDDEN=32; PROMPTS=4; fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0 RAY_DEDUP_LOGS=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
OUT="${OUT:-/tmp/protocol_gpu}"
rm -rf "$OUT/eval" && mkdir -p "$OUT"

python3 - "$OUT" "$HIDDEN" <<'PY'
import json, sys
from pathlib import Path

from stabledrl.common.models.release_tokenizers import write_tiny_release_checkpoint

out, hidden = Path(sys.argv[1]), int(sys.argv[2])
write_tiny_release_checkpoint("llada", out / "model", hidden_size=hidden, intermediate_size=2 * hidden,
                              num_attention_heads=8, num_key_value_heads=8, num_hidden_layers=4)
rows = range(40)
(out / "gsm8k.jsonl").write_text("".join(json.dumps({"question": f"Ann has {i} pens and buys {i + 3}. How many now?",
                                                      "answer": f"{i}+{i + 3}\n#### {2 * i + 3}"}) + "\n" for i in rows))
(out / "math500.jsonl").write_text("".join(json.dumps({"problem": f"What is ${i}/4$ in lowest terms?",
                                                        "answer": f"\\frac{{{i}}}{{4}}"}) + "\n" for i in rows))
(out / "countdown.jsonl").write_text("".join(json.dumps({"input": f"{i + 2},{i + 5},3", "output": str(2 * i + 10)}) + "\n"
                                             for i in rows))
(out / "sudoku.csv").write_text("Puzzle,Solution\n" + "3102200002100320,3142243142131324\n" * 40)
PY

file() { echo "{kind: file, path: $OUT/$1, columns: $2}"; }
benchmarks="{gsm8k: {source: $(file gsm8k.jsonl '{prompt: question}')},
 math500: {source: $(file math500.jsonl '{prompt: problem}')},
 countdown: {source: $(file countdown.jsonl '{numbers: input, target: output}')},
 sudoku: {source: $(file sudoku.csv '{puzzle: Puzzle, solution: Solution}')}}"
flags=(--protocol d1 --num-prompts "$PROMPTS" --out "$OUT/eval")
overrides=("model.path=$OUT/model" "eval.protocol.benchmarks=$benchmarks" cluster.rollout.num_cpus=4 cluster.rollout.num_gpus=1)
if [ "$CPU" = 1 ]; then
  flags+=(--workers 2 --lengths 32,64)
  overrides+=(model.dtype=float32 cluster.rollout.num_cpus=0.5 cluster.rollout.num_gpus=0 weights.backend=object_store)
else
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
fi
for run in first rerun; do
  start=$(date +%s%N)
  timeout 600 python3 -m stabledrl eval --config deploy/configs/recipe_stabledrl_llada8b_gsm8k.yaml "${flags[@]}" "${overrides[@]}"
  echo "== $run run: $(( ($(date +%s%N) - start) / 1000000 )) ms wall"
done
echo "== results.jsonl lines: $(wc -l < "$OUT/eval/results.jsonl") (expected 4 x $PROMPTS x the number of lengths)"

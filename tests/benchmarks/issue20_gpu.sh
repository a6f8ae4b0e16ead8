#!/usr/bin/env bash
# The GPU measurements of issue 20 on one 4-GPU host (nvidia-h100-x4), as three device calls made
# back to back on the same warm machine, two 2-GPU lanes side by side where they fit:
#
#   call1  (carry .whl)    lane GPUs 0,1: system_llada at 11 layers (push, the step after a checkpoint)
#                          lane GPUs 2,3: system_trado at 11 layers (flex staircase, the step after a
#                                         checkpoint), then bench_push --engine at 1 learner rank
#                          then GPUs 0-3: call3's learner, and its push if time is left
#   call2  (carry .gpu_d1: built by `BUNDLE=.gpu_d1 bash tests/benchmarks/peers/build_d1_lib.sh DIR`;
#                          .whl stays on the machine from call1)
#                          lane GPUs 0,1: d1's diffu-GRPO loop (the peer), 32 layers with LoRA
#                          lane GPUs 2,3: stabledrl train at d1's recipe, release sampler and fast paths
#   call3  (carry nothing) GPUs 0-3: the 8B ZeRO-3 learner over 4 ranks (bench_learner --shape llada-8b),
#                          then bench_push --engine with 3 ZeRO-3 learner ranks and 1 receiver
#
# and on a 2-GPU host (nvidia-h100-x2), one after the other:
#   call4  (carry .whl)    system_llada alone (the step after a checkpoint, the push in the job)
#   call5  (carry .gpu_sdrl: `BUNDLE=.gpu_sdrl bash tests/benchmarks/peers/build_stabledrl_lib.sh DIR`: the
#                          StableDRL release under peers/StableDRL and peerlib.tar.gz, its
#                          transformers 4.51.3 packages) the release's loop, then `stabledrl train` at its
#                          recipe with the release's sampler and cluster.colocate, 32- and 64-row requests
#                          (the roles apart at the release's sampler: 20261126-2158_peers_h100x2.json)
#   call6  (carry .gpu_d1) d1's loop, then the project at d1's recipe colocated, its sampler and the fast one
#   call56 (a 4-GPU host, carry .gpu_sdrl and .gpu_d1) call5 on GPUs 0,1 and call6 on GPUs 2,3 side by side
#   call7  (a 4-GPU host, carry .whl) call4 on GPUs 0,1; on GPU 2 the block-diffusion sampler at 8B (eager,
#                          graphed with the entering step, graphed + compiled); on GPU 3 the sampler's GPU
#                          tests; then push3 if time is left
#   call8  (a 4-GPU host, carry .gpu_sdrl and .gpu_d1 and .whl's install from call7, or a fresh host with
#                          /tmp/site missing: then carry .whl instead and run call8 after it) the ipc push's GPU
#                          test, then side by side: GPUs 0,1 the StableDRL release and the project colocated
#                          (the same-device push); GPUs 2,3 d1's loop and the project colocated
#   call9  (a 4-GPU host, carry .whl) GPUs 0,1: the full-parameter LLaDA-8B job with the optimizer on the host
#                          (offload_llada: 1 learner GPU + 1 worker); GPUs 2,3: the project at d1's recipe
#                          colocated, its sampler and the fast one (no peer: call10 runs it on the same host)
#   call10 (the same warm host, carry .gpu_sdrl and .gpu_d1) GPUs 0,1: the StableDRL release, then the project
#                          colocated with 32- and 64-row requests; GPUs 2,3: d1's loop (merged afterwards with
#                          call9's d1 loops: run_peers.py --merge)
#   call11 (a 4-GPU host, carry .whl) GPUs 0,1: the project at the StableDRL recipe colocated, 3 steps (the learner's
#                          push in its parts: the queued GPU work, the gathers and copies, the memory handed back);
#                          GPUs 2,3: call9's offload job again at 2 steps (its third step did not fit the part's time)
#   call12 (a 4-GPU host, carry .whl) GPUs 0,1: call11's StableDRL loop colocated again, each ZeRO-3 rank now sending
#                          its partitions through one all-gather into the ipc buffers; GPUs 2,3: the offload job
#                          (call11's lane had a 100 s deadline, which capped the job's own time)
#                          (measured: the push's send 2.57 -> 0.020 s; the learner's training slowed beside the offload
#                          job's host AdamW, so the step-level effect needs call13 + call14)
#   call13 (a 4-GPU host, carry .whl) GPUs 0,1: the StableDRL loop colocated (partitions push), nothing heavy on the
#                          host's CPUs beside it; GPUs 2,3: the project at d1's recipe colocated (its sampler, fast)
#   call14 (the same warm host, carry .gpu_sdrl and .gpu_d1) the two releases' loops on the same GPUs, for the ratios
#   call15 (2 GPUs, carry .whl) the 8B offload job with 32-row micro-batches alone on its host (against call9's 16)
#   call16 (a 4-GPU host, carry .whl) GPUs 0,1: the StableDRL loop colocated (partitions push) with the recipe's
#                          compiled sampler, then with it eager; GPUs 2,3: the 2-GPU ipc test, then the project at
#                          d1's recipe colocated (compiled, fast, eager); nothing heavy beside them
#   call17 (the same warm host, carry .gpu_sdrl and .gpu_d1) = call14: the two releases' loops, for the ratios
#   call18 (a second 4-GPU host, carry .whl) the compiled sampler's ratios again: GPUs 0,1: the StableDRL loop
#                          colocated (32- and 64-row requests), then on GPU 0 the exact sampler at LLaDA-8B eager
#                          and compiled (bench_full_attention naive); GPUs 2,3: d1's recipe colocated, its sampler
#                          and the fast one
#   call19 (the same warm host, carry .gpu_sdrl and .gpu_d1) = call14
#   call20 (1 GPU, carry .whl) learner.compile at the StableDRL loop's learner shape (8 layers, ZeRO-3,
#                          checkpointing, 32-row micro-batches: eager, then fused on the same engine); the
#                          exact sampler at LLaDA-8B with the fused token choice (bench_full_attention naive)
#   call21 (a 4-GPU host, carry .whl) the recipes as shipped now (sampler.compile with the fused token choice,
#                          learner.compile, d1's reference estimated once a step): GPUs 0,1 the StableDRL loop
#                          colocated, then d1's recipe colocated without activation checkpointing; GPUs 2,3
#                          d1's recipe colocated, its sampler, the fast one, the fast one without checkpointing
#   call22 (the same warm host, carry .gpu_sdrl and .gpu_d1) = call14
#   call23 (the same warm host, carry nothing) the 8B ZeRO-3 learner over 4 ranks, 64-row micro-batches,
#                          eager then learner.compile on the same engine; then on GPU 0 the block-diffusion
#                          sampler at SDAR-8B graphed, and graphed + compiled (the fused token choice)
#   call24 (a second 4-GPU host, carry .whl) call21's loops again: GPUs 0,1 the StableDRL loop colocated;
#                          GPUs 2,3 d1's best two
#   call25 (the same warm host, carry .gpu_sdrl and .gpu_d1) = call14
#   call26 (1 GPU, carry .whl) d1's learner alone at LLaDA-8B (LoRA r 128, mean-field, 6-row groups, 2 a
#                          rank): 6- and 12-row forwards, every layer / 16 / 8 / no layer checkpointed,
#                          learner.compile, against the measured matmul rate; a profile of the first setting
#   call27 (a 4-GPU host, carry .whl) d1's recipe as shipped now (12-row forwards, no checkpointing, the KL
#                          reference the base with its adapters off): GPUs 0,1 colocated, its sampler and the
#                          fast one; GPUs 2,3 the StableDRL loop as shipped (a second host's figure), then d1's
#                          colocated with the first 8 layers checkpointed (D1_CKPT8)
#   call28 (the same warm host, carry .gpu_sdrl and .gpu_d1) = call14
#   call29 (a 4-GPU host, carry .whl) call27 ran d1's loops out of memory colocated (the learner's 51 GiB beside
#                          the worker's 28 and 5 GiB the checkpoint writer's process held): now the reference
#                          runs before the policy's forward, the writer frees its cache, and the worker keeps no
#                          unmerged copy of the adapted matrices (learner.lora.push merged, D1_MERGED): GPUs 0,1
#                          d1's colocated, its sampler and the fast one; GPUs 2,3 the StableDRL loop as shipped,
#                          then d1's colocated with 8 layers checkpointed
#   call30 (the same warm host, carry .gpu_sdrl and .gpu_d1) = call14
#   call31 (a 4-GPU host, carry .whl) call29's d1 loops timed at their third step (the first push, which
#                          allocates the push buffer through the host, out of the figures): GPUs 0,1 8 layers
#                          checkpointed, its sampler; GPUs 2,3 the fast sampler, 8 layers and none checkpointed
#   call32 (the same warm host, carry .gpu_d1) d1's loop, for the ratios
#   call31x2 (a 2-GPU host, carry .whl) call31's first two loops one after the other (no 4-GPU host was lent)
#   call33 (a 4-GPU host, carry .whl) GPUs 0,1: d1's colocated loops with the fast sampler timed at their third
#                          step (none and 8 layers checkpointed); GPU 2: the block-diffusion sampler at SDAR-8B
#                          with the cache written by index_put_ (graphed, compiled, each split into its calls, the
#                          token choice alone, fp32 exactness); GPU 3: the sampler's GPU tests
#   call34 (the same warm host, carry .gpu_d1) GPUs 0,1: d1's loop, for the ratios; GPUs 2,3: d1's colocated loop
#                          with its own sampler, 8 layers checkpointed, timed at the third step
#   call35 (a 4-GPU host, carry .whl) GPUs 0,1: d1's fast colocated loops with the dual-cache step replayed as a CUDA
#                          graph (sampler.cuda_graph), none and 8 layers checkpointed, timed at the third step; GPU 2:
#                          the block-diffusion sampler graphed and compiled again (a second host); GPU 3: the
#                          sampler's GPU tests
#   call36 (the same warm host, carry .gpu_d1) GPUs 0,1: d1's loop, for the ratios; GPUs 2,3: the graphed fast loop
#                          with 8 layers checkpointed again (a second run on the host)
#   call37 (a 4-GPU host, carry .whl) the StableDRL loop colocated with the fast sampler: GPUs 0,1 the dual-cache step
#                          eager, GPUs 2,3 replayed as a CUDA graph
#   call38 (the same warm host, carry .gpu_sdrl) GPUs 0,1: the StableDRL release, for the ratios; GPUs 2,3: the graphed
#                          loop again (a second run on the host)
#   call39 (a 4-GPU host, carry .whl) GPUs 0-3: the push from 3 ZeRO-3 ranks, each rank now over a group of its own
#                          with the receiver; then GPUs 0,1: d1's graphed fast loop (8 layers checkpointed) and the
#                          StableDRL graphed fast loop, each timed as before (a second host for both 5x figures);
#                          GPU 2: the block-diffusion sampler graphed and compiled (run at e7383ac, whose decode
#                          steps were replayed as CUDA graphs: no gain, 0.99x, reverted); GPU 3: the sampler's GPU tests
#                          (11 files: the device returns 8, so sdrl_graph's came back from call41)
#   call40 (the same warm host, carry .gpu_d1 and .gpu_sdrl) GPUs 0,1: d1's loop; GPUs 2,3: the StableDRL release;
#                          for call39's ratios
#   call41 (the same warm host, carry nothing) GPUs 2,3: the StableDRL graphed fast loop again (call39's record of it
#                          did not come back)
#   call42 (a 4-GPU host, carry .whl) the LLaDA-8B system job over 4 GPUs (3 ZeRO-3 learner ranks + 1 worker, each
#                          rank pushing its partitions over its own group) beside the raw broadcast of the same card:
#                          the in-job push at several ranks
#   call43 (1 GPU, carry .whl) the sampler's GPU tests (the capture with the collector off)
#   call44 (1 GPU, carry .whl) the block-diffusion sampler at SDAR-8B compiled and graphed, with the generators' draw
#                          and with the counter-based draw (sampler.noise_source: counter) on the same static steps; the
#                          counter's generation split into its calls; the token choice alone, both draws
#   call45 (2 GPUs; run at 42b68fc, which had bench_push --busy-receivers and weights.stream_priority, both reverted:
#                          the high-priority push was slower, and the busy thread barely ran during the raw broadcast)
#                          the push from 1 ZeRO-3 learner rank to 1 receiver, 11 layers, the receiver's GPU busy with
#                          matmuls: the raw broadcast idle and busy, the push at normal and at high stream priority
#   call46 (a 4-GPU host, carry .whl) call42's LLaDA-8B job over 4 GPUs (3 ZeRO-3 ranks + 1 worker) with
#                          learner.compile on (the job's learner MFU; call42 ran it off on another host)
#   call46e (the same warm host, carry .whl) call46 with learner.compile off (the config until then): the same-host
#                          baseline of call46's MFU
#   call47 (the same warm host, carry .gsm8k: GSM8K's train.jsonl.gz from github openai/grade-school-math,
#                          never committed) each lane on cores of its own (taskset): GPU 0 the engine's graph
#                          pool over requests with GSM8K's spread of prompt lengths (bench_full_attention
#                          graph_pool, eager and graphed at pool sizes 2 and 4); GPU 1 the block-diffusion
#                          sampler compiled, both draws (a second machine for the counter's figure); GPUs 2,3
#                          call15's 8B offload job with 32-row micro-batches
#   Both bundle their records into $OUT/bundle.tgz (the device returns few files).
#   call48 (1 GPU, carry .whl) the LoRA push at LLaDA-8B (r 128, ZeRO-3, 1 rank): merged, the adapters gathered,
#                          and the adapters through the sharded push's learner end (bench_lora_push --engine)
#   call49 (a 4-GPU host, carry .whl) the push into a worker's staging copy beside the worker's own generation:
#                          bench_push --engine, 3 ZeRO-3 learner ranks -> 1 receiver at LLaDA-8B, then 1 rank -> 1
#                          receiver at 11 layers; the receiver idle, then generating (the job's sampler). Run at
#                          de86cdd, whose modes also timed weights.high_priority and weights.stage_pause (not kept)
#   call50 SET... (a 4-GPU host, carry .whl) call46's job with 6 steps, the save after step 4 (a two-step baseline
#                          for the step after it) and the given --job-set options (none: the config as is); run as is
#                          and, at de86cdd, twice with weights.stage_pause=true
#   call51 (a 4-GPU host, carry .whl; not yet run) call49's 3 ranks -> 1 receiver at LLaDA-8B with the receiver
#                          generating as the job's worker does (its LM head scaled as the system benchmark's
#                          checkpoint: several tokens a forward, the cache's refresh forwards), at 512, 2048 and
#                          4096 MiB rounds: whether fewer broadcasts shorten the push beside generation, and the
#                          raw broadcast beside the same generation (raw_busy: the busy pushes' fair denominator)
#   call52 (1 GPU, carry .whl and .before: the tree of 9cc0c9e, whose same-device push laid its buffer out
#                          through the host at the first push, with this bench_ipc_push.py copied in; never
#                          committed) the same-device push's GPU tests; then bench_ipc_push at LLaDA-8B with the
#                          buffer in blocks, with the tree before, and in blocks again
#   call53 (a 4-GPU host, carry .whl) the receiver's copy engines pulling 3 sources' shares of LLaDA-8B's bytes
#                          beside its own generation (bench_peer_pull), then call51's push beside generation at
#                          512, 2048 and 4096 MiB rounds (3 repetitions), on the same machine
#   call54 (a 4-GPU host, carry .whl) call53's push beside generation with NCCL's copy-engine transfers
#                          (NCCL_P2P_USE_CUDA_MEMCPY=1 in every rank): raw, raw_busy, busy
#   call55 (2 GPUs, carry .whl) call53 and call54 at 1 rank -> 1 receiver, 11 layers: the copy-engine pull beside
#                          generation; the push beside generation at 512, 2048, 4096 MiB rounds; the same with
#                          NCCL's copy-engine transfers
#   call59 (2 GPUs, carry .whl) the pull push (weights.backend: peer): its GPU tests and the same-device push's;
#                          then bench_push --engine at 1 rank -> 1 receiver, 11 layers: the raw broadcast beside
#                          generation, the broadcast into the staging copy idle and beside generation, the pull
#                          idle and beside generation
#   call60 (2 GPUs, carry .whl) the pull push's GPU tests again (call59 ran them with both ends on GPU 0: a
#                          spawned child set its CUDA_VISIBLE_DEVICES after torch had read it); then the 11-layer LLaDA job (1 rank + 1 worker, 6 steps, the save after step 4)
#                          with weights.backend=peer, beside the raw broadcast of the same card (its push part)
#   call62 (2 GPUs, carry .whl) the pull push reading the ranks' partitions where they lie (no copy into a buffer
#                          on the learner): its GPU tests, then the 11-layer job with weights.backend=peer (5 steps,
#                          the save after step 3, no matmul part: the device budget's end)
#   call63 (a 4-GPU host, carry .whl) the pushes beside generation at 3 ZeRO-3 ranks -> 1 receiver, LLaDA-8B,
#                          reading the partitions where they lie: raw_busy, busy, peer_staged, peer_busy (3 repetitions)
#   call64 (2 GPUs, carry .whl) the same at 1 rank -> 1 receiver, 11 layers (5 repetitions)
#   call61 (a 4-GPU host, carry .whl) call59's pushes at 3 ZeRO-3 ranks -> 1 receiver, LLaDA-8B; then call50's
#                          4-GPU job with weights.backend=peer
#   call65 (2 GPUs, carry .whl) the pull copied whole per rank span into the worker's staging copy and put
#                          together when applied, the receive under a short switch interval (common/gil.py): the
#                          GPU tests (also into a staging copy); bench_push at 1 rank, 11 layers, beside generation
#                          and beside a thread running Python, against the pull as before (_rows modes); the
#                          11-layer job over peer (5 steps, the save after step 3; each step's push clocks per actor)
#   call66 (2 GPUs, carry .whl) call65's job with 8 steps (the save after step 3), the worker's pull clocked in
#                          parts (push_stage_map, _issue, _copy) per step
#   call67 (2 GPUs, carry .whl) call65's bench_push modes again, the Python thread keeping objects alive (the
#                          collector runs), the set-up's heap frozen and no collection during a push (common/gil.py)
#
#     bash tests/benchmarks/issue20_gpu.sh call1     # on the device, from the repository root; writes $OUT
#
# Each lane writes under $OUT/<lane>/ and its log to $OUT/<lane>.log; the call exits non-zero if a
# lane did. The peer lanes of call2 are merged afterwards (the same card and GPU count) with
#     python3 tests/benchmarks/peers/run_peers.py ... --merge  (see BENCHMARKS.md).
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ -d /tmp/site/ray ]; then  # installed by an earlier call on this warm machine
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled \
    RAY_USAGE_STATS_ENABLED=0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
else
  source .whl/install.sh || exit 1
fi
export OUT=${OUT:-/tmp/issue20}
mkdir -p "$OUT"
COLOCATED="cluster.colocate=true;weights.backend=auto;algorithm.max_staleness=0"  # a learner rank and a rollout worker on every GPU
peerlib_sdrl() {  # the StableDRL release's packages from .gpu_sdrl into /tmp/peerlib
  mkdir -p /tmp/peerlib && tar -xzf .gpu_sdrl/peerlib.tar.gz -C /tmp/peerlib
}
peerlib_d1() {  # d1's packages from .gpu_d1 into /tmp/peerlib_d1
  mkdir -p /tmp/peerlib_d1 && tar -xzf .gpu_d1/peerlib_d1.tar.gz -C /tmp/peerlib_d1
}
lane() {  # lane NAME GPUS COMMAND...: the command with only those GPUs visible, its output in $OUT/NAME.log
  local name=$1 gpus=$2
  shift 2
  ( export CUDA_VISIBLE_DEVICES=$gpus; mkdir -p "$OUT/$name"; "$@" > "$OUT/$name.log" 2>&1; echo "lane $name: rc $?" )
}
system() {  # system OUTDIR WORK PARTS DEADLINE: the 2-GPU system benchmark without the profile and resume jobs
  OUT=$1 bash tests/benchmarks/run_system_gpu.sh --work "$2" --parts "$3" --no-profile --no-resume --steps 6 --checkpoint-at 4 \
    --deadline-s "$4"
}
trado_then_push() {
  system "$OUT/trado" /tmp/sys_trado ckpt_sdar_short,matmul,system_trado 330
  local rc=$?
  python3 tests/benchmarks/bench_push.py --engine --learners 1 --receivers 1 --layers 11 --reps 3 \
    --out "$OUT/trado/push_engine_1rank.json" || rc=$?
  return $rc
}
learner8b() {  # the 8B ZeRO-3 learner over 4 ranks, against this machine's matmul rate
  python3 tests/benchmarks/bench_matmul.py --out "$OUT/matmul.json" > "$OUT/matmul.log" 2>&1
  python3 tests/benchmarks/bench_learner.py --shape llada-8b --world 4 --stages 3t --checkpointing on \
    --micro-batch-groups 2,4 --groups-per-step 8 --steps 2 --peak-from "$OUT/matmul.json" \
    --out "$OUT/learner8b_4gpu.json" > "$OUT/learner8b.log" 2>&1
  echo "learner8b: rc $?"
}
push3() {  # the push from 3 ZeRO-3 learner ranks to 1 receiver, LLaDA-8B
  python3 tests/benchmarks/bench_push.py --engine --learners 3 --receivers 1 --reps 3 \
    --out "$OUT/push_engine_3ranks.json" > "$OUT/push3.log" 2>&1
  echo "push 3 ranks: rc $?"
}
d1_colocated() {
  peerlib_d1 || return 1
  python3 tests/benchmarks/peers/run_peers.py --pairs d1 --loops peer,colocated,colocated_fast \
    --peer-root "$PWD/.gpu_d1/peers" --peer-pythonpath /tmp/peerlib_d1 --peer-port 29541 --project-steps 2 \
    --part-timeout-s 200 --deadline-s 420 --work /tmp/pw_d1c --out "$OUT/d1c"
}
block_diffusion() {  # benchmark 4 at SDAR-8B shape on one GPU, parts $1 (default: eager, graphed, graphed +
                     # compiled, exactness)
  python3 tests/benchmarks/bench_matmul.py --out "$OUT/bd/matmul.json" &&
    python3 tests/benchmarks/bench_block_diffusion.py --quick --parts "${1:-speed,graphed,compiled,exactness}" \
      --peak-from "$OUT/bd/matmul.json" --out "$OUT/bd/block_diffusion.json"
}
sdrl_colocated() {
  peerlib_sdrl || return 1
  python3 tests/benchmarks/peers/run_peers.py --peer-root "$PWD/.gpu_sdrl/peers" --peer-pythonpath /tmp/peerlib \
    --layers 8 --loops peer,colocated --project-steps 3 --part-timeout-s 250 --deadline-s 480 --work /tmp/pw_sdrl8 \
    --out "$OUT/sdrl"
}
d1_colocated_only() {
  peerlib_d1 || return 1
  python3 tests/benchmarks/peers/run_peers.py --pairs d1 --loops peer,colocated \
    --peer-root "$PWD/.gpu_d1/peers" --peer-pythonpath /tmp/peerlib_d1 --peer-port 29541 --project-steps 2 \
    --part-timeout-s 250 --deadline-s 480 --work /tmp/pw_d1c8 --out "$OUT/d1c"
}
offload8b() {  # the 8B full-parameter job, optimizer offloaded, on this lane's 2 GPUs (the deadline also caps
               # each part's timeout: call11's 100 s stopped the job at 63 s)
  OUT=$1 bash tests/benchmarks/run_system_gpu.sh --work /tmp/sys_offload --parts ckpt_llada,matmul,offload_llada \
    --no-profile --no-resume --deadline-s "$2"
}
offload8b_mb32() {  # call15's job: the 8B offload job with 32-row micro-batches on this lane's 2 GPUs
  OUT=$OUT/offload bash tests/benchmarks/run_system_gpu.sh --work /tmp/sys_offload \
    --parts ckpt_llada,matmul,offload_llada_mb32 --no-profile --no-resume --deadline-s 540
}
d1_project() {  # the project's loops at d1's recipe (the peer runs elsewhere on this host)
  python3 tests/benchmarks/peers/run_peers.py --pairs d1 --loops colocated,colocated_fast --peer-root /tmp/none \
    --project-steps 2 --part-timeout-s 230 --deadline-s 290 --work /tmp/pw_d1p --out "$OUT/d1p"
}
d1_peer() {
  peerlib_d1 || return 1
  python3 tests/benchmarks/peers/run_peers.py --pairs d1 --loops peer --peer-root "$PWD/.gpu_d1/peers" \
    --peer-pythonpath /tmp/peerlib_d1 --peer-port 29541 --part-timeout-s 400 --work /tmp/pw_d1peer --out "$OUT/d1peer"
}
sdrl_peer() {  # the StableDRL release's loop at 8 layers
  peerlib_sdrl || return 1
  python3 tests/benchmarks/peers/run_peers.py --loops peer --peer-root "$PWD/.gpu_sdrl/peers" \
    --peer-pythonpath /tmp/peerlib --layers 8 --part-timeout-s 300 --work /tmp/pw_sdrl_peer --out "$OUT/sdrl_peer"
}
sdrl_rows() {  # the release, then the project colocated with its 32-row requests and with 64-row ones
  peerlib_sdrl || return 1
  python3 tests/benchmarks/peers/run_peers.py --peer-root "$PWD/.gpu_sdrl/peers" --peer-pythonpath /tmp/peerlib \
    --layers 8 --loops peer,colocated,colocated_64_rows --project-steps 3 --part-timeout-s 200 --deadline-s 400 \
    --variant "colocated_64_rows=$COLOCATED;rollout.prompts_per_request=4" \
    --work /tmp/pw_sdrl_rows --out "$OUT/sdrl"
}
ipc_test_then_d1() {  # the 2-GPU ipc test, then the project at d1's recipe colocated: compiled, fast, eager
  python3 -m pytest -q -m gpu tests/gpu/test_ipc_push_gpu.py > "$OUT/ipc_test.log" 2>&1
  echo "ipc GPU test: rc $?"
  python3 tests/benchmarks/peers/run_peers.py --pairs d1 --loops colocated,colocated_fast,colocated_eager \
    --peer-root /tmp/none --project-steps 2 --part-timeout-s 185 --deadline-s 520 --work /tmp/pw_d1c --out "$OUT/d1c"
}
sdrl_compiled_then_naive() {  # the StableDRL loop colocated at 32- and 64-row requests; the exact sampler at 8B
  python3 tests/benchmarks/peers/run_peers.py --loops colocated,colocated_64_rows --peer-root /tmp/none --layers 8 \
    --project-steps 3 --part-timeout-s 220 --work /tmp/pw_sdrl_c --out "$OUT/sdrl_c" \
    --variant "colocated_64_rows=$COLOCATED;rollout.prompts_per_request=4"
  local rc=$?
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES%%,*}
  mkdir -p "$OUT/naive"
  python3 tests/benchmarks/bench_matmul.py --out "$OUT/naive/matmul.json" &&
    python3 tests/benchmarks/bench_full_attention.py --parts naive --peak-from "$OUT/naive/matmul.json" \
      --out "$OUT/naive/full_attention.json" || rc=$?
  return $rc
}
sdrl_shipped() {  # the StableDRL loop colocated, the recipe as shipped
  python3 tests/benchmarks/peers/run_peers.py --loops colocated --peer-root /tmp/none --layers 8 \
    --project-steps 3 --part-timeout-s 220 --work /tmp/pw_sdrl_c --out "$OUT/sdrl_c"
}
D1_CKPT8="colocated_ckpt8=$COLOCATED;model.gradient_checkpointing=true;model.checkpointed_layers=8"
D1_COLOCATED="$COLOCATED;learner.lora.push=merged"
SAMPLER_FAST="sampler.cache=dual;sampler.threshold=0.9;sampler.compile=false"
D1_MERGED=(--variant "colocated_merged=$D1_COLOCATED"
  --variant "colocated_fast_merged=$D1_COLOCATED;$SAMPLER_FAST"
  --variant "colocated_ckpt8_merged=$D1_COLOCATED;model.gradient_checkpointing=true;model.checkpointed_layers=8"
  --variant "colocated_fast_ckpt8_merged=$D1_COLOCATED;$SAMPLER_FAST;model.gradient_checkpointing=true;model.checkpointed_layers=8"
  --variant "colocated_fast_graph_merged=$D1_COLOCATED;$SAMPLER_FAST;sampler.cuda_graph=true"
  --variant "colocated_fast_graph_ckpt8_merged=$D1_COLOCATED;$SAMPLER_FAST;sampler.cuda_graph=true;model.gradient_checkpointing=true;model.checkpointed_layers=8")
SDRL_FAST=(--variant "colocated_fast=$COLOCATED;$SAMPLER_FAST"
  --variant "colocated_fast_graph=$COLOCATED;$SAMPLER_FAST;sampler.cuda_graph=true")
sdrl_fast() {  # sdrl_fast LOOP NAME: one of StableDRL's colocated fast loops, 3 steps, into $OUT/NAME
  python3 tests/benchmarks/peers/run_peers.py --loops "$1" "${SDRL_FAST[@]}" --peer-root /tmp/none --layers 8 \
    --project-steps 3 --part-timeout-s 230 --work "/tmp/pw_$2" --out "$OUT/$2"
}
d1_third_step() {  # d1_third_step NAME LOOPS PART_TIMEOUT [RUN_PEERS ARGS...]: d1's colocated loops (D1_MERGED)
                   # timed at their third step (no first push in the window), into $OUT/NAME
  local name=$1 loops=$2 timeout=$3
  shift 3
  python3 tests/benchmarks/peers/run_peers.py --pairs d1 --loops "$loops" "${D1_MERGED[@]}" --peer-root /tmp/none \
    --project-steps 3 --project-skip 2 --part-timeout-s "$timeout" "$@" --work "/tmp/pw_$name" --out "$OUT/$name"
}
sampler_gpu_tests() {  # the sampler's CUDA-graph and fast-path GPU tests
  python3 -m pytest -q -m gpu tests/gpu/test_sampler_graph_gpu.py tests/gpu/test_sampler_fast_paths_gpu.py
}
d1_then_sdrl_graphed() {  # d1's graphed fast loop (8 layers checkpointed) at its third step, then StableDRL's
  d1_third_step d1g colocated_fast_graph_ckpt8_merged 230
  local rc=$?
  sdrl_fast colocated_fast_graph sdrl_graph || rc=$?
  return $rc
}
sdrl_then_d1() {  # sdrl_then_d1 NAME LOOP [VARIANT ARGS...]: the StableDRL loop colocated as shipped; then one of
                  # d1's colocated loops, 2 steps, into $OUT/NAME
  local name=$1 loop=$2
  shift 2
  sdrl_shipped
  local rc=$?
  python3 tests/benchmarks/peers/run_peers.py --pairs d1 --loops "$loop" "$@" --peer-root /tmp/none \
    --project-steps 2 --part-timeout-s 185 --deadline-s 300 --work "/tmp/pw_$name" --out "$OUT/$name" || rc=$?
  return $rc
}
cores() {  # cores K N: the K-th of N equal slices of this machine's cores, as a taskset list
  local total per
  total=$(nproc)
  per=$((total / $2))
  if [ "$per" -lt 1 ]; then echo "0-$((total - 1))"; return; fi  # fewer cores than slices: all of them
  echo "$(($1 * per))-$((($1 + 1) * per - 1))"
}
bundle() {  # every record under $OUT into $OUT/bundle.tgz, the summaries kept beside it
  tar -czf /tmp/bundle.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/bundle.tgz "$OUT/"
}
graph_pool() {  # the engine's graph pool over GSM8K's prompt lengths, on one GPU
  python3 tests/benchmarks/bench_matmul.py --out "$OUT/pool/matmul.json" &&
    python3 tests/benchmarks/bench_full_attention.py --parts graph_pool --prompt-lengths-from .gsm8k/train.jsonl.gz \
      --peak-from "$OUT/pool/matmul.json" --out "$OUT/pool/full_attention.json"
}
peer_gpu_tests() {  # the pull push's GPU tests into $OUT/peer_gpu_tests.log; their rc
  python3 -m pytest -q tests/gpu/test_peer_push_gpu.py > "$OUT/peer_gpu_tests.log" 2>&1
  local rc=$?
  echo "peer GPU tests: rc $rc"
  return $rc
}
peer_job() {  # peer_job STEPS SAVE_AT DEADLINE_S WHAT: the 11-layer LLaDA job (1 rank + 1 worker) over peer into $OUT/sys_peer
  OUT=$OUT/sys_peer bash tests/benchmarks/run_system_gpu.sh --work /tmp/sys_llada \
    --parts ckpt_llada_short,push,system_llada --no-profile --no-resume --steps "$1" --checkpoint-at "$2" \
    --deadline-s "$3" --job-set weights.backend=peer
  echo "the 11-layer job $4: rc $?"
  cp "$OUT/sys_peer/summary.md" "$OUT/summary_sys_peer.md" 2>/dev/null
}
auto_job() {  # auto_job STEPS SAVE_AT DEADLINE_S [NAME SET...]: the 11-layer LLaDA job (1 rank + 1 worker) as shipped
              # (weights.backend auto), or with --job-set SET..., into $OUT/NAME (default sys_auto)
  local steps=$1 at=$2 deadline=$3 name=${4:-sys_auto} sets=()
  shift $(( $# < 4 ? $# : 4 ))
  for s in "$@"; do sets+=(--job-set "$s"); done
  OUT=$OUT/$name bash tests/benchmarks/run_system_gpu.sh --work "/tmp/$name" \
    --parts ckpt_llada_short,push,system_llada --no-profile --no-resume --steps "$steps" --checkpoint-at "$at" \
    --deadline-s "$deadline" "${sets[@]}"
  echo "the 11-layer job ($name ${*:-as shipped}): rc $?"
  cp "$OUT/$name/summary.md" "$OUT/summary_$name.md" 2>/dev/null
}
trado_job() {  # trado_job STEPS SAVE_AT DEADLINE_S NAME [SET...]: the 11-layer TraDo job (1 rank + 1 worker) as shipped
               # (weights.backend auto), or with --job-set SET..., into $OUT/NAME
  local steps=$1 at=$2 deadline=$3 name=$4 sets=()
  shift 4
  for s in "$@"; do sets+=(--job-set "$s"); done
  OUT=$OUT/$name bash tests/benchmarks/run_system_gpu.sh --work "/tmp/$name" \
    --parts ckpt_sdar_short,matmul,push,system_trado --no-profile --no-resume --steps "$steps" --checkpoint-at "$at" \
    --deadline-s "$deadline" "${sets[@]}"
  echo "the 11-layer TraDo job ($name ${*:-as shipped}): rc $?"
  cp "$OUT/$name/summary.md" "$OUT/summary_$name.md" 2>/dev/null
}
lora_job() {  # lora_job DEADLINE_S NAME [SET...]: LLaDA-8B's LoRA job (r 128, all 32 layers, 1 rank + 1 worker, 2 steps)
              # as shipped (weights.backend auto), or with --short-set SET..., into $OUT/NAME
  local deadline=$1 name=$2 sets=()
  shift 2
  for s in "$@"; do sets+=(--short-set "$s"); done
  OUT=$OUT/$name bash tests/benchmarks/run_system_gpu.sh --work "/tmp/$name" --parts ckpt_llada,push,lora_llada \
    --no-profile --no-resume --deadline-s "$deadline" "${sets[@]}"
  echo "the LoRA job ($name ${*:-as shipped}): rc $?"
  cp "$OUT/$name/summary.md" "$OUT/summary_$name.md" 2>/dev/null
}
system4() {  # system4 NAME STEPS SAVE_AT SET...: call42's 4-GPU LLaDA-8B job with --job-set SET... into $OUT/NAME, bundled
  local name=$1 steps=$2 at=$3 sets=()
  shift 3
  for s in "$@"; do sets+=(--job-set "$s"); done
  OUT=$OUT/$name bash tests/benchmarks/run_system_gpu.sh --work /tmp/sys4 --parts ckpt_llada,matmul,push,system_llada \
    --no-profile --no-resume --steps "$steps" --checkpoint-at "$at" --deadline-s 570 "${sets[@]}"
  local rc=$?
  cp "$OUT/$name/summary.md" "$OUT/summary_$name.md" 2>/dev/null
  bundle
  return $rc
}
case "${1:-}" in
  call1)
    lane llada 0,1 system "$OUT/llada" /tmp/sys_llada ckpt_llada_short,matmul,push,system_llada 420 &
    lane trado 2,3 trado_then_push &
    wait
    learner8b
    if [ "$SECONDS" -lt 420 ]; then push3; else echo "push 3 ranks: skipped (${SECONDS} s used)"; fi ;;
  call2)
    peerlib_d1 || exit 1
    lane d1_peer 0,1 python3 tests/benchmarks/peers/run_peers.py --pairs d1 --loops peer \
      --peer-root "$PWD/.gpu_d1/peers" --peer-pythonpath /tmp/peerlib_d1 --part-timeout-s 470 --work /tmp/pw_peer \
      --out "$OUT/d1_peer" &
    lane d1_project 2,3 python3 tests/benchmarks/peers/run_peers.py --pairs d1 --loops release_sampler,fast \
      --peer-root /tmp/none --project-steps 2 --part-timeout-s 250 --deadline-s 320 --work /tmp/pw_project \
      --out "$OUT/d1_project" &
    wait ;;
  call2b)  # the project's two loops at d1's recipe side by side, each on 2 GPUs (its own checkpoint)
    lane d1_fast 0,1 python3 tests/benchmarks/peers/run_peers.py --pairs d1 --loops fast \
      --peer-root /tmp/none --project-steps 2 --part-timeout-s 250 --work /tmp/pw_fast --out "$OUT/d1_fast" &
    lane d1_release_sampler 2,3 python3 tests/benchmarks/peers/run_peers.py --pairs d1 --loops release_sampler \
      --peer-root /tmp/none --project-steps 2 --part-timeout-s 255 --work /tmp/pw_rs --out "$OUT/d1_release_sampler" &
    wait ;;
  call3)
    learner8b
    push3 ;;
  call4)  # 2 GPUs (nvidia-h100-x2), carry .whl: the LLaDA job alone at the new defaults (process writer,
          # sharded push): the re-check of call1's out-of-memory and the LLaDA step after a checkpoint
    system "$OUT/llada" /tmp/sys_llada ckpt_llada_short,matmul,push,system_llada 540 ;;
  call5)  # 2 GPUs, carry .gpu_sdrl (the StableDRL release's code and its transformers 4.51 packages, never
          # committed): the release's loop, then the project at its sampler colocated (32- and 64-row requests)
    peerlib_sdrl || exit 1
    python3 tests/benchmarks/peers/run_peers.py --peer-root "$PWD/.gpu_sdrl/peers" --peer-pythonpath /tmp/peerlib \
      --layers 8 --loops peer,colocated,colocated_64_rows --part-timeout-s 240 --deadline-s 420 --work /tmp/pw_sdrl \
      --variant "colocated_64_rows=$COLOCATED;rollout.prompts_per_request=4" \
      --out "$OUT/sdrl" ;;
  call6)  # 2 GPUs, carry .gpu_d1: d1's loop, then the project at d1's recipe colocated (its sampler; the fast one)
    d1_colocated ;;
  call56)  # a 4-GPU host, carry .gpu_sdrl and .gpu_d1 (55 MB; .whl from an earlier call): call5 and call6 side by side
    lane sdrl 0,1 bash "$0" call5 &
    lane d1 2,3 bash "$0" call6 &
    wait ;;
  call7)
    lane llada 0,1 system "$OUT/llada" /tmp/sys_llada ckpt_llada_short,matmul,push,system_llada 470 &
    lane bd 2 block_diffusion &
    lane gpu_tests 3 python3 -m pytest -q -m gpu tests/gpu/test_sampler_graph_gpu.py &
    wait
    if [ "$SECONDS" -lt 470 ]; then push3; else echo "push 3 ranks: skipped (${SECONDS} s used)"; fi ;;
  call8)
    python3 -m pytest -q -m gpu tests/gpu/test_ipc_push_gpu.py > "$OUT/ipc_test.log" 2>&1
    echo "ipc GPU test: rc $?"
    lane sdrl 0,1 sdrl_colocated &
    lane d1 2,3 d1_colocated_only &
    wait ;;
  call9)
    lane offload 0,1 offload8b "$OUT/offload" 480 &
    lane d1p 2,3 d1_project &
    wait ;;
  call10)
    lane sdrl 0,1 sdrl_rows &
    lane d1peer 2,3 d1_peer &
    wait ;;
  call11)
    lane sdrl_push 0,1 python3 tests/benchmarks/peers/run_peers.py --loops colocated --peer-root /tmp/none --layers 8 \
      --project-steps 3 --part-timeout-s 240 --work /tmp/pw_sdrl_push --out "$OUT/sdrl_push" &
    lane offload 2,3 offload8b "$OUT/offload" 100 &
    wait ;;
  call12)
    lane sdrl_push 0,1 python3 tests/benchmarks/peers/run_peers.py --loops colocated --peer-root /tmp/none --layers 8 \
      --project-steps 3 --part-timeout-s 240 --work /tmp/pw_sdrl_push --out "$OUT/sdrl_push" &
    lane offload 2,3 offload8b "$OUT/offload" 480 &
    wait ;;
  call13)
    lane sdrl_push 0,1 python3 tests/benchmarks/peers/run_peers.py --loops colocated --peer-root /tmp/none --layers 8 \
      --project-steps 3 --part-timeout-s 240 --work /tmp/pw_sdrl_push --out "$OUT/sdrl_push" &
    lane d1p 2,3 d1_project &
    wait ;;
  call14)
    lane sdrl_peer 0,1 sdrl_peer &
    lane d1peer 2,3 d1_peer &
    wait ;;
  call16)
    lane sdrl_c 0,1 python3 tests/benchmarks/peers/run_peers.py --loops colocated,colocated_eager --peer-root /tmp/none \
      --layers 8 --project-steps 3 --part-timeout-s 235 --work /tmp/pw_sdrl_c --out "$OUT/sdrl_c" &
    lane d1c 2,3 ipc_test_then_d1 &
    wait ;;
  call17)
    bash "$0" call14 ;;
  call18)
    lane sdrl_c 0,1 sdrl_compiled_then_naive &
    lane d1c 2,3 python3 tests/benchmarks/peers/run_peers.py --pairs d1 --loops colocated,colocated_fast \
      --peer-root /tmp/none --project-steps 2 --part-timeout-s 185 --work /tmp/pw_d1c --out "$OUT/d1c" &
    wait ;;
  call19)
    bash "$0" call14 ;;
  call20)
    python3 tests/benchmarks/bench_matmul.py --out "$OUT/matmul.json" > "$OUT/matmul.log" 2>&1
    lane learner8l 0 python3 tests/benchmarks/bench_learner.py --shape llada-8b --layers 8 --stages 3 \
      --checkpointing on --micro-batch-groups 2 --compile off,on --steps 3 --peak-from "$OUT/matmul.json" \
      --out "$OUT/learner8l/learner.json"
    lane naive 0 python3 tests/benchmarks/bench_full_attention.py --parts naive --peak-from "$OUT/matmul.json" \
      --out "$OUT/naive/full_attention.json" ;;
  call21)
    lane sdrl_c 0,1 sdrl_then_d1 d1n colocated_no_ckpt &
    lane d1c 2,3 python3 tests/benchmarks/peers/run_peers.py --pairs d1 \
      --loops colocated,colocated_fast,colocated_fast_no_ckpt --peer-root /tmp/none --project-steps 2 \
      --part-timeout-s 175 --deadline-s 515 --work /tmp/pw_d1c --out "$OUT/d1c" &
    wait ;;
  call22|call25)
    bash "$0" call14 ;;
  call23)
    python3 tests/benchmarks/bench_matmul.py --out "$OUT/matmul.json" > "$OUT/matmul.log" 2>&1
    python3 tests/benchmarks/bench_learner.py --shape llada-8b --world 4 --stages 3t --checkpointing on \
      --micro-batch-groups 4 --groups-per-step 8 --steps 2 --compile off,on --peak-from "$OUT/matmul.json" \
      --out "$OUT/learner8b_4gpu.json" > "$OUT/learner8b.log" 2>&1
    echo "learner8b: rc $?"
    lane bd 0 block_diffusion graphed,compiled ;;  # graphed + compiled: the fused token choice
  call24)
    lane sdrl_c 0,1 sdrl_shipped &
    lane d1c 2,3 python3 tests/benchmarks/peers/run_peers.py --pairs d1 --loops "${D1_LOOPS:-colocated,colocated_fast}" \
      --peer-root /tmp/none --project-steps 2 --part-timeout-s 180 --deadline-s 400 --work /tmp/pw_d1c --out "$OUT/d1c" &
    wait ;;
  call26)
    python3 tests/benchmarks/bench_matmul.py --out "$OUT/matmul.json" > "$OUT/matmul.log" 2>&1
    lane d1learner 0 python3 tests/benchmarks/bench_learner.py --shape llada-8b --stages 2 --estimator mean_field \
      --lora 128 --group-size 6 --groups-per-step 2 --micro-batch-groups 1,2 --checkpointing on,16,8,off \
      --compile on --steps 2 --profile 2 --peak-from "$OUT/matmul.json" --out "$OUT/d1learner/learner.json" ;;
  call27)
    lane d1c 0,1 python3 tests/benchmarks/peers/run_peers.py --pairs d1 --loops colocated,colocated_fast \
      --peer-root /tmp/none --project-steps 2 --part-timeout-s 200 --deadline-s 400 --work /tmp/pw_d1c --out "$OUT/d1c" &
    lane sdrl_c 2,3 sdrl_then_d1 d1k colocated_ckpt8 --variant "$D1_CKPT8" &
    wait ;;
  call31)
    lane d1k 0,1 d1_third_step d1k colocated_ckpt8_merged 300 &
    lane d1f 2,3 d1_third_step d1f colocated_fast_ckpt8_merged,colocated_fast_merged 170 --deadline-s 200 &
    wait ;;
  call32)
    d1_peer ;;
  call31x2)
    d1_third_step d1k colocated_ckpt8_merged,colocated_fast_ckpt8_merged 230 --deadline-s 260 > "$OUT/d1k.log" 2>&1
    echo "d1k: rc $?" ;;
  call28|call30)
    bash "$0" call14 ;;
  call29)
    lane d1c 0,1 python3 tests/benchmarks/peers/run_peers.py --pairs d1 --loops colocated_merged,colocated_fast_merged \
      "${D1_MERGED[@]}" --peer-root /tmp/none --project-steps 2 --part-timeout-s 200 --deadline-s 400 \
      --work /tmp/pw_d1c --out "$OUT/d1c" &
    lane sdrl_c 2,3 sdrl_then_d1 d1k colocated_ckpt8_merged "${D1_MERGED[@]}" &
    wait ;;
  call33)
    lane d1f 0,1 d1_third_step d1f colocated_fast_merged,colocated_fast_ckpt8_merged 200 --deadline-s 260 &
    lane bd 2 block_diffusion graphed,compiled,split_compiled,decode,exactness &
    lane sampler_tests 3 sampler_gpu_tests &
    wait ;;
  call34)
    lane d1peer 0,1 d1_peer &
    lane d1k 2,3 d1_third_step d1k colocated_ckpt8_merged 280 &
    wait ;;
  call35)
    lane d1g 0,1 d1_third_step d1g colocated_fast_graph_ckpt8_merged,colocated_fast_graph_merged 200 --deadline-s 260 &
    lane bd 2 block_diffusion graphed,compiled &
    lane sampler_tests 3 sampler_gpu_tests &
    wait ;;
  call36)
    lane d1peer 0,1 d1_peer &
    lane d1g2 2,3 d1_third_step d1g2 colocated_fast_graph_ckpt8_merged 230 &
    wait ;;
  call37)
    lane sdrl_fast 0,1 sdrl_fast colocated_fast sdrl_fast &
    lane sdrl_graph 2,3 sdrl_fast colocated_fast_graph sdrl_graph &
    wait ;;
  call38)
    lane sdrl_peer 0,1 sdrl_peer &
    lane sdrl_graph2 2,3 sdrl_fast colocated_fast_graph sdrl_graph2 &
    wait ;;
  call39)
    push3
    lane graphs2 0,1 d1_then_sdrl_graphed &
    lane bd 2 block_diffusion graphed,compiled,split_compiled &
    lane sampler_tests 3 sampler_gpu_tests &
    wait ;;
  call40)
    lane d1peer 0,1 d1_peer &
    lane sdrl_peer 2,3 sdrl_peer &
    wait ;;
  call41)
    lane sdrl_graph 2,3 sdrl_fast colocated_fast_graph sdrl_graph ;;
  call42)
    OUT=$OUT/sys4 bash tests/benchmarks/run_system_gpu.sh --work /tmp/sys4 --parts ckpt_llada,matmul,push,system_llada \
      --no-profile --no-resume --steps 5 --checkpoint-at 3 --deadline-s 560 ;;
  call43)
    sampler_gpu_tests ;;
  call44)
    lane bd 0 block_diffusion compiled,split_counter,decode ;;
  call45)  # needs 42b68fc's bench_push.py (see above)
    for i in 1 2; do
      python3 tests/benchmarks/bench_push.py --engine --learners 1 --receivers 1 --layers 11 --reps 3 --busy-receivers \
        --modes shards,shards_high --out "$OUT/push_busy_$i.json" > "$OUT/push_busy_$i.log" 2>&1
      echo "push busy $i: rc $?"
    done ;;
  call46)
    system4 sys4c 5 3 learner.compile=true ;;
  call46e)
    system4 sys4e 5 3 learner.compile=false ;;
  call47)
    lane pool 0 taskset -c "$(cores 0 4)" bash -c "$(declare -f graph_pool); graph_pool" &
    lane bd 1 taskset -c "$(cores 1 4)" bash -c "$(declare -f block_diffusion); block_diffusion compiled,split_counter" &
    lane offload 2,3 taskset -c "$(cores 2 4),$(cores 3 4)" bash -c "$(declare -f offload8b_mb32); offload8b_mb32" &
    wait
    bundle ;;
  call48)
    python3 tests/benchmarks/bench_lora_push.py --engine --out "$OUT/lora_push.json" ;;
  call49)
    modes=shards,staged,busy
    python3 tests/benchmarks/bench_push.py --engine --learners 3 --receivers 1 --reps 5 --modes "$modes" \
      --out "$OUT/push_busy_3ranks.json" > "$OUT/push_busy_3ranks.log" 2>&1
    echo "push beside generation, 3 ranks: rc $?"
    lane push1 0,1 python3 tests/benchmarks/bench_push.py --engine --learners 1 --receivers 1 --layers 11 --reps 5 \
      --modes "$modes" --out "$OUT/push_busy_1rank.json"
    bundle ;;
  call51)
    python3 tests/benchmarks/bench_push.py --engine --learners 3 --receivers 1 --reps 5 \
      --modes raw_busy,staged,busy,busy@2048,busy@4096 --out "$OUT/push_busy_rounds.json" > "$OUT/push_busy_rounds.log" 2>&1
    echo "push beside generation, round sizes: rc $?"
    bundle ;;
  call52)
    python3 -m pytest -q tests/gpu/test_ipc_push_gpu.py > "$OUT/ipc_gpu_tests.log" 2>&1
    echo "ipc GPU tests: rc $?"
    for run in blocks before blocks_again; do
      tree=.; [ "$run" = before ] && tree=.before
      (cd "$tree" && python3 tests/benchmarks/bench_ipc_push.py --out "$OUT/ipc_push_$run.json") > "$OUT/ipc_push_$run.log" 2>&1
      echo "ipc push, $run: rc $?"
    done
    bundle ;;
  call53)
    python3 tests/benchmarks/bench_peer_pull.py --sources 3 --out "$OUT/peer_pull.json" > "$OUT/peer_pull.log" 2>&1
    echo "peer pull beside generation: rc $?"
    python3 tests/benchmarks/bench_push.py --engine --learners 3 --receivers 1 --reps 3 \
      --modes raw_busy,staged,busy,busy@2048,busy@4096 --out "$OUT/push_busy_rounds.json" > "$OUT/push_busy_rounds.log" 2>&1
    echo "push beside generation, round sizes: rc $?"
    bundle ;;
  call54)
    NCCL_P2P_USE_CUDA_MEMCPY=1 timeout 540 python3 tests/benchmarks/bench_push.py --engine --learners 3 --receivers 1 \
      --reps 3 --modes raw_busy,busy --timeout-s 60 --out "$OUT/push_busy_nccl_ce.json" > "$OUT/push_busy_nccl_ce.log" 2>&1
    echo "push beside generation, NCCL copy engines: rc $?"
    bundle ;;
  call55)
    python3 tests/benchmarks/bench_peer_pull.py --sources 1 --layers 11 --out "$OUT/peer_pull_1.json" \
      > "$OUT/peer_pull_1.log" 2>&1
    echo "peer pull beside generation, 1 source: rc $?"
    python3 tests/benchmarks/bench_push.py --engine --learners 1 --receivers 1 --layers 11 --reps 3 \
      --modes raw_busy,staged,busy,busy@2048,busy@4096 --out "$OUT/push_busy_rounds_1.json" > "$OUT/push_busy_rounds_1.log" 2>&1
    echo "push beside generation, round sizes, 1 rank: rc $?"
    NCCL_P2P_USE_CUDA_MEMCPY=1 timeout 200 python3 tests/benchmarks/bench_push.py --engine --learners 1 --receivers 1 \
      --layers 11 --reps 3 --modes raw_busy,busy --timeout-s 60 --out "$OUT/push_busy_nccl_ce_1.json" \
      > "$OUT/push_busy_nccl_ce_1.log" 2>&1
    echo "push beside generation, NCCL copy engines, 1 rank: rc $?"
    bundle ;;
  call59)
    python3 -m pytest -q tests/gpu/test_peer_push_gpu.py tests/gpu/test_ipc_push_gpu.py > "$OUT/peer_gpu_tests.log" 2>&1
    echo "peer and ipc GPU tests: rc $?"
    python3 tests/benchmarks/bench_push.py --engine --learners 1 --receivers 1 --layers 11 --reps 5 \
      --modes raw_busy,staged,busy,peer_staged,peer_busy --out "$OUT/push_peer_1rank.json" > "$OUT/push_peer_1rank.log" 2>&1
    echo "push beside generation, broadcast and pull, 1 rank: rc $?"
    bundle ;;
  call60)
    python3 -m pytest -q tests/gpu/test_peer_push_gpu.py > "$OUT/peer_gpu_tests.log" 2>&1
    echo "peer GPU tests: rc $?"
    OUT=$OUT/sys_peer bash tests/benchmarks/run_system_gpu.sh --work /tmp/sys_llada \
      --parts ckpt_llada_short,matmul,push,system_llada --no-profile --no-resume --steps 6 --checkpoint-at 4 \
      --deadline-s 560 --job-set weights.backend=peer
    echo "the 11-layer job with the pull push: rc $?"
    cp "$OUT/sys_peer/summary.md" "$OUT/summary_sys_peer.md" 2>/dev/null
    bundle ;;
  call62)
    peer_gpu_tests || { bundle; exit 1; }
    peer_job 5 3 320 "with the pull push in place"
    bundle ;;
  call63)
    timeout 280 python3 tests/benchmarks/bench_push.py --engine --learners 3 --receivers 1 --reps 3 \
      --modes raw_busy,busy,peer_staged,peer_busy --out "$OUT/push_peer_3ranks.json" > "$OUT/push_peer_3ranks.log" 2>&1
    echo "push beside generation, broadcast and pull in place, 3 ranks: rc $?"
    bundle ;;
  call64)
    timeout 200 python3 tests/benchmarks/bench_push.py --engine --learners 1 --receivers 1 --layers 11 --reps 5 \
      --modes raw_busy,staged,busy,peer_staged,peer_busy --out "$OUT/push_peer_1rank.json" > "$OUT/push_peer_1rank.log" 2>&1
    echo "push beside generation, broadcast and pull in place, 1 rank: rc $?"
    bundle ;;
  call65)  # the pull copied whole per rank span and put together when applied, under a short switch interval
    peer_gpu_tests || { bundle; exit 1; }
    timeout 220 python3 tests/benchmarks/bench_push.py --engine --learners 1 --receivers 1 --layers 11 --reps 5 \
      --modes raw_busy,peer_busy,peer_busy_rows,peer_python,peer_python_rows --out "$OUT/push_peer_defer_1rank.json" \
      > "$OUT/push_peer_defer_1rank.log" 2>&1
    echo "the pull beside generation and beside Python, deferred and row by row, 1 rank: rc $?"
    peer_job 5 3 300 "with the deferred pull"
    bundle ;;
  call66)  # call65's job again, longer, with the pull's parts clocked per step
    peer_job 8 3 360 "with the deferred pull, 8 steps"
    bundle ;;
  call67)  # call65's component again with the collector's share (common/gil.py), no tests, no job
    timeout 150 python3 tests/benchmarks/bench_push.py --engine --learners 1 --receivers 1 --layers 11 --reps 5 \
      --modes raw_busy,peer_busy,peer_busy_rows,peer_python,peer_python_rows --out "$OUT/push_peer_gc_1rank.json" \
      > "$OUT/push_peer_gc_1rank.log" 2>&1
    echo "the pull beside generation and beside Python that keeps objects, now and as before, 1 rank: rc $?"
    bundle ;;
  call68)  # call67's component, then call66's job, on one machine: the collector frozen and paused, measured on a GPU
    timeout 140 python3 tests/benchmarks/bench_push.py --engine --learners 1 --receivers 1 --layers 11 --reps 5 \
      --modes raw_busy,peer_busy,peer_python,peer_python_rows --out "$OUT/push_peer_gc_1rank.json" \
      > "$OUT/push_peer_gc_1rank.log" 2>&1
    echo "the pull beside generation and beside Python that keeps objects, now and as before, 1 rank: rc $?"
    peer_job 8 3 360 "with the collector frozen and paused, 8 steps"
    bundle ;;
  call69)  # the header read ordered before the copies (no wait of its own), the rows' views made at apply; call68 again
    peer_gpu_tests || { bundle; exit 1; }
    timeout 110 python3 tests/benchmarks/bench_push.py --engine --learners 1 --receivers 1 --layers 11 --reps 5 \
      --modes raw_busy,peer_busy,peer_python --out "$OUT/push_peer_views_1rank.json" > "$OUT/push_peer_views_1rank.log" 2>&1
    echo "the pull beside generation and beside Python, 1 rank: rc $?"
    peer_job 8 3 360 "with the header read ordered before the copies, 8 steps"
    bundle ;;
  call70)  # the 4-GPU LLaDA-8B job (3 ZeRO-3 ranks + 1 worker) over peer with call69's pull, 7 steps
    system4 sys4_peer 7 4 weights.backend=peer ;;
  call71)  # call69's job again with the GIL probe (push_stage_gil): the slow push near the save, GIL or lock?
    peer_job 8 3 360 "with the GIL probe, 8 steps"
    bundle ;;
  call72)  # auto builds each push group by where its members run: the system GPU tests (1 + 1, 2 + 2; nccl and auto),
           # the elastic test (scale-out and a killed worker; nccl and auto, ZeRO-2), the peer tests; 4 GPUs
    timeout 500 python3 -m pytest -q -s tests/gpu/test_system_gpu.py tests/gpu/test_elastic_gpu.py \
      tests/gpu/test_peer_push_gpu.py > "$OUT/gpu_tests_auto.log" 2>&1
    echo "system, elastic and peer GPU tests: rc $?"
    tail -n 3 "$OUT/gpu_tests_auto.log"
    bundle ;;
  call73)  # the shipped llada8b_1node.yaml (weights.backend auto) as the 4-GPU job: 3 ZeRO-3 ranks + 1 worker, 7 steps
    system4 sys4_auto 7 4 ;;
  call74)  # the elastic GPU test again (its requests held until the new workers start), then auto_job; as run on a
           # 4-GPU host the job was planned for 4 GPUs (LLaDA-8B, 3 ranks + 1 worker), and 360 s cut it after 5 of 8 steps
    timeout 200 python3 -m pytest -q -s tests/gpu/test_elastic_gpu.py > "$OUT/gpu_elastic_auto.log" 2>&1
    echo "elastic GPU test, nccl and auto: rc $?"
    tail -n 3 "$OUT/gpu_elastic_auto.log"
    auto_job 8 3 360
    bundle ;;
  call75)  # the 11-layer job as shipped (auto), 1 rank + 1 worker, with the GIL probe, on GPUs 0,1 of any host
    CUDA_VISIBLE_DEVICES=0,1 auto_job 7 3 320
    bundle ;;
  call76)  # the slow pushes of call75 fell in the two steps after the first update, while the checkpoint region is
           # reserved (faulted in, page-locked): the same job with the region reserved at the first save instead,
           # beside the job as shipped; a 4-GPU host, one job on GPUs 0,1 and one on 2,3
    lane reserve_at_save 0,1 auto_job 7 3 330 sys_reserve_at_save learner.checkpoint.reserve=false &
    lane as_shipped 2,3 auto_job 7 3 330 sys_as_shipped &
    wait
    bundle ;;
  call77)  # the peer sender's one-round-trip read of the answers (store.multi_get) on this torch: the peer tests and the
           # auto system tests first; then call76's two lanes (the checkpoint region reserved at the first save, as shipped)
    timeout 200 python3 -m pytest -q -s tests/gpu/test_peer_push_gpu.py tests/gpu/test_system_gpu.py -k "peer or auto" \
      > "$OUT/gpu_tests_multi_get.log" 2>&1
    echo "peer and auto system GPU tests: rc $?"
    tail -n 3 "$OUT/gpu_tests_multi_get.log"
    lane reserve_at_save 0,1 auto_job 7 3 330 sys_reserve_at_save learner.checkpoint.reserve=false &
    lane as_shipped 2,3 auto_job 7 3 330 sys_as_shipped &
    wait
    bundle ;;
  call78)  # a LoRA job's adapter partitions pulled over peer (the GPU system test's LoRA case: 2 ZeRO-3 ranks + 1 worker,
           # auto), then TraDo's 11-layer job as shipped (auto: peer) beside the same over nccl; a 4-GPU host
    timeout 150 python3 -m pytest -q -s tests/gpu/test_system_gpu.py -k "True" > "$OUT/gpu_tests_lora_peer.log" 2>&1
    echo "the LoRA system GPU test over auto: rc $?"
    tail -n 3 "$OUT/gpu_tests_lora_peer.log"
    lane trado_auto 0,1 trado_job 6 3 380 sys_trado_auto &
    lane trado_nccl 2,3 trado_job 6 3 380 sys_trado_nccl weights.backend=nccl &
    wait
    bundle ;;
  call79)  # call78's LoRA GPU test again, its adapters trained away from B = 0 (a reward with spread, lr 1e-2); then
           # LLaDA-8B's LoRA job (adapters pushed) as shipped (auto: peer) beside the same over nccl; a 4-GPU host
    timeout 120 python3 -m pytest -q -s tests/gpu/test_system_gpu.py -k "True" > "$OUT/gpu_tests_lora_peer.log" 2>&1
    echo "the LoRA system GPU test over auto: rc $?"
    tail -n 3 "$OUT/gpu_tests_lora_peer.log"
    lane lora_auto 0,1 lora_job 400 sys_lora_auto &
    lane lora_nccl 2,3 lora_job 400 sys_lora_nccl weights.backend=nccl &
    wait
    bundle ;;
  call61)
    python3 tests/benchmarks/bench_push.py --engine --learners 3 --receivers 1 --reps 3 \
      --modes raw_busy,busy,peer_staged,peer_busy --out "$OUT/push_peer_3ranks.json" > "$OUT/push_peer_3ranks.log" 2>&1
    echo "push beside generation, broadcast and pull, 3 ranks: rc $?"
    system4 sys4_peer 6 4 weights.backend=peer ;;
  call50)
    shift
    name="$*"
    name=${name//[=. ]/_}
    system4 "sys4_${name:-as_is}" 6 4 "$@" ;;
  call15)
    OUT=$OUT/offload bash tests/benchmarks/run_system_gpu.sh --work /tmp/sys_offload --parts ckpt_llada,matmul,offload_llada_mb32 \
      --no-profile --no-resume --deadline-s 520 ;;
  *) echo "usage: $0 call1|call2|call2b|call3|call4|call5|call6|call56|call7|call8|call9|call10|call11|call12|call13|call14|call15|call16|call17|call18|call19|call20|call21|call22|call23|call24|call25|call26|call27|call28|call29|call30|call31|call32|call31x2|call33|call34|call35|call36|call37|call38|call39|call40|call41|call42|call43|call44|call45|call46|call46e|call47|call48|call49|call50|call51|call52|call53|call54|call55|call59|call60|call61|call62|call63|call64|call65|call66|call67|call68|call69|call70|call71|call72|call73|call74|call75|call76|call77|call78|call79" >&2; exit 2 ;;
esac

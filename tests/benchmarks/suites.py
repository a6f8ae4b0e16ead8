"""The named benchmark suites: what each runner runs for a table of BENCHMARKS.md, on your own GPUs.

A suite is one runner's command line under a name; every row of BENCHMARKS.md names the suite whose
run made its record. ``--tiny`` rehearses a suite on the CPU at toy shapes through the same scripts
(``make test`` runs every rehearsal: tests/benchmarks/test_suites.py).

    python tests/benchmarks/run_all.py --suite sampler --out runs/bench/sampler
    python tests/benchmarks/run_system.py --suite llada --out runs/bench/llada
    python tests/benchmarks/peers/run_peers.py --suite stabledrl --peer-root DIR --peer-pythonpath LIB \\
        --out runs/bench/peers
    python tests/benchmarks/run_all.py --suite sampler --tiny --out /tmp/sampler     # the CPU rehearsal

Arguments given on the command line after the suite's win (the last of a repeated flag counts), so
``--suite llada --steps 5`` is the suite with five steps.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

RESULTS = Path(__file__).resolve().parent / "results"


def python() -> str:
    """The interpreter the runners and benchmarks start their scripts with: STABLEDRL_BENCH_PYTHON where
    set (the tests set one that forks each script from a process that has imported torch already), else
    this one's."""
    return os.environ.get("STABLEDRL_BENCH_PYTHON") or sys.executable


@dataclass(frozen=True)
class Job:
    """One benchmark script of a ``run_all`` suite, in its own process."""

    name: str
    script: str
    args: tuple[str, ...] = ()
    gpus: tuple[int, ...] = (0,)  # the GPU indices it uses
    timeout_s: float = 600.0
    peak: Optional[str] = None  # the matmul job whose measured rate is its denominator
    tiny: tuple[str, ...] = ()  # added for the CPU rehearsal


@dataclass(frozen=True)
class ComponentSuite:
    """``run_all.py --suite NAME``: the jobs in order; a job needing more GPUs than the machine has
    is skipped and named. ``jobs`` empty: run_all's own two-lane plan (``components``)."""

    what: str
    min_gpus: int
    jobs: tuple[Job, ...] = ()
    shape: str = ""  # the model shape its records are named by ("" for several)


@dataclass(frozen=True)
class SystemSuite:
    """``run_system.py --suite NAME``: its parts for a 2-GPU plan and for 4 or more GPUs, and the
    runner's options."""

    what: str
    parts: str
    parts_2gpu: str
    shape: str  # the model shape its records are named by, 4 GPUs or more
    shape_2gpu: str
    args: tuple[str, ...] = ()
    tiny: tuple[str, ...] = ()


@dataclass(frozen=True)
class PeerSuite:
    """``run_peers.py --suite NAME``: the peer benchmark's options (the pair, its loops, the
    project's variants); ``--peer-root`` and ``--peer-pythonpath`` are the user's."""

    what: str
    shape: str
    args: tuple[str, ...]
    tiny: tuple[str, ...] = ()


MATMUL = Job("matmul_gpu0", "bench_matmul.py", timeout_s=120, tiny=("--reps", "3"))
# bench_push --engine: the receiver generating as a rollout worker does while the push is staged
# (busy), idle (staged), the raw broadcast beside the same generation (raw_busy), and the pull
# (peer_*). The rehearsal runs every mode (gathered first, a larger round, beside a thread running
# Python, row by row); the tiny head's logits are ~1000x smaller than the 8B stand-in's, hence its scale
PUSH_MODES = "raw_busy,staged,busy,peer_staged,peer_busy"
PUSH_TINY = ("--learners", "2", "--reps", "1", "--bucket-mb", "0.05", "--busy-head-scale", "3000", "--modes",
             "gather,shards,raw_busy,staged,busy,busy@0.1,peer_staged,peer_busy,peer_busy_rows,peer_python,"
             "peer_python_rows")

RUN_ALL: dict[str, ComponentSuite] = {
    "components": ComponentSuite(
        "every component benchmark on two GPUs in two lanes: matmul rate, samplers, learner, push, asynchrony "
        "(run_all's own plan; --quick its short form)", min_gpus=1),
    "sampler": ComponentSuite(
        "the samplers at 8B on one GPU: LLaDA-8B's exact sampler against the matmul rate, the engine's graph "
        "pool over a spread of prompt lengths, SDAR-8B block diffusion compiled and graphed with both draws",
        min_gpus=1, shape="llada8b-sdar8b",
        jobs=(MATMUL,
              Job("naive", "bench_full_attention.py", ("--parts", "naive"), peak="matmul_gpu0"),
              Job("graph_pool", "bench_full_attention.py", ("--parts", "graph_pool"), peak="matmul_gpu0",
                  tiny=("--pool-requests", "3")),
              Job("block_diffusion", "bench_block_diffusion.py",
                  ("--quick", "--parts", "compiled,split_counter,decode"), peak="matmul_gpu0", timeout_s=900))),
    "roofline": ComponentSuite(
        "where generation's time goes at LLaDA-8B on one GPU: the decoder layer's matmuls at the widths a job feeds "
        "(the whole canvas, the block), attention with the sampler's mask and without, and the exact sampler and "
        "the graphed, compiled dual-cache step profiled by kernel, at d1's worker (12 rows of 200 + 256 tokens) and "
        "StableDRL's (16 rows of 128 + 256)",
        min_gpus=1, shape="llada8b",
        jobs=(MATMUL,
              Job("roofline_d1", "bench_roofline.py", ("--rows", "12", "--prompt", "200"), peak="matmul_gpu0",
                  timeout_s=900, tiny=("--no-compile", "--prompt", "16")),
              Job("roofline_stabledrl", "bench_roofline.py", ("--rows", "16", "--prompt", "128"),
                  peak="matmul_gpu0", timeout_s=900, tiny=("--no-compile", "--rows", "2", "--prompt", "16")))),
    "push": ComponentSuite(
        "the learner's weight push against the raw broadcast of the same bytes: 1 ZeRO-3 rank to 1 receiver at "
        "LLaDA-8B's width with 11 layers, idle and beside the receiver's generation, broadcast and pull; the "
        "copy engines' pull; a LoRA push; the same-device push; on 4 GPUs 3 ZeRO-3 ranks at LLaDA-8B",
        min_gpus=2, shape="llada8b",
        jobs=(Job("push_1rank", "bench_push.py",
                  ("--engine", "--learners", "1", "--receivers", "1", "--layers", "11", "--reps", "5",
                   "--modes", PUSH_MODES), gpus=(0, 1), tiny=PUSH_TINY),
              Job("peer_pull", "bench_peer_pull.py", ("--sources", "1", "--layers", "11"), gpus=(0, 1),
                  tiny=("--reps", "1", "--busy-head-scale", "3000")),
              Job("lora_push", "bench_lora_push.py", ("--engine",), tiny=("--reps", "1", "--rank", "4")),
              Job("ipc_push", "bench_ipc_push.py", tiny=("--reps", "1")),
              Job("push_3ranks", "bench_push.py",
                  ("--engine", "--learners", "3", "--receivers", "1", "--reps", "3", "--modes", "shards,peer_staged"),
                  gpus=(0, 1, 2, 3), tiny=PUSH_TINY))),
    "learner": ComponentSuite(
        "the 8B ZeRO-3 learner over 4 ranks (LLaDA-8B, 64-row forwards, activation checkpointing), eager and "
        "with learner.compile, against the measured matmul rate",
        min_gpus=4, shape="llada8b",
        jobs=(MATMUL,
              Job("learner_8b", "bench_learner.py",
                  ("--shape", "llada-8b", "--world", "4", "--stages", "3t", "--checkpointing", "on",
                   "--micro-batch-groups", "4", "--groups-per-step", "8", "--compile", "off,on", "--steps", "2"),
                  gpus=(0, 1, 2, 3), peak="matmul_gpu0", timeout_s=900,
                  # one rank: the component suite's rehearsal runs the learner over 2 (learner_2gpu)
                  tiny=("--shape", "tiny-llada", "--world", "1", "--micro-batch-groups", "1", "--groups-per-step",
                        "2", "--steps", "1")))),
}

# the full jobs' options on your own GPUs: timed steps before the save (the baseline: from step 3)
# and after it, and a limit that an 8B job with its resume check fits
SYSTEM_TIME = ("--system-timeout-s", "1500", "--deadline-s", "3600")
SYSTEM_TINY = ("--steps", "4", "--checkpoint-at", "3", "--system-timeout-s", "450", "--deadline-s", "900")
# the push part is the same script with the same arguments in every suite (the raw broadcast of LLaDA-8B's
# bytes): the llada suite's rehearsal runs it, the trado and lora rehearsals leave it out
RUN_SYSTEM: dict[str, SystemSuite] = {
    "llada": SystemSuite(
        "LLaDA-8B's job as shipped (llada8b_1node.yaml): the push in the job against the raw broadcast, the step "
        "after a checkpoint, learner MFU, rollout against the engine alone, the resume. 2 GPUs: 1 learner rank + 1 "
        "worker at LLaDA-8B's width with 11 layers; 4: 3 ZeRO-3 ranks + 1 worker at 8B; 8: the config's 4 + 4",
        parts="ckpt_llada,matmul,push,engine_llada,system_llada",
        parts_2gpu="ckpt_llada_short,matmul,push,system_llada", shape="llada8b", shape_2gpu="llada8b-11l",
        args=("--steps", "7", "--checkpoint-at", "4", *SYSTEM_TIME), tiny=SYSTEM_TINY),
    "trado": SystemSuite(
        "TraDo's job as shipped (trado8b_1node.yaml, SDAR-8B's width with 11 layers, 1 rank + 1 worker): the "
        "staircase learner's MFU, the push, the step after a checkpoint",
        parts="ckpt_sdar_short,matmul,push,system_trado", parts_2gpu="ckpt_sdar_short,matmul,push,system_trado",
        shape="sdar8b-11l", shape_2gpu="sdar8b-11l",
        args=("--plan-gpus", "2", "--steps", "6", "--checkpoint-at", "3", "--no-resume", *SYSTEM_TIME),
        tiny=(*SYSTEM_TINY, "--no-profile", "--parts", "ckpt_sdar_short,matmul,system_trado")),
    "lora": SystemSuite(
        "LLaDA-8B's job with learner.lora (r 128, alpha 64, all 32 layers, 1 rank + 1 worker): the adapters' push "
        "in the job, the learner's peak memory",
        parts="ckpt_llada,matmul,push,lora_llada", parts_2gpu="ckpt_llada,matmul,push,lora_llada",
        shape="llada8b-r128", shape_2gpu="llada8b-r128",
        args=("--plan-gpus", "2", *SYSTEM_TIME), tiny=("--parts", "ckpt_llada,matmul,lora_llada")),
    "offload": SystemSuite(
        "full-parameter LLaDA-8B on 2 GPUs with the optimizer on the host (ZeRO-2, offload_optimizer cpu), at the "
        "shipped 16-row micro-batches and at 32",
        parts="ckpt_llada,matmul,offload_llada,offload_llada_mb32",
        parts_2gpu="ckpt_llada,matmul,offload_llada,offload_llada_mb32", shape="llada8b", shape_2gpu="llada8b",
        args=("--plan-gpus", "2", *SYSTEM_TIME), tiny=("--parts", "ckpt_llada,matmul,offload_llada_mb32")),
}

# the project's loops at the recipes with the releases' own layout: a learner rank and a rollout worker
# on every GPU taking turns (cluster.colocate); the fast paths: Fast-dLLM's dual cache, threshold
# decoding at 0.9, the dual-cache step replayed as a CUDA graph
COLOCATED = "cluster.colocate=true;weights.backend=auto;algorithm.max_staleness=0"
FAST_GRAPH = "sampler.cache=dual;sampler.threshold=0.9;sampler.compile=false;sampler.cuda_graph=true"
# d1's recipe colocated on 80 GB: the merged push (no unmerged copy on the worker), the first 8
# layers checkpointed (the learner's activations beside the worker's copy)
def d1_colocated(layers: int) -> str:
    return f"{COLOCATED};learner.lora.push=merged;model.gradient_checkpointing=true;model.checkpointed_layers={layers}"


D1 = d1_colocated(8)
# the releases' protocol at the cited records: one run of each loop; the release's first round a warm-up and
# its second timed, the project's third step timed (d1: its first two steps, and so its first push, left out)
ONE_ROUND = ("--runs", "1", "--cycles", "1", "--peer-cycles", "1")
# the StableDRL pair at ``layers`` of LLaDA-8B's 32 (24 on one H200, 32 on two): the release on the halved
# round (2 accumulation rounds a GPU), a warm-up round and ``peer_cycles`` timed, the project timed after its
# first two steps (run_peers.py --project-skip)
def stabledrl_depth(loops: str, cycles: int, part_timeout_s: int, layers: int = 24, peer_cycles: int = 1,
                    runs: int = 1) -> tuple[str, ...]:
    return ("--pairs", "stabledrl", "--layers", str(layers), "--loops", loops, "--cycles", str(cycles),
            "--peer-cycles", str(peer_cycles), "--runs", str(runs), "--project-skip", "2", "--round-scale", "0.5",
            "--part-timeout-s", str(part_timeout_s))


DEPTH_TINY = ("--cycles", "1", "--part-timeout-s", "400")  # a depth suite's rehearsal: one timed step, one round
# the StableDRL pair at all 32 layers over two GPUs (two warm-up steps and 5 timed, a warm-up round and 4 timed),
# rehearsed on one
DEPTH32_TINY = (*DEPTH_TINY, "--peer-cycles", "1", "--gpus", "1")


def stabledrl_depth32(loops: str) -> tuple[str, ...]:
    return (*stabledrl_depth(loops, cycles=5, part_timeout_s=545, layers=32, peer_cycles=4), "--gpus", "2")


# d1's pair at its full 32 layers on one GPU (LoRA), one run of each loop: a warm-up (the project's two steps) and
# ``cycles`` timed
def d1_depth(loops: str, cycles: int = 2, part_timeout_s: int = 320, runs: int = 1) -> tuple[str, ...]:
    return ("--pairs", "d1", "--layers", "32", "--loops", loops, "--cycles", str(cycles), "--runs", str(runs),
            "--part-timeout-s", str(part_timeout_s))


RUN_PEERS: dict[str, PeerSuite] = {
    "stabledrl": PeerSuite(
        "the StableDRL release's training loop against stabledrl train at its recipe, LLaDA-8B's width with 8 of "
        "its 32 layers: the recipe colocated (the release's sampler) and with the fast paths",
        shape="llada8b-8l",
        args=("--pairs", "stabledrl", "--layers", "8", "--loops", "peer,colocated,colocated_fast_graph",
              "--variant", f"colocated_fast_graph={COLOCATED};{FAST_GRAPH}", *ONE_ROUND, "--project-steps", "3",
              "--part-timeout-s", "900"),
        # the rehearsal runs the fast loop (the colocated loop is the same job with the recipe's own
        # sampler; its overrides are checked by test_suites.py)
        tiny=("--loops", "peer,colocated_fast_graph", "--project-steps", "2", "--part-timeout-s", "400")),
    "d1": PeerSuite(
        "d1's diffu-GRPO against stabledrl train at its LoRA recipe, all 32 layers of LLaDA-8B: the release's "
        "sampler and the fast paths, colocated, timed at the third step",
        shape="llada8b-lora",
        args=("--pairs", "d1", "--loops", "peer,colocated_ckpt8,colocated_fast_graph_ckpt8",
              "--variant", f"colocated_ckpt8={D1}", "--variant", f"colocated_fast_graph_ckpt8={D1};{FAST_GRAPH}",
              *ONE_ROUND, "--project-steps", "3", "--project-skip", "2", "--part-timeout-s", "900"),
        # the rehearsal runs the fast loop (as for stabledrl); the tiny LLaDA has 2 decoder layers: its
        # first checkpointed
        tiny=("--loops", "peer,colocated_fast_graph_ckpt8", "--part-timeout-s", "400",
              "--variant", f"colocated_fast_graph_ckpt8={d1_colocated(1)};{FAST_GRAPH}")),
    # the depth budget: each suite one command of at most 10 minutes on one H200 (estimated from the 24-layer
    # figures on one H200: the project ~48 s a step of 2 groups, the release ~66 s a round of 2 accumulation
    # rounds, ~2.5 min of start-up each)
    "depth-budget-stabledrl": PeerSuite(
        "the StableDRL recipe as committed (colocated, the workers viewing their ranks' weights) at 24 of "
        "LLaDA-8B's 32 layers for 5 steps of 2 groups a GPU: its peak memory per GPU against the release's, and "
        "its rate over the last 3; then the release on the same halved round (2 accumulation rounds), a warm-up "
        "round and one timed. One H200, one command of at most 10 minutes",
        shape="llada8b-24l",
        args=stabledrl_depth("release_sampler,peer", cycles=3, part_timeout_s=360), tiny=DEPTH_TINY),
    # the budget's pair again (4 steps of the recipe, to leave room for the release's round), and the recipe with
    # the shipped fast paths (Fast-dLLM's dual cache, threshold decoding 0.9; deploy/configs/llada8b_1node.yaml)
    # against the release in the same command
    "depth-runs-stabledrl": PeerSuite(
        "the StableDRL pair at 24 of LLaDA-8B's 32 layers: the recipe as committed (two warm-up steps and 2 timed), "
        "then the release (a warm-up round and one timed); --loops peer,release_sampler for the other order. "
        "One H200, one command of at most 10 minutes",
        shape="llada8b-24l",
        args=stabledrl_depth("release_sampler,peer", cycles=2, part_timeout_s=330), tiny=DEPTH_TINY),
    "depth-fast-stabledrl": PeerSuite(
        "the StableDRL pair at 24 of LLaDA-8B's 32 layers: the release (a warm-up round and one timed), then the "
        "recipe with the fast paths (two warm-up steps and 2 timed). One H200, one command of at most 10 minutes",
        shape="llada8b-24l",
        args=stabledrl_depth("peer,fast", cycles=2, part_timeout_s=330), tiny=DEPTH_TINY),
    # all 32 layers, full-parameter: the release's FSDP and the recipe's ZeRO-3 over two GPUs, the same halved
    # round a GPU as at 24 layers (4 groups a step over the 2 GPUs); each side is one command of at most 10
    # minutes: --loops release_sampler, then --loops peer --merge OUT/results.json for the table of both
    "depth32-stabledrl": PeerSuite(
        "the StableDRL pair at all 32 of LLaDA-8B's layers, full-parameter on two GPUs: the recipe as committed "
        "(two warm-up steps and 5 timed; its peak memory per GPU over the 7 steps), then the release (a warm-up "
        "round and 4 timed). Two H200s; on a machine that limits a command to 10 minutes, one loop a command",
        shape="llada8b-32l",
        args=stabledrl_depth32("release_sampler,peer"), tiny=DEPTH32_TINY),
    # the same release side with the recipe's shipped fast paths (the fast sampler at 24 layers:
    # depth-fast-stabledrl): --loops peer, then --loops fast --merge OUT/results.json
    "depth32-fast-stabledrl": PeerSuite(
        "the StableDRL pair at all 32 of LLaDA-8B's layers, full-parameter on two GPUs: the release (a warm-up "
        "round and 4 timed), then the recipe with the fast paths (two warm-up steps and 5 timed). Two H200s; on a "
        "machine that limits a command to 10 minutes, one loop a command",
        shape="llada8b-32l",
        args=stabledrl_depth32("peer,fast"), tiny=DEPTH32_TINY),
    "depth-budget-d1": PeerSuite(
        "d1's pair at its full 32 layers (LoRA fits one GPU): the release then the recipe as committed, a "
        "warm-up and 2 timed cycles each. One H200, one command of at most 10 minutes",
        shape="llada8b-lora",
        args=d1_depth("peer,release_sampler"), tiny=DEPTH_TINY),
    "depth-fast-d1": PeerSuite(
        "d1's pair at its full 32 layers: the release, then the recipe as committed with the shipped fast "
        "sampler (Fast-dLLM's dual cache, threshold decoding 0.9), a warm-up and 2 timed cycles each. One H200, "
        "one command of at most 10 minutes",
        shape="llada8b-lora",
        args=d1_depth("peer,fast"), tiny=DEPTH_TINY),
    # the full protocol for d1's pair at 32 layers, spread over commands of at most 10 minutes on one machine:
    # --loops peer, then --loops fast_graph_compiled --merge PREV/results.json, alternating, six commands
    # (each command's runs numbered on from the merged record's; the header says whether one machine ran them)
    "protocol-fast-d1": PeerSuite(
        "d1's pair at its full 32 layers, the protocol: the release and the recipe as committed with the shipped "
        "fast sampler (its step compiled and graphed: --loops fast_graph_compiled), 3 runs each in alternating "
        "order, a warm-up and 5 timed cycles a run. One H200; one loop a command, each merging the one before",
        shape="llada8b-32l",
        args=d1_depth("peer", cycles=5, part_timeout_s=420), tiny=DEPTH_TINY),
    # the same protocol for d1's recipe as committed (the release's sampler), split the same way
    "protocol-d1": PeerSuite(
        "d1's pair at its full 32 layers, the protocol: the release and the recipe as committed (the release's "
        "sampler), 3 runs each in alternating order, a warm-up and 5 timed cycles a run. One H200; one or two "
        "loops a command, each command merging the one before",
        shape="llada8b-32l",
        args=d1_depth("peer,release_sampler", cycles=5, part_timeout_s=420, runs=3), tiny=DEPTH_TINY),
    # the full protocol for the StableDRL pair at 32 layers, full-parameter on two GPUs: 3 runs a side in
    # alternating order, a warm-up and 5 timed cycles a run (a run of the release ~10 minutes, of the recipe
    # ~8); split over commands as protocol-fast-d1 is, each merging the one before
    "protocol-stabledrl": PeerSuite(
        "the StableDRL pair at all 32 of LLaDA-8B's layers, full-parameter on two GPUs, the protocol: the recipe "
        "as committed (the release's sampler) and the release on the halved round, 3 runs each in alternating "
        "order, a warm-up and 5 timed cycles a run. Two H200s",
        shape="llada8b-32l",
        args=(*stabledrl_depth("release_sampler,peer", cycles=5, part_timeout_s=900, layers=32, peer_cycles=5,
                               runs=3), "--gpus", "2"), tiny=DEPTH32_TINY),
    # the same protocol with the recipe's shipped fast paths: --loops fast, peer, fast, ... each command merging
    # the one before; the release loop is the one protocol-stabledrl runs, so that record's release runs may be
    # merged too (a loop's runs from several records are joined)
    "protocol-fast-stabledrl": PeerSuite(
        "the StableDRL pair at all 32 of LLaDA-8B's layers, full-parameter on two GPUs, the protocol: the recipe "
        "with the shipped fast paths and the release on the halved round, 3 runs each in alternating order, a "
        "warm-up and 5 timed cycles a run. Two H200s; one loop a command, each command merging the one before",
        shape="llada8b-32l",
        args=(*stabledrl_depth("peer,fast", cycles=5, part_timeout_s=900, layers=32, peer_cycles=5, runs=3),
              "--gpus", "2"), tiny=DEPTH32_TINY),
}

SUITES = {"run_all": RUN_ALL, "run_system": RUN_SYSTEM, "run_peers": RUN_PEERS}


def suite(runner: str, name: str):
    """The suite ``name`` of ``runner`` (run_all, run_system, run_peers); SystemExit naming the known ones."""
    known = SUITES[runner]
    if name not in known:
        raise SystemExit(f"{runner}: unknown suite {name!r}; known: {', '.join(known)}")
    return known[name]


def expand(runner: str, argv: list[str]) -> list[str]:
    """``argv`` with ``--suite NAME`` replaced by the suite's arguments (and its rehearsal's under
    ``--tiny``), placed first so that the arguments given after them win; ``--suite NAME`` itself stays
    for the runner to read. A command line without ``--suite`` is returned as it is."""
    if "--suite" not in argv:
        return list(argv)
    at = argv.index("--suite")
    if at + 1 >= len(argv):
        raise SystemExit(f"{runner}: --suite needs a name; known: {', '.join(SUITES[runner])}")
    chosen = suite(runner, argv[at + 1])
    extra = [*getattr(chosen, "args", ()), *(getattr(chosen, "tiny", ()) if "--tiny" in argv else ())]
    return [*extra, *argv]


def record_name(suite_name: str, shape: str, card: str, count: int) -> str:
    """What a record is, as its file name: ``system-llada_llada8b-11l_h200x2`` (the suite, the model
    shape, the card and how many of it)."""
    match = re.search(r"\b([A-Z]{1,2}\d{2,3}[A-Z]?)\b", card)  # H100, H200, A100, L40S, B200
    short = match.group(1) if match else card
    words = [suite_name, shape, f"{re.sub(r'[^A-Za-z0-9]+', '-', short).strip('-')}x{count}"]
    return "_".join(w for w in words if w).lower()


def keep(out: Path, record: str, table: str) -> Path:
    """A GPU run's ``out/results.json`` and its ``table`` markdown copied to
    tests/benchmarks/results/RECORD.json and .md. A record is named by what it is (the suite, the
    card and how many), so a later run of the suite on the same card replaces it; BENCHMARKS.md cites
    the records by these names."""
    RESULTS.mkdir(exist_ok=True)
    if out.resolve() != RESULTS.resolve():
        shutil.copy(out / "results.json", RESULTS / f"{record}.json")
        shutil.copy(out / table, RESULTS / f"{record}.md")
    return RESULTS / record

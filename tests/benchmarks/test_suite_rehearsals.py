"""Every named suite's CPU rehearsal (``--tiny``, suites.py): the suite's scripts at the tiny shapes
through its runner, as a user runs the suite on their GPUs; each must exit 0 with every part
measured. The peer suites are rehearsed a pair at a time: every loop and variant of the pair's suites
validated, and one run of each that another's run does not cover (they differ only in counts at the tiny
shape). The component suite's rehearsal with the fewest repetitions is test_rehearsal.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import suites  # noqa: E402
from run_all import SAFE_ENV  # noqa: E402
import warm_workers  # noqa: E402  (tests/helpers, on the path: tests/conftest.py)
from without_inductor import WITHOUT_INDUCTOR  # noqa: E402  (tests/helpers)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RUNNERS = {"run_all": HERE / "run_all.py", "run_system": HERE / "run_system.py",
           "run_peers": HERE / "peers" / "run_peers.py"}
FAKE_PEER = HERE / "peers" / "fake_peer.py"
# each rehearsal is a runner with its own limit of 1500 s (its subprocess timeout)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
TESTS_STAND_ALONE = True  # each rehearsal is a runner of its own: they spread over the test workers


def run(runner: str, *args, inductor: bool = True) -> subprocess.CompletedProcess:
    """The runner; it, the scripts it starts and the Ray jobs' workers are forked from a warm process
    (warm_workers.py). Without ``inductor`` its compiled forwards trace and run without inductor's C++
    build (without_inductor.py)."""
    # the environment run_all gives each script (SAFE_ENV): their warm process is that environment's
    python, env = warm_workers.python({**SAFE_ENV, **({} if inductor else WITHOUT_INDUCTOR)})
    return subprocess.run([python, str(RUNNERS[runner]), *map(str, args)], cwd=REPO, timeout=1500,
                          capture_output=True, text=True, env=env)


def rehearse(runner: str, name: str, tmp_path: Path, *args, inductor: bool = True) -> dict:
    """The suite's CPU rehearsal; its results.json (the run must have exited 0)."""
    return tiny(runner, tmp_path, "--suite", name, *args, inductor=inductor)


def tiny(runner: str, tmp_path: Path, *args, inductor: bool = True) -> dict:
    """The runner at the tiny shapes, its output in tmp_path/out; its results.json (it must have exited 0)."""
    out = tmp_path / "out"
    done = run(runner, "--tiny", "--out", out, *args, inductor=inductor)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    return json.loads((out / "results.json").read_text())



def parts_of(results: dict, job: str) -> dict:
    record = results["jobs"][job]
    assert record["status"] == "ok", record
    return record["result"]["parts"]


def test_the_sampler_suite(tmp_path):
    """Its graph_pool job is bench_full_attention.py's graph_pool part alone, which the component
    suite's full_attention job runs at the same tiny shape with the same checks (test_rehearsal.py):
    rehearsed there, left out here."""
    graph_pool = next(j for j in suites.RUN_ALL["sampler"].jobs if j.name == "graph_pool")
    assert graph_pool.script == "bench_full_attention.py" and graph_pool.args == ("--parts", "graph_pool")
    results = rehearse("run_all", "sampler", tmp_path, "--only", "naive,block_diffusion")
    assert set(results["jobs"]) == {"matmul_gpu0", "naive", "graph_pool", "block_diffusion"}
    assert results["jobs"]["graph_pool"] == {"status": "skipped", "reason": "not in --only"}
    naive = parts_of(results, "naive")["naive"]  # eager, then compiled with the fused token choice
    assert naive["s_per_step"] > 0 and naive["engine_pct_of_measured_matmul"] > 0, naive
    assert naive["compiled"]["s_per_step"] > 0 and naive["compiled"]["tokens_equal_to_eager"] == 1.0  # fp32
    bd = parts_of(results, "block_diffusion")
    runs = bd["compiled"]["by_run"]  # the counter-based draw on the compiled pool
    assert runs["32_counter_again"]["speedup_vs_generator"] > 0 and runs["32_counter_again"]["captures"] == 0
    assert set(bd["split_counter"]["by_kind"]) == {"prefill", "enter", "inside", "decode"}
    assert {f"{c}{n}_{m}_ms" for c in ("", "counter_") for n in ("float64", "float32") for m in ("eager", "fused")} \
        <= set(bd["decode"])


def test_the_push_suite(tmp_path):
    """2 ZeRO-3 learner ranks of a real DeepSpeed engine (gloo) and a receiver: the raw broadcast,
    the gathered and the sharded push, into a rollout engine's staging copy idle and beside requests
    it generates, and the pull (peer: the receiver reads each rank's buffer; beside a thread running
    Python; row by row as before), each delivering the learner's weights bit for bit; the copy
    engines' pull likewise. The suite's LoRA push and same-device push are the component suite's
    jobs with its arguments, rehearsed there (test_rehearsal.py); the 3-rank push is this script
    with more learner ranks."""
    staged = ("staged", "busy", "busy@0.1", "peer_staged", "peer_busy", "peer_busy_rows", "peer_python",
              "peer_python_rows")
    results = rehearse("run_all", "push", tmp_path, "--only", "push_1rank,peer_pull")
    assert results["jobs"]["push_3ranks"] == {"status": "skipped", "reason": "needs 4 GPUs"}
    assert results["jobs"]["lora_push"]["status"] == results["jobs"]["ipc_push"]["status"] == "skipped"
    parts = parts_of(results, "push_1rank")  # every mode in the rehearsal (the GPU run times the suite's five)
    assert parts["setup"]["sources"] == 2 and parts["raw"]["median_s"] > 0
    for mode, sources in (("gather", 0), ("shards", 2)):
        push = parts[f"push_{mode}"]
        assert push["weights_bit_identical"] and push["median_s"] > 0 and push["sources"] == sources
    segments = parts["push_shards"]["rank0_segments"]
    assert segments["rounds"] > 1 and segments["segments_as_they_lie"] == segments["rounds"]
    assert segments["segments_packed"] == 0
    for mode in staged:
        push = parts[f"push_{mode}"]
        assert push["weights_bit_identical"] and push["median_s"] > 0 and push["sources"] == 2, mode
        assert ("receiver_requests" in push) == ("busy" in mode), mode
        assert ("receiver_python_loops" in push) == ("python" in mode), mode
    for mode in (m for m in staged if "busy" in m):  # it was generating, more than one token per row a forward
        requests = parts[f"push_{mode}"]["receiver_requests"]
        assert requests["done"] >= 1 and requests["tokens_per_forward"] > 32, (mode, requests)  # 32 rows
    assert parts["push_busy@0.1"]["bucket_mb"] == 0.1 and parts["push_busy"]["bucket_mb"] == 0.05
    raw_busy = parts["raw_busy"]  # the raw broadcast beside the same requests: the busy pushes' denominator
    assert raw_busy["median_s"] > 0 and raw_busy["receiver_requests"]["done"] >= 1
    assert parts["push_busy"]["ratio_to_raw_busy"] == parts["push_busy"]["median_s"] / raw_busy["median_s"]
    assert parts["push_staged"]["ratio_to_raw_busy"] is None  # idle: set against the idle raw only
    assert parts["push_busy@0.1"]["rank0_segments"]["rounds"] < segments["rounds"]
    pull = parts_of(results, "peer_pull")
    assert pull["pull_idle"]["median_s"] > 0 and pull["pull_busy"]["median_s"] > 0


def test_the_roofline_suite(tmp_path):
    """d1's worker shape at the tiny model (StableDRL's job is the same script at other rows and
    prompt): the layer's matmuls at both widths, attention, and both samplers timed and profiled,
    the shape's ceiling computed from the gemm part's rates against the measured matmul rate."""
    results = rehearse("run_all", "roofline", tmp_path, "--only", "matmul_gpu0,roofline_d1")
    assert results["jobs"]["roofline_stabledrl"] == {"status": "skipped", "reason": "not in --only"}
    parts = parts_of(results, "roofline_d1")
    model = parts["model"]
    canvas, block = model["rows"] * (model["prompt"] + model["gen"]), model["rows"] * model["block"]
    assert [w["m"] for w in parts["gemm"].values()] == [canvas, block]
    for width in parts["gemm"].values():
        assert width["layer_tflops"] > 0 and len(width["linears"]) == 7, width  # LLaDA: q, k, v, o and the MLP's 3
    assert parts["attention"]["boolean mask (sdpa's choice)"]["ms_per_forward"] > 0
    assert parts["attention"]["no mask"]["ms_per_forward"] > 0
    for name, fed in (("exact", canvas), ("dual", None)):
        row = parts[name]
        assert row["forwards"] > 0 and row["of_matmul"] > 0 and row["shape_ceiling_of_matmul"] > 0, (name, row)
        assert fed is None or row["tokens_per_forward"] == fed
    assert parts["dual"]["tokens_per_forward"] < canvas  # the cached steps feed the block, not the canvas


def test_the_roofline_of_left_padded_calls(tmp_path):
    """``--short-prompts``: half the rows' prompts shorter, so the samplers' calls are left-padded as in
    d1's job; attention is timed with the padding's mask and through the variable-length kernel (a CUDA
    kernel: recorded as unavailable on the CPU)."""
    python, env = warm_workers.python(SAFE_ENV)
    out = tmp_path / "roofline.json"
    done = subprocess.run([python, str(HERE / "bench_roofline.py"), "--tiny", "--short-prompts", "5",
                           "--parts", "attention,exact", "--out", str(out)],
                          cwd=REPO, timeout=900, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    parts, model = record["parts"], record["parts"]["model"]
    assert record["errors"] == {} and model["short_prompts"] == 5
    assert parts["attention"]["padded_rows"] == model["rows"] // 2
    assert parts["attention"]["boolean mask (sdpa's choice)"]["ms_per_forward"] > 0
    assert "unavailable" in parts["attention"]["the rows' real keys, variable-length flash"]
    # the canvas keeps the long prompts' width: the short rows are padded, not shortened
    assert parts["exact"]["tokens_per_forward"] == model["rows"] * (model["prompt"] + model["gen"])


def test_the_learner_suite(tmp_path):
    """The bench's steps eager and with learner.compile, the compiled ones traced and run without
    inductor's C++ build: the fused norms and activation with inductor are checked against eager
    gradients and updates in test_learner_fused.py and test_learner_engine.py."""
    results = rehearse("run_all", "learner", tmp_path, inductor=False)
    parts = parts_of(results, "learner_8b")
    for name in ("zero3t_ckpt_on", "zero3t_ckpt_on_compiled"):  # eager, then learner.compile on one engine
        assert parts[name]["step_s_median"] > 0 and parts[name]["skipped_steps_total"] == 0, name


def system_part(results: dict, name: str) -> dict:
    part = results["parts"][name]
    assert part["status"] == "ok", part
    return part["result"]["parts"]


def test_the_llada_system_suite(tmp_path):
    """The shipped LLaDA-8B config through ``stabledrl train`` with the tiny LLaDA in the released
    sharded layout, 2 gloo learner ranks and 1 rollout worker, 4 steps with a checkpoint after step
    3, held-out evaluations and a profiled step, then ``train --resume`` to step 4; beside it the
    denominators (matmul, the raw broadcast, the engine alone). Each actor's busy seconds plus idle
    must equal its wall time, and the resume must continue from the checkpoint."""
    results = rehearse("run_system", "llada", tmp_path, "--work", tmp_path / "work")
    assert {k: p["status"] for k, p in results["parts"].items()} == dict.fromkeys(
        ["ckpt_llada", "matmul", "push", "engine_llada", "system_llada"], "ok")
    assert system_part(results, "engine_llada")["engine"]["tokens_per_s"] > 0
    parts = system_part(results, "system_llada")
    job = parts["job"]
    assert job["rc"] == 0 and job["problems"] == [], job["log_tail"]
    f = job["figures"]
    assert f["steps"] == 4 and f["timed_steps"] == [3, 4]
    assert set(f["actors"]) == {"learner0", "learner1", "rollout0"}
    for name, actor in f["actors"].items():
        activities = {"train", "push"} if name.startswith("learner") else {"generate", "score", "reward"}
        assert activities <= set(actor["seconds"]) and 0 < actor["busy_fraction"] <= 1
    assert f["actors"]["learner0"]["seconds"]["checkpoint"] > 0  # the save after step 3, timed in step 4
    assert 0 < f["learner_mfu"] < 1 and f["learner_mfu_against_tflops"] > 0
    assert f["rollout_tokens_per_s_generating"] > 0 and f["samples_per_s"] > 0 and f["first_step_s"] > 0
    assert f["step_after_checkpoint_ratio"] > 0 and f["step_plain_steps"] == 1  # step 4 against step 3
    assert [s["step"] for s in f["per_step"]] == [1, 2, 3, 4]
    profile = job["learner_profile"][0]  # learner rank 0's 2nd step under torch.profiler
    assert profile["step"] == 2 and profile["wall_s"] > 0 and profile["top_host_ops"]
    assert profile["forwards_profiled"] == 1 <= profile["forwards_in_step"]  # a window, not the whole step
    assert parts["resume_check"] == {"resumed_at_step": 3, "expected": 3, "last_step": 4, "continued": True}
    assert parts["resume"]["problems"] == []
    assert not (tmp_path / "work" / "system_llada" / "run" / "checkpoints").exists()  # removed after the check
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| system_llada: in-job push / raw broadcast" in summary and "| engine_llada | ok |" in summary


@pytest.mark.parametrize("name, job", [("trado", "system_trado"), ("lora", "lora_llada"),
                                       ("offload", "offload_llada_mb32")])
def test_the_other_system_suites(name, job, tmp_path):
    """TraDo's job, the LoRA job and the offload job, each planned for 2 GPUs (1 rank + 1 worker). The
    push part, the same in every suite, is the LLaDA suite's rehearsal's."""
    results = rehearse("run_system", name, tmp_path, "--work", tmp_path / "work")
    assert all(p["status"] == "ok" for p in results["parts"].values()), results["parts"]
    assert "push" not in results["parts"] and "matmul" in results["parts"]
    assert results["plan_gpus"] == 2
    f = system_part(results, job)["job"]["figures"]
    assert f["steps"] >= 2 and set(f["actors"]) == {"learner0", "rollout0"} and f["push_s_median"] > 0


def _peer_options(name: str) -> tuple[str, list[str], dict[str, str]]:
    """A peer suite's pair, loops and variants at its rehearsal (the last of a repeated flag wins,
    as in the runner: a suite's tiny variant takes the place of its GPU one)."""
    argv = suites.expand("run_peers", ["--suite", name, "--tiny"])
    flags = dict(zip(argv, argv[1:]))
    variants = dict(v.partition("=")[::2] for k, v in zip(argv, argv[1:]) if k == "--variant")
    return flags["--pairs"], flags["--loops"].split(","), variants


def pair_rehearsal(pair: str) -> tuple[list[str], dict[str, str]]:
    """Every loop and variant of the peer suites of ``pair``: the suites differ in their counts
    (layers, cycles, runs, rounds, timeouts; test_suites.py checks those), and the tiny shape has
    one of each, so one rehearsal runs what all of them run."""
    loops, variants = [], {}
    for name in suites.RUN_PEERS:
        of, suite_loops, suite_variants = _peer_options(name)
        if of == pair:
            loops += [loop for loop in suite_loops if loop not in loops]
            variants.update(suite_variants)
    return loops, variants


PAIRS = sorted({_peer_options(name)[0] for name in suites.RUN_PEERS})
# the StableDRL pair also placed apart (the layout the recipes do not ship, as the peer benchmark's table
# compares it)
EXTRA_LOOPS = {"stabledrl": ["apart"]}
# loops that another loop's run covers at the tiny shape, validated by the runner's dry run instead of
# started: the fast sampler's settings are a subset of the colocated fast loop's (checked below), and the
# apart layout is the recipe's loop placed as the system suites' jobs are (the LLaDA system suite's
# rehearsal runs one through the same job harness)
CHECKED_ONLY = {"stabledrl": {"fast": "colocated_fast_graph", "apart": "release_sampler"},
                "d1": {"fast": "colocated_fast_graph_ckpt8"}}


@pytest.mark.parametrize("pair", PAIRS)
def test_the_peer_suites_of_each_pair(pair, tmp_path):
    """The peer driver with a fake peer of known timings (the releases' code is never part of the
    project), every loop of the pair's suites validated, then each that no other covers through the
    system benchmark at the tiny LLaDA (2 decoder layers, 1 rank and 1 worker): the figures of each,
    their ratio to the peer and their roofline in results.json and table.md."""
    loops, variants = pair_rehearsal(pair)
    checked = CHECKED_ONLY.get(pair, {})
    every = ["peer", *(x for x in loops + EXTRA_LOOPS.get(pair, []) if x != "peer")]
    loops = [x for x in every if x not in checked]
    # one warm-up step (the default two are for the shapes a real job meets; this checks the harness)
    results = tiny("run_peers", tmp_path, "--pairs", pair, "--loops", ",".join(loops), "--cycles", "1", "--runs", "1",
                   "--project-skip", "1", "--check-loops", ",".join(checked), "--peer-cycles", "1",
                   "--part-timeout-s", "400",
                   "--peer-root", tmp_path / "none", "--peer-script", f"{pair}={FAKE_PEER}",
                   *(x for name, sets in variants.items() for x in ("--variant", f"{name}={sets}")))
    assert set(results["parts"]) == {f"{pair}_L2_{k}" for k in ("checkpoint", *loops)}
    assert results["dry_runs"] == {f"{pair}_L2_{k}": None for k in every if k != "peer"}  # every loop validates
    for loop, by in checked.items():
        assert by in loops and set(results["variants"][loop]) <= set(results["variants"][by]) | {
            "cluster.colocate=false", "weights.backend=auto"}, (loop, by)
    peer = results["parts"][f"{pair}_L2_peer"]
    assert peer["finished"] == len(peer["runs"]) == 1 and peer["figures"]["samples_per_s_per_gpu"] > 0
    table = (tmp_path / "out" / "table.md").read_text()
    for loop in loops[1:]:
        part = results["parts"][f"{pair}_L2_{loop}"]
        assert part["finished"] == len(part["runs"]) == 1, part["runs"][0].get("log_tail")
        record = part["runs"][0]
        f = record["figures"]
        assert record["rc"] == 0 and record["layers"] == 2, record.get("log_tail")
        assert "--ranks 1 --workers 1" in record["command"], record["command"]
        assert f["steps"] == 2 and f["timed_steps"] == [2] and f["samples"] == 8  # tiny: 2 groups of 4
        assert [s["step"] for s in f["per_step"]] == [1, 2] and f["per_step"][0]["step_s"] > 0
        assert set(f["per_step"][0]["compiles"]) == {"rollout", "learner"}
        assert f["samples_per_s_per_gpu"] > 0 and f["rollout_tokens_per_s_per_gpu"] > 0 and f["first_step_s"] > 0
        assert record["actors"]["learner0"]["seconds"]["train"] > 0 and record["actors"]["rollout0"]["seconds"]
        assert ("cluster.colocate=false" in record["overrides"]) == (loop == "apart"), record["overrides"]
        if loop == "release_sampler":  # the recipe file as committed
            assert not any("colocate" in x for x in record["overrides"]), record["overrides"]
        assert f["learner_s_per_sample"] > 0
        row = next(r for r in results["rows"] if r["name"] == f"{pair}: stabledrl train, {loop.replace('_', ' ')}")
        assert row["ratio"]["samples_per_s_per_gpu"] == pytest.approx(
            f["samples_per_s_per_gpu"] / peer["figures"]["samples_per_s_per_gpu"])
        assert f"| {pair}: stabledrl train, {loop.replace('_', ' ')} | 2 |" in table
    # the roofline's inputs for the recipe as committed: the generation's forwards counted, the optimizer timed
    if "release_sampler" in loops:
        f = results["parts"][f"{pair}_L2_release_sampler"]["runs"][0]["figures"]
        roof = f["roofline"]
        assert roof["flops"]["generate"] > 0 and roof["flops"]["train"] > roof["flops"]["score"] > 0
        assert roof["seconds"]["generate"] > 0 and roof["seconds"]["optimizer"] > 0 and roof["gpu_s"] > 0
        row = next(r for r in results["rows"] if r["name"] == f"{pair}: stabledrl train, release sampler")
        assert row["roofline"]["generate_tflops"] > 0 and row["roofline"]["ceiling_samples_per_s_per_gpu"] > 0


def test_the_suites_of_a_pair_agree_on_each_variant():
    """A pair's rehearsal runs each variant once: two of its suites that name one must mean the same
    overrides by it."""
    seen: dict[tuple[str, str], str] = {}
    for name in suites.RUN_PEERS:
        pair, _, variants = _peer_options(name)
        for variant, sets in variants.items():
            assert seen.setdefault((pair, variant), sets) == sets, (name, variant)

"""The component suite's CPU rehearsal (``run_all.py --rehearsal``): every job of the 2-GPU plan runs
through its own script, at the tiny shapes with the fewest repetitions, under the same runner as
on the GPUs. A refactor that breaks a benchmark (an API it calls, a part that now raises) fails
here: the run must exit 0 with every job ``ok`` and every part measured. The other suites'
rehearsals: test_suite_rehearsals.py; here also the benchmark modes no suite runs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import warm_workers  # tests/helpers, on the path: tests/conftest.py
from without_inductor import WITHOUT_INDUCTOR

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run_all import SAFE_ENV  # noqa: E402
# each rehearsal is a runner with its own limit of 1500 s (its subprocess timeout)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
TESTS_STAND_ALONE = True  # each rehearsal is a runner of its own: they spread over the test workers

JOBS = {"matmul_gpu0", "matmul_gpu1", "full_attention", "block_diffusion", "lora_push", "ipc_push", "learner_1gpu",
        "push", "async", "learner_2gpu"}


def _run(*args) -> subprocess.CompletedProcess:
    """The script; it, the scripts it starts and the Ray jobs' workers are forked from a warm process
    (warm_workers.py).
    Its compiled parts trace and run without inductor's C++ build (without_inductor.py): these
    rehearsals check that each part runs and what it records; the compiled tokens are checked
    against eager ones, with inductor, by the sampler suite's rehearsal and the unit tests."""
    python, env = warm_workers.python({**SAFE_ENV, **WITHOUT_INDUCTOR})  # the scripts' environment (run_all)
    return subprocess.run([python, *map(str, args)], cwd=HERE.parents[1], timeout=1500, capture_output=True,
                          text=True, env=env)


def test_every_component_benchmark_runs_its_tiny_path(tmp_path):
    done = _run(HERE / "run_all.py", "--rehearsal", "--no-copy", "--out", tmp_path)
    data = json.loads((tmp_path / "results.json").read_text())
    jobs = data["jobs"]
    assert done.returncode == 0, done.stdout[-4000:]
    assert set(jobs) == JOBS and all(j["status"] == "ok" for j in jobs.values()), {
        k: j["status"] for k, j in jobs.items()
    }
    parts = {name: j["result"]["parts"] for name, j in jobs.items()}
    for world, stages in ((1, ("2", "3o")), (2, ("3",))):
        learner = parts[f"learner_{world}gpu"]
        for stage in stages:
            step = next(v for k, v in learner.items() if k.startswith(f"zero{stage}_ckpt_"))
            assert step["step_s_median"] > 0 and step["skipped_steps_total"] == 0 and step["world"] == world
            assert step["offload"]["offload_optimizer"] == ("cpu" if stage.endswith("o") else "none")
        assert learner["zero3_gather"]["params_on_rank0"] > 0
    assert parts["learner_1gpu"]["zero2_profile"]["top_host_ops"]
    assert parts["push"] and parts["block_diffusion"] and parts["full_attention"]
    pool = parts["full_attention"]["graph_pool"]  # the engine's pool over a spread of prompt lengths
    graphed = pool["graphed_capacity_2"]
    assert len(graphed["seconds"]) == len(pool["eager"]["seconds"]) == pool["requests"]
    assert graphed["static_steps_built"][0] == 1 and graphed["tokens_equal_eager_mean"] == 1.0
    assert parts["lora_push"]["ratio"]["receiver_adapters_equal"] is True
    assert parts["lora_push"]["ratio"]["receiver_adapters_equal_shards"] is True  # the sharded adapter push
    assert parts["lora_push"]["adapters"]["learner_s"] > 0 and parts["lora_push"]["merged"]["wire_gb"] > 0
    ipc = parts["ipc_push"]  # the same-device push: first and later pushes delivered bit for bit, timed both sides
    assert ipc["first_push"]["weights_bit_identical"] and ipc["push"]["weights_bit_identical"]
    assert ipc["first_push"]["send_s"] > 0 and ipc["push"]["median_receive_s"] > 0 and ipc["raw_copy"]["median_s"] > 0
    assert {k for k in parts["async"] if k.startswith("eta")} >= {"eta0", "eta1"}, list(parts["async"])
    table = (tmp_path / "table.md").read_text()
    assert "| learner_2gpu | ok |" in table


def test_the_d1_learner_mode_runs_its_tiny_path(tmp_path):
    """bench_learner's d1 mode (mean-field, GRPO, LoRA) through its own command line: 4- and 8-row
    forwards with every layer, the first one and no layer checkpointed, each setting measured."""
    out = tmp_path / "learner.json"
    done = _run(HERE / "bench_learner.py", "--tiny", "--shape", "tiny-llada", "--stages", "2", "--estimator",
                "mean_field", "--lora", "8", "--group-size", "4", "--groups-per-step", "2", "--micro-batch-groups",
                "1,2", "--checkpointing", "on,1,off", "--steps", "1", "--out", out)
    data = json.loads(out.read_text())
    assert done.returncode == 0 and not data["errors"], (done.stdout[-3000:], data["errors"])
    parts = data["parts"]
    names = [f"zero2_ckpt_{c}_mb{k}" for c in ("on", "1", "off") for k in (1, 2)]
    assert sorted(parts) == sorted(names)
    for name in names:
        p = parts[name]
        assert p["step_s_median"] > 0 and p["skipped_steps_total"] == 0
        assert p["lora_rank"] == 8 and p["estimator"] == "mean_field"
        assert p["micro_batch_rows"] == (4 if name.endswith("mb1") else 8)
    # model FLOPs 2F for every setting; the hardware's add the recomputed share of the layers
    model = parts["zero2_ckpt_on_mb1"]["model_tflop_per_step"]
    assert all(parts[n]["model_tflop_per_step"] == model for n in names)
    assert parts["zero2_ckpt_off_mb1"]["checkpointing"] == "off" and parts["zero2_ckpt_1_mb1"]["checkpointing"] == "1"


def test_the_block_diffusion_splits_and_replay_profiles_run_their_tiny_path(tmp_path):
    """bench_block_diffusion's diagnostic parts that no suite runs (the sampler suite runs the compiled
    generations, the counter draw's split and the token choice alone): the graphed and the compiled
    generation split into their calls, and each static step replayed on its own, eager and compiled,
    with torch's fused RMSNorm."""
    out = tmp_path / "bd.json"
    done = _run(HERE / "bench_block_diffusion.py", "--tiny", "--norms", "fused", "--parts",
                "split,split_compiled,replay_profile,replay_profile_compiled", "--replay-reps", "2", "--out", out)
    data = json.loads(out.read_text())
    assert done.returncode == 0 and not data["errors"], (done.stdout[-3000:], data["errors"])
    parts = data["parts"]
    assert parts["norms"]["fused"] > 0
    for split in ("split", "split_compiled"):
        assert set(parts[split]["by_kind"]) == {"prefill", "enter", "inside", "decode"}, parts[split]
    for name in ("replay_profile", "replay_profile_compiled"):
        steps = parts[name]
        assert set(steps) == {"inside", "enter_8"}, steps  # block 4: [current] and [previous | current]
        assert steps["enter_8"]["query_tokens"] == 2 * steps["inside"]["query_tokens"]
        assert all(s["ms_per_replay"] > 0 and s["gflop"] > 0 for s in steps.values())

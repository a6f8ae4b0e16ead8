"""The quickstart's RL recipe learns from more than the one warm start it was tuned on.

`make run` warm-starts its tiny model with a short SFT stage whose weights depend on the SFT's
seed and step count and on the processor's floating-point path: one config gave 41% held-out
accuracy on one machine and 59.5% on another, and an RL recipe tuned from 41% went 59.5% -> 54.5%.
Here deploy/configs/quickstart.yaml itself, shortened to STEPS steps and evaluated every 10, runs
from two warm starts that differ in their SFT seed (about 35% and 60% on the 2-core development
machine) on real Ray actors and DeepSpeed. On each, held-out accuracy must rise: the mean of the
evaluations in the second half of the run (steps > STEPS / 2) at least MARGIN points above BEFORE,
and the last evaluation above BEFORE. The recipe is in-order (algorithm.in_order), so a run is a
function of its config on one machine and this test does not flake on timing. Nor does a run
depend on how many actors run it (the same held-out curves, evaluation for evaluation): each run
here has one learner rank and one rollout worker instead of the quickstart's two and two, and
writes no checkpoints (they start processes of their own beside the training and change nothing
it computes).
"""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from stabledrl.common.config.job import load_job_config  # noqa: E402
from stabledrl.common.metrics import read_metrics  # noqa: E402
from stabledrl.coordinator.driver import Driver  # noqa: E402
from stabledrl.recipes.stages import JOB_STAGES  # noqa: E402


pytestmark = pytest.mark.e2e

QUICKSTART = Path(__file__).resolve().parents[2] / "deploy" / "configs" / "quickstart.yaml"
STEPS = 70
MARGIN = 5.0  # points
WARM_STARTS = {"sft-seed-0": 0, "sft-seed-1": 1}  # warmstart.seed; 300 SFT steps each
RAY_CPUS = 2  # the Ray instance's logical CPUs (tests/e2e/conftest.py)


def held_out_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(step, held-out pass@1 in %) of every evaluation the run logged."""
    records = read_metrics(run_dir / "metrics.jsonl")
    return [(int(r["step"]), 100 * r["eval/pass@1"]) for r in records if "eval/pass@1" in r]


@pytest.mark.parametrize("name", list(WARM_STARTS))
def test_quickstart_recipe_raises_held_out_accuracy_from_each_warm_start(cluster, tmp_path_factory, name):
    cache = tmp_path_factory.getbasetemp() / "warmstart"  # the module's runs share their warm starts
    out = tmp_path_factory.mktemp(name)
    cfg = load_job_config(QUICKSTART, [
        f"warmstart.seed={WARM_STARTS[name]}", f"warmstart.cache_dir={cache}", f"run.steps={STEPS}",
        "eval.every=10", "learner.num_ranks=1", "rollout.num_workers=1", f"run.output_dir={out}",
        "run.checkpoint_every=0", "run.export_final=false", "run.save_final_checkpoint=false",
        "run.tensorboard=false", "run.progress=false",
    ])  # fmt: skip
    assert cfg.algorithm.in_order, "the quickstart is meant to be deterministic on one machine"
    result = Driver(cfg, stages=JOB_STAGES).run()

    curve = held_out_curve(out)
    assert [s for s, _ in curve] == list(range(0, STEPS + 1, 10))
    before, after = curve[0][1], curve[-1][1]
    assert (before, after) == pytest.approx((100 * result.before.pass_at_1, 100 * result.after.pass_at_1))
    late = statistics.mean(p for s, p in curve if s > STEPS / 2)
    shown = ", ".join(f"{p:.1f}" for _, p in curve)
    assert late >= before + MARGIN, f"{name}: held-out accuracy did not rise: {shown} (steps 0, 10, ...)"
    assert after > before, f"{name}: held-out accuracy ended below its start: {shown}"

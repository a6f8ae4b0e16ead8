"""Benchmark 7: asynchrony pays. The same job through the coordinator's loop at η = 0 (synchronous)
and η = 1, on the same 2 GPUs: one learner rank (DeepSpeed ZeRO-2, bf16) on GPU 0, one rollout
worker on GPU 1, weights pushed over NCCL after every step; samples trained per second of wall
time (target: η = 1 >= 1.6x η = 0).

The job: a LLaDA-family preset at ~0.8B parameters (hidden 2048, 16 layers; the character
vocabulary of the arithmetic task it is trained on), G = 16, 4 groups per step (one rollout
request of 64 rows), μ = 2, elbo_mc with 2 masks, StableDRL; gen 32 in one block of 32 steps.
Throughput = samples trained over steps 3..N divided by the wall time they took (``time/step``: step
end to step end; the first two steps hold the start-up and the pipeline fill). Both runs use one Ray
instance, one after the other.

    python tests/benchmarks/bench_async.py --out async.json          # 2 GPUs
    python tests/benchmarks/bench_async.py --tiny --out async.json   # CPU: tiny preset, gloo, object store
"""
from __future__ import annotations

import argparse
import os
import tempfile

import benchlib as bl
import torch


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 10; 4 with --tiny)")
    ap.add_argument("--skip", type=int, default=2, help="first steps left out of the throughput")
    ap.add_argument("--etas", default="0,1")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    a.steps = a.steps or (4 if a.tiny else 10)
    a.skip = min(a.skip, a.steps - 1)
    return a


def job_config(a: argparse.Namespace, eta: int, output_dir: str, gpus: bool):
    from stabledrl.common.config.base import validate
    from stabledrl.common.config.job import JobConfig

    shape = ({"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16, "num_attention_heads": 16,
              "num_key_value_heads": 16} if not a.tiny else {})
    resources = {"num_cpus": 2, "num_gpus": 1} if gpus else {"num_cpus": 0.5}
    data = {
        "model": {"preset": "tiny-llada", "dtype": "bfloat16" if gpus else "float32",
                  **({"preset_shape": shape} if shape else {})},
        "task": {"name": "arithmetic", "held_out": 0, "source": {"kind": "generated", "n": 2000, "seed": 0}},
        "sampler": {"gen_length": 32, "block_length": 32, "steps": 32, "temperature": 0.9, "max_batch_size": 256}
        if not a.tiny else {"gen_length": 8, "block_length": 8, "steps": 8, "temperature": 0.9},
        "estimator": {"name": "elbo_mc", "num_draws": 2, "weighting": "mean", "masks": "independent"},
        "loss": {"name": "stabledrl"},
        "algorithm": {"group_size": 16 if not a.tiny else 4, "groups_per_step": 4, "inner_iterations": 2,
                      "max_staleness": eta, "micro_batch_size": 64},
        "rollout": {"num_workers": 1, "prompts_per_request": 4, "requests_per_worker": 2, "request_timeout_s": 300},
        "learner": {"num_ranks": 1, "dist_timeout_s": 300, "optimizer": {"lr": 1e-6},
                    "deepspeed": {"zero_stage": 2}},
        "cluster": {"learner": resources, "rollout": resources, "start_timeout_s": 300},
        "weights": {"timeout_s": 120, "backend": "nccl" if gpus else "object_store"},
        "run": {"steps": a.steps, "seed": 0, "output_dir": output_dir, "progress": False, "tensorboard": False,
                "save_final_checkpoint": False},
    }
    return validate(JobConfig, data)


def run(a: argparse.Namespace, eta: int, gpus: bool) -> dict:
    from stabledrl.coordinator.driver import Driver

    with tempfile.TemporaryDirectory(prefix=f"bench_async_eta{eta}_") as out_dir, bl.job_log_shown():
        driver = Driver(job_config(a, eta, out_dir, gpus))
        driver.setup()
        try:
            driver.train()
        finally:
            driver.close()
    records = [r for r in driver.history if "time/step" in r]
    timed = records[a.skip:]
    samples = sum(r["rollout/samples"] for r in timed)
    seconds = sum(r["time/step"] for r in timed)
    return {
        "eta": eta, "steps": len(records), "timed_steps": len(timed), "samples_per_s": samples / seconds,
        "step_s": [r["time/step"] for r in records], "train_s": [r.get("time/train") for r in records],
        "generate_s": [r.get("time/generate") for r in records], "push_s": [r.get("time/weight_push") for r in records],
        "dropped_total": records[-1].get("staleness/dropped_total") if records else None,
        "staleness_max": max((r.get("staleness/max", 0.0) for r in records), default=None),
    }


def main() -> None:
    a = parse()
    res = bl.Result("async", a.out, vars(a))
    gpus = torch.cuda.device_count() >= 2
    if not gpus and not a.tiny:
        res.error("setup", RuntimeError("needs 2 GPUs (or --tiny on a CPU)"))
        raise SystemExit(1)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(bl.REPO), os.environ.get("PYTHONPATH")])
    )  # Ray workers
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throw-away local instance, as in the tests
    import ray

    ray.init(address="local", num_cpus=8 if gpus else 4, num_gpus=2 if gpus else 0, include_dashboard=False,
             log_to_driver=True)
    try:
        rates = {}
        for eta in (int(e) for e in a.etas.split(",")):
            with res.part(f"eta{eta}"):
                row = run(a, eta, gpus)
                rates[eta] = row["samples_per_s"]
                res.put(f"eta{eta}", row)
        if 0 in rates and 1 in rates:
            res.put("speedup", {"eta1_over_eta0_samples_per_s": rates[1] / rates[0]})
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()

"""``bench_push.py --engine``'s CPU rehearsal: 2 learner ranks of a real DeepSpeed ZeRO-3 engine
(gloo) and a receiver, the same code that times the pushes on the GPUs: the raw broadcast, the
gathered push (before) and the sharded push (after) run, deliver the learner's weights bit for bit,
and the sharded push sends DeepSpeed's partitions as they lie (no packing copy); the staged modes
take it into a rollout engine's staging copy, idle and beside requests the receiver generates,
and deliver it the same, as does the pull push (peer modes: the receiver reads each rank's buffer;
beside a thread of the receiver that runs Python; and as it was before, row by row)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.e2e
STAGED = ("staged", "busy", "busy@0.1", "peer_staged", "peer_busy", "peer_busy_rows", "peer_python", "peer_python_rows")
MODES = ",".join(("gather", "shards", "raw_busy", *STAGED))


def test_engine_push_benchmark_runs_its_tiny_path(tmp_path):
    out = tmp_path / "push_engine.json"
    done = subprocess.run([sys.executable, str(HERE / "bench_push.py"), "--engine", "--tiny", "--learners", "2",
                           "--receivers", "1", "--reps", "1", "--bucket-mb", "0.05", "--modes", MODES,
                           "--busy-head-scale", "3000", "--out", str(out)],  # the tiny head's logits are ~1000x smaller
                          cwd=HERE.parents[1], timeout=600, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert not data["errors"], data["errors"]
    parts = data["parts"]
    assert parts["setup"]["sources"] == 2 and parts["raw"]["median_s"] > 0
    for mode, sources in (("gather", 0), ("shards", 2)):
        push = parts[f"push_{mode}"]
        assert push["weights_bit_identical"] and push["median_s"] > 0 and push["sources"] == sources
    segments = parts["push_shards"]["rank0_segments"]
    assert segments["rounds"] > 1 and segments["segments_as_they_lie"] == segments["rounds"]
    assert segments["segments_packed"] == 0
    for mode in STAGED:
        push = parts[f"push_{mode}"]
        assert push["weights_bit_identical"] and push["median_s"] > 0 and push["sources"] == 2, mode
        assert ("receiver_requests" in push) == ("busy" in mode), mode
        assert ("receiver_python_loops" in push) == ("python" in mode), mode
    for mode in (m for m in STAGED if "busy" in m):  # it was generating, more than one token per row a forward
        requests = parts[f"push_{mode}"]["receiver_requests"]
        assert requests["done"] >= 1 and requests["tokens_per_forward"] > 32, (mode, requests)  # 32 rows
    assert parts["push_busy@0.1"]["bucket_mb"] == 0.1 and parts["push_busy"]["bucket_mb"] == 0.05
    raw_busy = parts["raw_busy"]  # the raw broadcast beside the same requests: the busy pushes' denominator
    assert raw_busy["median_s"] > 0 and raw_busy["receiver_requests"]["done"] >= 1
    assert parts["push_busy"]["ratio_to_raw_busy"] == parts["push_busy"]["median_s"] / raw_busy["median_s"]
    assert parts["push_staged"]["ratio_to_raw_busy"] is None  # idle: set against the idle raw only
    assert parts["push_peer_busy"]["ratio_to_raw_busy"] == parts["push_peer_busy"]["median_s"] / raw_busy["median_s"]
    assert parts["push_busy@0.1"]["rank0_segments"]["rounds"] < segments["rounds"]

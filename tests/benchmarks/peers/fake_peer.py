"""A stand-in peer for the CPU test of the peer benchmark's driver: the harness's arguments, no
model. Each round generates ``--rows`` rows of ``--gen-length`` tokens in ``--gen-s`` seconds (8
forwards of the canvas, a 100-token prompt) and scores them once (0.01 s), then trains them for
``--mu`` optimizer steps of ``--train-s`` seconds each (a forward with a gradient, 0.02 s of optimizer
each), and records the events a real harness records (peer_events.Recorder), so the figures it
yields are known."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peer_events  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--peer-root", "--model-dir", "--data", "--work", "--device"):
        ap.add_argument(name, default=None)
    ap.add_argument("--events", required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--mu", type=int, default=int(os.environ.get("FAKE_PEER_MU", "2")))
    ap.add_argument("--rows", type=int, default=int(os.environ.get("FAKE_PEER_ROWS", "16")))
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--gen-s", type=float, default=float(os.environ.get("FAKE_PEER_GEN_S", "0.2")))
    ap.add_argument("--train-s", type=float, default=float(os.environ.get("FAKE_PEER_TRAIN_S", "0.1")))
    a = ap.parse_args()
    rec = peer_events.Recorder(a.events, int(os.environ.get("RANK", "0")))
    width = 100 + a.gen_length  # a prompt of 100 tokens
    for step in range(a.steps):
        if step % a.mu == 0:
            t0 = time.time()
            rec.generating = True
            rec.forward((a.rows, width), times=8)  # 8 sampler steps over the whole canvas
            rec.generating = False
            time.sleep(a.gen_s)
            rec.generated(t0, time.time(), a.rows, a.rows * a.gen_length)
            with torch.no_grad():
                rec.forward((a.rows, width))  # the old policy, without a gradient
            rec.scored(0.01)
        rec.forward((a.rows, width))  # the learner's forward
        time.sleep(a.train_s)
        rec.optimizer_s += 0.02
        rec.stepped(1.5)
    rec.write(event="end", t=time.time())


if __name__ == "__main__":
    main()

"""A stand-in peer for the CPU test of the peer benchmark's driver: the harness's arguments, no
model. Each round generates ``--rows`` rows of ``--gen-length`` tokens in ``--gen-s`` seconds,
then trains them for ``--mu`` optimizer steps of ``--train-s`` seconds each, and records the
events a real harness records (peer_events.Recorder), so the figures it yields are known."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

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
    for step in range(a.steps):
        if step % a.mu == 0:
            t0 = time.time()
            time.sleep(a.gen_s)
            rec.generated(t0, time.time(), a.rows, a.rows * a.gen_length)
        time.sleep(a.train_s)
        rec.stepped(1.5)
    rec.write(event="end", t=time.time())


if __name__ == "__main__":
    main()

"""Two runs' metrics.jsonl compared line by line, every key but the clocks and the machine's own
measurements: a change meant to leave behaviour alone (a refactor) must leave these identical.

    python tests/helpers/same_metrics.py BEFORE/metrics.jsonl AFTER/metrics.jsonl [--ignore KEY ...]

Exit status 0 when every line has the same steps and the same non-timing keys and values, else 1
with each difference on its own line. Left out: ``time`` and ``time/*`` (wall clocks), ``perf/*``
(rates from them), keys ending ``_s`` (seconds: generate_s, eval/time_s, ...) and
``learner/peak_*`` (the process's memory high-water mark, which depends on the allocator's timing).
``--ignore`` leaves out more keys (a prefix ending in ``/`` leaves out that family): what two runs
of the same code already differ in, which the comparison of those two runs shows. At η >= 1 a
step's record also says what the rollouts ahead of the learner had done by then (staleness/buffered,
staleness/in_flight, rollout/reward_calls/*, rollout/forwards): the quickstart's two runs of one
commit differ there, and nowhere else.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

TIMING_PREFIXES = ("time/", "perf/", "learner/peak_")


def is_timing(key: str) -> bool:
    return key == "time" or key.startswith(TIMING_PREFIXES) or key.endswith("_s")


def compared(line: dict[str, Any], ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    return {k: v for k, v in line.items() if not is_timing(k) and not _ignored(k, ignore)}


def _ignored(key: str, ignore: tuple[str, ...]) -> bool:
    return any(key == i or (i.endswith("/") and key.startswith(i)) for i in ignore)


def differences(before: list[dict[str, Any]], after: list[dict[str, Any]], ignore: tuple[str, ...] = ()) -> list[str]:
    """Each line's non-timing keys and values that differ, as readable lines (empty: identical)."""
    out = [] if len(before) == len(after) else [f"{len(before)} lines before, {len(after)} after"]
    for n, (a, b) in enumerate(zip(before, after), start=1):
        a, b = compared(a, ignore), compared(b, ignore)
        where = f"line {n} (step {a.get('step')})"
        out += [f"{where}: {k} only before" for k in sorted(a.keys() - b.keys())]
        out += [f"{where}: {k} only after" for k in sorted(b.keys() - a.keys())]
        out += [f"{where}: {k} {a[k]!r} -> {b[k]!r}" for k in sorted(a.keys() & b.keys()) if not _same(a[k], b[k])]
    return out


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return x == y


def read(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="two runs' metrics.jsonl, every non-timing key compared")
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--ignore", action="append", default=[],
                    help="a key (or a family: a prefix ending in /) to leave out")
    a = ap.parse_args(argv)
    ignore = tuple(a.ignore)
    before, after = read(a.before), read(a.after)
    diff = differences(before, after, ignore)
    for line in diff:
        print(line)
    keys = len({k for line in before for k in compared(line, ignore)})
    print(f"{len(before)} lines, {keys} non-timing keys: " + ("identical" if not diff else f"{len(diff)} differences"))
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A published evaluation protocol over every GPU of the cluster: the papers' table, resumable.

    stabledrl eval --config run/config.yaml --protocol d1 [--checkpoint DIR | --model DIR] --out DIR

1. The benchmarks are loaded and every prompt encoded here, once (``stabledrl.common.tasks.protocols``:
   the protocol's prompt through ``stabledrl.common.tasks.prompts``, the encoding rollouts use).
2. Work is cut into units of ``batch_size`` prompts of one benchmark at one generation length and
   dealt to the workers as they come free (two units queued per worker): ``EvalWorker`` actors, one
   policy copy per GPU, offline (``run_units``); the job's rollout workers during training, dealt
   by the job's scheduler (``InTraining``). Both sample with the rollout engine and return decoded
   completions.
3. Completions are graded here (``stabledrl.common.tasks.graders``) and appended to results.jsonl per prompt
   (``stabledrl.evaluation.results``): a rerun skips what is done and prints the same table.

A row's completion is a function of (weights, prompt, decoding settings, its seed): a row draws
from ``derive_seed(seed, "protocol", prompt_id)`` alone (greedy decoding draws nothing), so the
table does not depend on how many workers ran or how the prompts were batched.
"""
from __future__ import annotations

import functools
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from stabledrl.common.config.protocol import ProtocolConfig
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.seeding import derive_seed
from stabledrl.common.tasks.base import stable_hash
from stabledrl.common.tasks.graders import as_d1_text, grade_math_with, grader_versions, protocol_graders
from stabledrl.common.tasks.prompts import prompt_ids
from stabledrl.common.tasks.protocols import PROTOCOLS, BenchmarkRows, d1_batches, d1_prompt_ids, load_benchmark
from stabledrl.evaluation.results import ResultLog, protocol_table, record, write_table
from stabledrl.common.config.model import ModelConfig
from stabledrl.common.models.loading import load_model_tokenizer

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """The benchmarks of a protocol config with every prompt encoded for one tokenizer."""

    cfg: ProtocolConfig
    benchmarks: dict[str, BenchmarkRows]
    prompts: dict[str, list[list[int]]]  # benchmark -> token ids per row
    pad_id: Optional[int] = None  # generation d1: the tokenizer's pad token, d1's left padding

    def prompt_hashes(self) -> dict[tuple[str, int, str], str]:
        return {(name, n, row.prompt_id): f"{stable_hash(tuple(ids)):016x}" for name, bench in self.benchmarks.items()
                for row, ids in zip(bench.rows, self.prompts[name]) for n in self.cfg.gen_lengths}

    def header(self, policy: str) -> dict[str, Any]:
        """What the results depend on (stabledrl.evaluation.results: a rerun must match it)."""
        c = self.cfg
        decoding = {"block_length": c.block_length, "steps_per_token": c.steps_per_token, "temperature": c.temperature,
                    "remasking": c.remasking, "cache": c.cache, "seed": c.seed, "generation": c.generation}
        if c.generation == "d1":  # which rows share a padded batch changes their tokens
            decoding["d1_batches"] = {f"{name} {n}": [c.d1_ranks(name, n), c.d1_batch(n)]
                                      for name in self.benchmarks for n in c.gen_lengths}
        sources = {name: {"source": b.source, "rows": b.size} for name, b in self.benchmarks.items()}
        return {"protocol": c.name, "decoding": decoding, "policy": policy, "graders": protocol_graders(c.math_graders),
                "grader_versions": grader_versions(c.math_graders), "sources": sources}


@dataclass(frozen=True)
class Unit:
    """One sampler call: rows ``indices`` of a benchmark at one generation length."""

    benchmark: str
    gen_length: int
    indices: tuple[int, ...]


def prepare(cfg: ProtocolConfig, tokenizer: Any) -> Prepared:
    protocol = PROTOCOLS[cfg.name]
    benchmarks = {name: load_benchmark(protocol, name, bench, tokenizer, cfg.max_prompt_tokens)
                  for name, bench in cfg.benchmarks.items()}
    encode = d1_prompt_ids if cfg.generation == "d1" else prompt_ids
    prompts = {name: [encode(tokenizer, b.task, row) for row in b.rows] for name, b in benchmarks.items()}
    pad_id = getattr(tokenizer, "pad_token_id", None) if cfg.generation == "d1" else None
    if cfg.generation == "d1" and pad_id is None:
        raise ValueError("eval.protocol.generation: 'd1' pads batches with the tokenizer's pad token; this tokenizer "
                         "has none")
    return Prepared(cfg, benchmarks, prompts, pad_id)


def sampler_for(cfg: ProtocolConfig, gen_length: int) -> SamplerConfig:
    """The sampler settings of one column of the table."""
    if cfg.generation == "d1":  # one d1 batch per call, decoded as d1 decodes it
        return SamplerConfig(gen_length=gen_length, block_length=cfg.block_length, steps=cfg.steps(gen_length),
                             temperature=0.0, cache="none", compat="d1", max_batch_size=cfg.d1_batch(gen_length))
    return SamplerConfig(gen_length=gen_length, block_length=cfg.block_length, steps=cfg.steps(gen_length),
                         temperature=cfg.temperature, remasking=cfg.remasking, cache=cfg.cache,
                         max_batch_size=cfg.batch_size)


def pending_units(prepared: Prepared, done: set[tuple[str, int, str]]) -> list[Unit]:
    """Units covering every (benchmark, length, row) not in ``done``, longest generations first
    (the slowest units start early, so the workers finish together)."""
    units = []
    for n in sorted(prepared.cfg.gen_lengths, reverse=True):
        for name, bench in prepared.benchmarks.items():
            todo = [i for i, row in enumerate(bench.rows) if (name, n, row.prompt_id) not in done]
            if prepared.cfg.generation == "d1":  # d1's own batches, whole (a row's tokens depend on its batch)
                c = prepared.cfg
                batches = d1_batches(len(bench.rows), c.d1_ranks(name, n), c.d1_batch(n))
                units += [Unit(name, n, tuple(b)) for b in batches if set(b) & set(todo)]
                continue
            size = prepared.cfg.batch_size
            units += [Unit(name, n, tuple(todo[k : k + size])) for k in range(0, len(todo), size)]
    return units


def unit_request(prepared: Prepared, unit: Unit) -> tuple[list[list[int]], list[int], SamplerConfig]:
    """(prompt ids, seeds, sampler settings) of a unit, as ``complete`` takes them."""
    rows = prepared.benchmarks[unit.benchmark].rows
    seeds = [derive_seed(prepared.cfg.seed, "protocol", rows[i].prompt_id) for i in unit.indices]
    prompts = [prepared.prompts[unit.benchmark][i] for i in unit.indices]
    if prepared.cfg.generation == "d1":  # d1's collate: left-padded to the batch's longest, padding visible
        width = max(len(p) for p in prompts)
        prompts = [[prepared.pad_id] * (width - len(p)) + list(p) for p in prompts]
    return prompts, seeds, sampler_for(prepared.cfg, unit.gen_length)


def grade_unit(prepared: Prepared, unit: Unit, completions: Sequence[str], hashes: dict) -> list[dict[str, Any]]:
    bench = prepared.benchmarks[unit.benchmark]
    others = {n: grade_math_with(n) for n in prepared.cfg.math_graders} if bench.benchmark.task == "math" else {}
    out = []
    for i, text in zip(unit.indices, completions):
        row = bench.rows[i]
        key = (unit.benchmark, unit.gen_length, row.prompt_id)
        seen = text if prepared.cfg.generation == "d1" else as_d1_text(text)  # the text d1's parser reads
        also = {n: grade(seen, row).correct for n, grade in others.items()}
        out.append(record(unit.benchmark, unit.gen_length, row.prompt_id, hashes[key], bench.grade(seen, row), text,
                          also))
    return out


def run_units(workers: Sequence[Any], prepared: Prepared, units: Sequence[Unit],
              on_done: Callable[[Unit, list[str]], None], timeout_s: float, per_worker: int = 2) -> None:
    """Deal ``units`` to the actors ``workers`` (each with ``complete``) as they come free and
    hand each finished unit to ``on_done`` in the order they finish; every unit runs exactly once.
    Fails (TimeoutError) when no unit finishes within ``timeout_s``, naming what was waiting."""
    import ray

    queue = list(reversed(units))
    running: dict[Any, tuple[int, Unit]] = {}

    def submit(w: int) -> None:
        unit = queue.pop()
        running[workers[w].complete.remote(*unit_request(prepared, unit))] = (w, unit)

    for w in range(len(workers)):
        for _ in range(per_worker):
            if queue:
                submit(w)
    while running:
        finished, _ = ray.wait(list(running), num_returns=1, timeout=timeout_s)
        if not finished:
            waiting = ", ".join(f"worker {w}: {u.benchmark}@{u.gen_length}" for w, u in running.values())
            raise TimeoutError(f"protocol evaluation: no unit finished in {timeout_s:.0f} s (waiting for {waiting})")
        w, unit = running.pop(finished[0])
        on_done(unit, ray.get(finished[0]))
        if queue:
            submit(w)


class Progress:
    """A bar on a terminal; on a log, a line every 10% (and at the end); nothing with ``show`` off."""

    def __init__(self, total: int, done: int, label: str = "protocol eval", show: bool = True) -> None:
        self.total, self.count, self.label, self.show = total, done, label, show
        self.t0, self.next_mark = time.monotonic(), 0.1
        self.bar = None
        if show and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, desc=label, unit="completion")

    def update(self, n: int) -> None:
        self.count += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.total and (self.count / self.total >= self.next_mark or self.count == self.total):
            if self.show:
                log.info(f"{self.label}: {self.count}/{self.total} completions "
                         f"({100 * self.count / self.total:.0f}%, {time.monotonic() - self.t0:.0f} s)")
            while self.next_mark <= self.count / self.total:
                self.next_mark += 0.1

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def evaluate(workers: Sequence[Any], prepared: Prepared, results: ResultLog,
             timeout_s: float, show_progress: bool = True) -> dict[str, Any]:
    """Run every pending unit on ``workers``, appending grades to ``results``; returns the table."""
    hashes = prepared.prompt_hashes()
    results.check_prompts(hashes)
    units = pending_units(prepared, results.done())
    total = sum(len(b.rows) for b in prepared.benchmarks.values()) * len(prepared.cfg.gen_lengths)
    remaining = sum(len(u.indices) for u in units)
    if remaining < total:
        log.info(f"protocol eval: {total - remaining} of {total} completions already graded in {results.out_dir}; "
                 f"{remaining} to go")
    progress = Progress(total, total - remaining, show=show_progress)

    def graded(unit: Unit, texts: list[str]) -> None:
        results.append(grade_unit(prepared, unit, texts, hashes))
        progress.update(len(texts))

    try:
        run_units(workers, prepared, units, graded, timeout_s)
    finally:
        progress.close()
    return table_of(prepared, results)


def table_of(prepared: Prepared, results: ResultLog) -> dict[str, Any]:
    import json

    header = json.loads((results.out_dir / "run.json").read_text())
    return protocol_table(header, prepared.benchmarks, prepared.cfg.gen_lengths, results.records)


class InTraining:
    """``cfg.eval.protocol`` during a job, on its rollout workers (their current weights): the job's
    scheduler deals the units of a step to the workers (coordinator/decisions/scheduler.py: a unit whose worker
    died or hung runs again on another) and its runtime calls, per step, ``start`` (the units left
    at this step), ``request`` (what a worker's ``complete`` takes), ``graded`` (a unit's
    completions) and ``finish`` (the table in output_dir/protocol/step<N>/, and the metrics)."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.prepared: Optional[Prepared] = None  # the benchmarks, encoded once per job (start)
        self.units: list[Unit] = []  # this step's units still to run

    def start(self, step: int) -> tuple[int, str]:
        """Open step ``step``'s results: (units still to run, a line to log or '')."""
        self.prepared = _prepared_for(self.cfg.eval.protocol.model_dump_json(), self.cfg.model.model_dump_json())
        self.step, self.out = step, Path(self.cfg.run.output_dir) / "protocol" / f"step{step}"
        self.results = ResultLog.open(self.out, self.prepared.header(f"training step {step}"))
        self.hashes = self.prepared.prompt_hashes()
        self.results.check_prompts(self.hashes)
        self.units = pending_units(self.prepared, self.results.done())
        self.t0 = time.monotonic()
        total = sum(len(b.rows) for b in self.prepared.benchmarks.values()) * len(self.prepared.cfg.gen_lengths)
        remaining = sum(len(u.indices) for u in self.units)
        note = "" if remaining == total else (f"protocol eval: {total - remaining} of {total} completions already "
                                              f"graded in {self.out}; {remaining} to go")
        return len(self.units), note

    def request(self, unit: int) -> tuple[list[list[int]], list[int], SamplerConfig]:
        return unit_request(self.prepared, self.units[unit])

    def graded(self, unit: int, completions: Sequence[str]) -> None:
        self.results.append(grade_unit(self.prepared, self.units[unit], completions, self.hashes))

    def finish(self) -> tuple[dict[str, float], str]:
        """Write the table; (metrics ``protocol/<benchmark>@<length>`` (0..1) and ``protocol/time_s``,
        the log line)."""
        table = table_of(self.prepared, self.results)
        write_table(self.out, table)
        metrics = {f"protocol/{row['benchmark']}@{n}": cell["accuracy"] / 100
                   for row in table["rows"] for n, cell in row["results"].items() if cell["accuracy"] is not None}
        summary = ", ".join(f"{k.removeprefix('protocol/')} {100 * v:.1f}%" for k, v in metrics.items())
        seconds = time.monotonic() - self.t0
        line = f"step {self.step}: protocol {self.prepared.cfg.name}: {summary} ({seconds:.0f} s; table in {self.out})"
        return {**metrics, "protocol/time_s": seconds}, line


@functools.lru_cache(maxsize=2)
def _prepared_for(protocol_json: str, model_json: str) -> Prepared:
    """The benchmarks of a job's protocol, loaded and encoded once per job (the model's tokenizer)."""
    model = ModelConfig.model_validate_json(model_json)
    return prepare(ProtocolConfig.model_validate_json(protocol_json), load_model_tokenizer(model))

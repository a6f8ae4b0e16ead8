"""What a protocol evaluation has done, one JSON line per graded completion, and its table.

    out_dir/run.json         what the results depend on: protocol, decoding, policy, grader, data
    out_dir/results.jsonl    {"benchmark", "gen_length", "prompt_id", "prompt_hash", "correct", "total",
                              "answer", "completion"} per (benchmark, length, row), appended as they come
    out_dir/table.md, table.json   the table (rows = benchmarks, one column per generation length)

A rerun with the same settings skips every (benchmark, length, row) already in results.jsonl and
builds the same table from the stored grades; settings that would change a result (decoding, the
policy, the MATH grader, a benchmark's data) are refused, naming them, instead of being mixed in.
A last line cut short by a kill is dropped. A row whose prompt changed since it was graded
(``prompt_hash``) is refused too.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

Key = tuple[str, int, str]  # (benchmark, gen_length, prompt_id)


class ResultsMismatch(ValueError):
    """An output directory holding results of an evaluation with other settings."""


@dataclass
class ResultLog:
    out_dir: Path
    records: dict[Key, dict[str, Any]]

    @classmethod
    def open(cls, out_dir: Path, header: dict[str, Any]) -> "ResultLog":
        """The log under ``out_dir``: checked against ``header`` (module docstring) and extended by it."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        run_file = out_dir / "run.json"
        if run_file.is_file():
            header = _merged_header(json.loads(run_file.read_text()), header, out_dir)
        run_file.write_text(json.dumps(header, indent=1, sort_keys=True) + "\n")
        return cls(out_dir, _read_results(out_dir / "results.jsonl"))

    def done(self) -> set[Key]:
        return set(self.records)

    def check_prompts(self, hashes: dict[Key, str]) -> None:
        changed = [k for k, h in hashes.items() if k in self.records and self.records[k]["prompt_hash"] != h]
        if changed:
            raise ResultsMismatch(f"{self.out_dir}: {len(changed)} stored results are for other prompts (e.g. "
                                  f"{changed[0]}): the data or the prompt format changed; use a new output directory")

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        lines = []
        for record in records:
            self.records[_key(record)] = record
            lines.append(json.dumps(record, ensure_ascii=False) + "\n")
        with (self.out_dir / "results.jsonl").open("a", encoding="utf-8") as f:
            f.write("".join(lines))
            f.flush()


def _key(record: dict[str, Any]) -> Key:
    return record["benchmark"], int(record["gen_length"]), record["prompt_id"]


def _read_results(path: Path) -> dict[Key, dict[str, Any]]:
    records: dict[Key, dict[str, Any]] = {}
    if not path.is_file():
        return records
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    offset = 0
    for number, line in enumerate(lines, start=1):
        try:
            if line.strip():
                result = json.loads(line.decode("utf-8"))
                records[_key(result)] = result
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
            if number < len(lines):
                damaged = f"{path}: line {number} is not a result; the file was edited or damaged"
                raise ResultsMismatch(damaged) from None
            with path.open("r+b") as f:  # the last line, cut short by a kill: dropped, so the next append starts clean
                f.truncate(offset)
        offset += len(line) + 1
    return records


def _merged_header(old: dict[str, Any], new: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    differ = [k for k in ("protocol", "decoding", "policy", "graders") if old.get(k) != new.get(k)]
    differ += [f"sources.{b}" for b in sorted(set(old.get("sources", {})) & set(new["sources"]))
               if old["sources"][b] != new["sources"][b]]
    if differ:
        details = "; ".join(f"{k}: stored {_at(old, k)!r}, now {_at(new, k)!r}" for k in differ)
        raise ResultsMismatch(f"{out_dir} holds results of an evaluation with other settings ({details}); "
                              "use a new output directory, or the settings it was run with")
    return {**old, **new, "sources": {**old.get("sources", {}), **new["sources"]}}


def _at(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


# ---- the table ----------------------------------------------------------------------------------
def protocol_table(header: dict[str, Any], benchmarks: dict[str, Any], gen_lengths: list[int],
                   records: dict[Key, dict[str, Any]]) -> dict[str, Any]:
    """Accuracy per benchmark and length over the rows evaluated now: Σ correct / Σ total (%).
    ``benchmarks``: name -> BenchmarkRows."""
    rows = []
    graders = header.get("graders", {})
    for name, bench in benchmarks.items():
        others = [k[len(name) + 1 : -1] for k in graders if k.startswith(f"{name}[")]
        for other in [None] + others:
            cells: dict[str, Any] = {}
            for length in gen_lengths:
                keys = [(name, length, r.prompt_id) for r in bench.rows]
                graded = [records[k] for k in keys if k in records]
                correct = sum(g["correct"] if other is None else g.get("also", {}).get(other, 0.0) for g in graded)
                total = sum(g["total"] for g in graded)
                cells[str(length)] = {"accuracy": 100.0 * correct / total if total else None, "correct": correct,
                                      "total": total, "graded": len(graded)}
            label = name if other is None else f"{name}[{other}]"
            title = bench.benchmark.title if other is None else f"{bench.benchmark.title} ({other} grader)"
            rows.append({"benchmark": label, "title": title, "prompts": len(bench.rows), "source_rows": bench.size,
                         "unit": bench.benchmark.unit, "source": bench.source, "grader": graders.get(label),
                         "results": cells})
    return {**header, "gen_lengths": gen_lengths, "metric": "pass@1 %", "rows": rows}


def table_markdown(table: dict[str, Any]) -> str:
    lengths = table["gen_lengths"]
    d = table["decoding"]
    steps = ", ".join(f"{n}: {round(n * d['steps_per_token'])}" for n in lengths)
    decoding = "greedy" if d["temperature"] == 0 else f"T = {d['temperature']:g}"
    lines = [f"Protocol {table['protocol']}: pass@1 (%), {decoding}, block {d['block_length'] or 'of the policy'}, "
             f"steps per length {steps}; policy {table['policy']}",
             "",
             "| Benchmark | Prompts | " + " | ".join(str(n) for n in lengths) + " |",
             "|---|---:|" + "---:|" * len(lengths)]
    notes = []
    for row in table["rows"]:
        cells = [_cell(row["results"][str(n)], row["prompts"]) for n in lengths]
        lines.append(f"| {row['title']} | {row['prompts']} | " + " | ".join(cells) + " |")
        if row["unit"] != "answers":
            notes.append(f"{row['title']}: share of the puzzles' {row['unit']} filled right (d1's measure).")
    notes.append("Graded as d1's parse_and_get_acc.py grades (MATH: MATH's is_equiv); rows marked with another "
                 "grader are that grader's reading of the same completions, not comparable with d1's.")
    return "\n".join(lines + [""] + notes) + "\n"


def _cell(cell: dict[str, Any], prompts: int) -> str:
    if cell["accuracy"] is None:
        return "-"
    text = f"{cell['accuracy']:.1f}"
    return text if cell["graded"] == prompts else f"{text} ({cell['graded']}/{prompts})"


def write_table(out_dir: Path, table: dict[str, Any]) -> str:
    markdown = table_markdown(table)
    (Path(out_dir) / "table.md").write_text(markdown)
    (Path(out_dir) / "table.json").write_text(json.dumps(table, indent=1) + "\n")
    return markdown


def record(benchmark: str, gen_length: int, prompt_id: str, prompt_hash: str, grade: Any,
           completion: str, also: Optional[dict[str, float]] = None) -> dict[str, Any]:
    """One line of results.jsonl; ``also``: the decisions of other named graders (their own rows)."""
    line = {"benchmark": benchmark, "gen_length": gen_length, "prompt_id": prompt_id, "prompt_hash": prompt_hash,
            "correct": grade.correct, "total": grade.total, "answer": grade.answer, "completion": completion}
    return {**line, "also": also} if also else line

"""The named benchmark suites (suites.py): every name resolves in its runner (its jobs, parts or
loops exist; its overrides load), and BENCHMARKS.md cites only suites and records that exist, and
every record in results/. The rehearsals of the suites: test_suite_rehearsals.py."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "peers"))

import run_all  # noqa: E402
import run_peers  # noqa: E402
import run_system  # noqa: E402
import suites  # noqa: E402



@pytest.mark.parametrize("name", [n for n in suites.RUN_ALL if n != "components"])
def test_a_component_suite_plans_every_job_on_its_gpus(name, tmp_path):
    chosen = suites.RUN_ALL[name]
    most = max(max(j.gpus) + 1 for j in chosen.jobs)
    lanes, after, skipped = run_all.plan_suite(name, most, False, tmp_path)
    assert [j.name for j in lanes[0]] == [j.name for j in chosen.jobs] and not after and not skipped
    names = {j.name for j in chosen.jobs}
    for job in chosen.jobs:
        assert (HERE / job.script).is_file(), job.script
        assert job.peak is None or job.peak in names, (name, job.peak)
    fewer = run_all.plan_suite(name, chosen.min_gpus, False, tmp_path)[2]
    assert all(reason.startswith("needs ") for reason in fewer.values())
    assert run_all.parse(["--suite", name]).suite == name


@pytest.mark.parametrize("name", list(suites.RUN_SYSTEM))
def test_a_system_suite_names_known_parts_for_every_plan(name, tmp_path):
    chosen = suites.RUN_SYSTEM[name]
    a = run_system.parse(["--suite", name])
    for plan_gpus, parts in ((4, chosen.parts), (8, chosen.parts), (2, chosen.parts_2gpu), (0, chosen.parts)):
        lanes, after = run_system.plan(parts.split(","), plan_gpus == 0, tmp_path, tmp_path, plan_gpus,
                                       checkpoint_at=a.checkpoint_at, steps=a.steps, job_set=tuple(a.job_set))
        planned = [p.name for lane in lanes for p in lane] + [p.name for p in after]
        assert sorted(planned) == sorted(parts.split(",")), (name, plan_gpus)
    tiny = run_system.parse(["--suite", name, "--tiny", "--steps", "4"])
    assert tiny.steps == 4  # the command line after the suite wins


@pytest.mark.parametrize("name", list(suites.RUN_PEERS))
def test_a_peer_suite_runs_known_loops_whose_overrides_load(name, tmp_path):
    from stabledrl.common.config.job import load_job_config

    for tiny in (False, True):
        a = run_peers.parse(["--suite", name, "--peer-root", "x", "--out", str(tmp_path),
                             *(["--tiny"] if tiny else [])])
        variants = {**run_peers.VARIANTS, **dict(v.split("=", 1) for v in a.variant)}
        for pair in a.pairs.split(","):
            recipe = run_peers.pair_spec(pair, 2)["recipe"]
            config = run_peers.project_config(recipe, tmp_path)
            for loop in a.loops.split(","):
                if loop == "peer":
                    continue
                sets = variants[loop] if isinstance(variants[loop], list) else variants[loop].split(";")
                load_job_config(str(config), [f"task.source.path={tmp_path / 'rows.jsonl'}", *sets])


@pytest.mark.parametrize("pair", ["stabledrl", "d1"])
def test_every_named_variant_loads_on_each_pair_recipe(pair, tmp_path):
    """A loop that BENCHMARKS.md names with ``--loops`` (not only a suite's own) must validate too."""
    from stabledrl.common.config.job import load_job_config

    config = run_peers.project_config(run_peers.pair_spec(pair, 1)["recipe"], tmp_path)
    for name, sets in run_peers.VARIANTS.items():
        cfg = load_job_config(str(config), [f"task.source.path={tmp_path / 'rows.jsonl'}",
                                            *run_peers.PAIR_SETS[pair], *sets])
        if "sampler.cuda_graph=true" in sets:
            assert cfg.sampler.cuda_graph and cfg.sampler.cache == "dual", name


def test_an_unknown_suite_is_named_with_the_known_ones():
    with pytest.raises(SystemExit, match="unknown suite 'nope'; known: components, sampler"):
        suites.expand("run_all", ["--suite", "nope"])
    assert suites.expand("run_system", ["--tiny"]) == ["--tiny"]  # no suite: the command line as it is


def test_benchmarks_md_cites_existing_suites_and_every_kept_record():
    text = (REPO / "BENCHMARKS.md").read_text()
    cited_suites = re.findall(r"(run_all|run_system|run_peers)\.py --suite ([\w-]+)", text)
    assert cited_suites
    for runner, name in cited_suites:
        assert name in suites.SUITES[runner], (runner, name)
    for runner, known in suites.SUITES.items():
        for name in known:
            assert f"{runner}.py --suite {name}" in text, f"BENCHMARKS.md does not say what {runner} {name} is for"
    cited = set(re.findall(r"results/([\w.+-]+?)\.(?:json|md|\{json,md\})", text))
    kept = {p.name.rsplit(".", 1)[0] for p in (HERE / "results").iterdir() if not p.name.startswith(".")}
    assert cited == kept, {"cited, missing": cited - kept, "kept, not cited": kept - cited}

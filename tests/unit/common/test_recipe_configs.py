"""The published recipes (deploy/configs/recipe_*.yaml): each passes `stabledrl train --dry-run`
against a tiny checkpoint of its family with the family's real chat template, and every value the
deploy/README.md tables give for a released hyper-parameter is the value the config sets."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from stabledrl.cli.main import main
from stabledrl.common.config.job import load_job_config
from stabledrl.common.models.release_tokenizers import write_tiny_release_checkpoint

ROOT = Path(__file__).resolve().parents[3]
RECIPES = {  # config -> model family
    "recipe_stabledrl_llada8b_gsm8k.yaml": "llada",
    "recipe_stabledrl_llada8b_math.yaml": "llada",
    "recipe_d1_llada8b_gsm8k_lora.yaml": "llada",
    "recipe_trado8b_math_staircase.yaml": "sdar",
}
# the MATH recipe shares the GSM8K table but for the rows marked "(MATH: ...)"
SHARED_TABLE = {"recipe_stabledrl_llada8b_math.yaml": "recipe_stabledrl_llada8b_gsm8k.yaml"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipes")
    return {family: write_tiny_release_checkpoint(family, root / family) for family in set(RECIPES.values())}


def test_every_recipe_is_shipped_and_listed():
    shipped = {p.name for p in (ROOT / "deploy" / "configs").glob("recipe_*.yaml")}
    assert shipped == set(RECIPES)
    readme = (ROOT / "deploy" / "README.md").read_text()
    assert all(f"`configs/{name}`" in readme for name in RECIPES)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_recipe_passes_dry_run_on_a_tiny_checkpoint_of_its_family(name, checkpoints, capsys):
    path = ROOT / "deploy" / "configs" / name
    assert main(["train", "--config", str(path), "--dry-run", f"model.path={checkpoints[RECIPES[name]]}"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    shipped = load_job_config(path).model_dump(mode="json")
    assert printed["model"]["path"] == str(checkpoints[RECIPES[name]])
    for section in ("task", "sampler", "estimator", "loss", "algorithm", "learner", "eval", "run"):
        assert printed[section] == shipped[section], section  # the recipe as shipped, only the model moved


def readme_tables() -> dict[str, list[tuple[str, str, str]]]:
    """config name -> rows (released setting, config field, value here) of its deploy/README.md table."""
    text = (ROOT / "deploy" / "README.md").read_text().split("## Published recipes", 1)[1]
    tables: dict[str, list[tuple[str, str, str]]] = {}
    for heading, body in re.findall(r"#### `([^`]+)`\n(.*?)(?=\n#### |\Z)", text, re.DOTALL):
        rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in body.splitlines()
                if line.startswith("| ") and not line.startswith("| released setting")]
        tables[heading] = [(r[0], r[2], r[3]) for r in rows if len(r) == 4]
    return tables


def field_value(config: dict, dotted: str):
    for part in dotted.split("."):
        config = config[part]
    return config


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_readme_table_gives_the_configs_values(name):
    table = readme_tables()[SHARED_TABLE.get(name, name)]
    config = load_job_config(ROOT / "deploy" / "configs" / name).model_dump(mode="json")
    checked = 0
    for setting, field, value in table:
        fields, values = re.findall(r"`([^`]+)`", field), re.findall(r"`([^`]+)`", value)
        if not fields or not values or (name in SHARED_TABLE and "(MATH:" in setting):
            continue  # no field (the release's setting has no counterpart) or no literal value
        assert field_value(config, fields[0]) == yaml.safe_load(values[0]), f"{name}: {setting} -> {fields[0]}"
        checked += 1
    assert checked >= 25


def test_d1s_gsm8k_reward_sums_its_five_terms():
    from stabledrl.common.tasks.base import Row
    from stabledrl.recipes.d1_rewards import gsm8k

    row = Row("g", "What is 2 plus 3?", "5")
    # correctness 2 + integer 0.5 + strict 0.5 + XML 4 x 0.125; the soft pattern spans no newline, as in d1
    assert gsm8k("<reasoning>\nadd them\n</reasoning>\n<answer>\n5\n</answer>\n", row) == pytest.approx(3.5)
    assert gsm8k("<reasoning>add</reasoning> <answer>5</answer>", row) == pytest.approx(3.0)  # soft, no XML lines
    assert gsm8k("<reasoning>\nadd\n</reasoning>\n<answer>\n6\n</answer>\ntrailing", row) == pytest.approx(
        0.5 + 4 * 0.125 - 0.001 * len("trailing") - 0.001 * (len("\ntrailing") - 1))  # wrong: no correctness, no strict
    assert gsm8k("5", row) == pytest.approx(2.5)  # no tags: the whole completion is the answer text
    assert gsm8k("<answer>five</answer>", row) == 0.0


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_recipe_lists_its_departures_one_line_each_and_dry_run_prints_them(name, checkpoints, capsys):
    """The recipe section opens the file (its release and each remaining departure, one line), the
    header's comments no longer keep a second list, and --dry-run prints every departure."""
    path = ROOT / "deploy" / "configs" / name
    text = path.read_text()
    assert text.index("\nrecipe:\n") < text.index("\nmodel:")
    assert "Where this differs from the release" not in text
    recipe = load_job_config(path).recipe
    assert recipe is not None and recipe.release and len(recipe.departures) >= 3
    assert main(["train", "--config", str(path), "--dry-run", f"model.path={checkpoints[RECIPES[name]]}"]) == 0
    notes = [line[2:] for line in capsys.readouterr().out.splitlines() if line.startswith("# ")]
    heading = notes.index(f"departures from the release ({recipe.release}): {len(recipe.departures)}")
    assert notes[heading + 1:heading + 1 + len(recipe.departures)] == [f"  - {d}" for d in recipe.departures]


def test_the_recipe_section_is_checked_and_optional():
    from stabledrl.common.config.base import ConfigError

    path = ROOT / "deploy" / "configs" / "recipe_d1_llada8b_gsm8k_lora.yaml"
    with pytest.raises(ConfigError, match="recipe.departures"):
        load_job_config(path, ['recipe.departures=["two\\nlines"]'])
    with pytest.raises(ConfigError, match="recipe.licence"):
        load_job_config(path, ["recipe.licence=MIT"])
    assert load_job_config(ROOT / "deploy" / "configs" / "quickstart.yaml").recipe is None


def test_d1s_kl_reference_is_the_lora_base_as_here():
    """d1 scores its reference with the adapters disabled (its train.yaml's sync_ref_model never runs beside
    PEFT): the recipe's LoRA learner takes the base with its adapters off as the reference, not a copy."""
    from stabledrl.learner.worker import _needs_reference

    cfg = load_job_config(ROOT / "deploy" / "configs" / "recipe_d1_llada8b_gsm8k_lora.yaml")
    assert _needs_reference(cfg.loss) and cfg.learner.lora is not None  # LearnerWorker.reference_is_base
    assert not any("reference" in d for d in cfg.recipe.departures)

"""The rooms' layers hold (docs/design.md): common <- rollout, learner <- coordinator <- evaluation
<- recipes <- api <- cli, all under the one namespace ``stabledrl``. Nothing imports upward (a
function-level import counts too), rollout and learner never import each other, nothing imports a
top-level name of the old layout (``common``, ``cli``, ...), and the scheduler's decisions load no
torch and no Ray."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# room -> (its folder in the repository, its layer)
ROOMS = {
    "common": ("common", 0),
    "rollout": ("rollout", 1),
    "learner": ("learner", 1),
    "coordinator": ("coordinator", 2),
    "evaluation": ("stabledrl/evaluation", 3),
    "recipes": ("stabledrl/recipes", 4),
    "api": ("stabledrl/api.py", 5),
    "cli": ("stabledrl/cli", 6),
}
OLD_NAMES = {"common", "rollout", "learner", "coordinator", "cli", "recipes"}
# Inside a room, its parts (a sub-package or a module directly in the room's folder) in layers,
# lowest first: a part imports only parts of lower layers. "*" stands for every part not named.
# In common/ every part is named, so a new one is placed on purpose.
PARTS: dict[str, list[tuple[str, ...]]] = {
    "common": [
        ("seeding", "registry", "stats", "gil", "compiling", "attention", "actor_time", "actor_setup", "metrics",
         "tokenizer", "llada_names", "job_log"),  # the standard library and third-party packages only
        ("config",),  # pydantic sections; knows no model family, task or transport
        ("tasks", "trust"),  # rows and rewards; the run seal and safe checkpoint reading
        ("types", "models", "sandbox", "transport"),  # wire types; model families; the reward sandbox; the push
        ("estimators",),  # likelihood estimators over models and sequence batches
    ],
    "coordinator": [("decisions",), ("runtime",), ("job_setup", "progress"), ("driver",)],
    "learner": [("losses",), ("*",)],
    "rollout": [("sampling",), ("*",)],
}


def imported_names(path: Path) -> list[str]:
    """Every module and name ``path`` imports absolutely: at the top, in a function or under
    TYPE_CHECKING."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        out += names
    return out


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(rooms of stabledrl this file imports, old top-level names it imports)."""
    rooms, old = set(), set()
    for name in imported_names(path):
        parts = name.split(".")
        if parts[0] == "stabledrl" and len(parts) > 1 and parts[1] in ROOMS:
            rooms.add(parts[1])
        elif parts[0] in OLD_NAMES:
            old.add(parts[0])
    return rooms, old


def room_files(folder: str) -> list[Path]:
    path = ROOT / folder
    return [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))


def test_nothing_imports_upward_and_rollout_and_learner_never_import_each_other():
    wrong = []
    for room, (folder, layer) in ROOMS.items():
        for path in room_files(folder):
            name = str(path.relative_to(ROOT))
            rooms, old = imports(path)
            wrong += [f"{name} imports {o} (outside the stabledrl namespace)" for o in sorted(old)]
            for other in rooms:
                other_layer = ROOMS[other][1]
                if other_layer > layer or (other_layer == layer and other != room):
                    wrong.append(f"{name} imports stabledrl.{other}")
    assert not wrong, "\n".join(wrong)


def part_layer(room: str, part: str) -> tuple[str, int]:
    """(the part as the layers name it, its layer); ("", -1) for a part the layers do not place."""
    for layer, names in enumerate(PARTS[room]):
        if part in names:
            return part, layer
    star = [layer for layer, names in enumerate(PARTS[room]) if "*" in names]
    return ("*", star[0]) if star else ("", -1)


def part_imports(room: str, path: Path) -> set[str]:
    """The parts of ``room`` the file at ``path`` imports."""
    return {name.split(".")[2] for name in imported_names(path)
            if name.startswith(f"stabledrl.{room}.") and len(name.split(".")) > 2}


@pytest.mark.parametrize("room", sorted(PARTS))
def test_inside_a_room_no_part_imports_a_part_above_or_beside_it(room):
    folder = ROOT / ROOMS[room][0]
    wrong = []
    for path in room_files(ROOMS[room][0]):
        part = path.relative_to(folder).parts[0].removesuffix(".py")
        if part == "__init__":  # the room itself
            continue
        name, layer = part_layer(room, part)
        if layer < 0:
            wrong.append(f"{path.relative_to(ROOT)}: {part} is in no layer of {room} (PARTS)")
            continue
        for other in sorted(part_imports(room, path) - {part}):
            other_name, other_layer = part_layer(room, other)
            if other_layer > layer or (other_layer == layer and other_name != name):
                wrong.append(f"{path.relative_to(ROOT)} ({part}, layer {layer}) imports stabledrl.{room}.{other} "
                             f"(layer {other_layer})")
    assert not wrong, "\n".join(wrong)


def test_the_part_check_sees_an_import_beside_and_above(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from stabledrl.common.models import x\n"
                   "def f():\n    import stabledrl.common.tasks.base\n")
    assert part_imports("common", bad) == {"models", "tasks"}
    assert part_layer("common", "tasks")[1] == part_layer("common", "trust")[1] < part_layer("common", "models")[1]
    assert part_layer("learner", "engine") == ("*", 1) and part_layer("common", "new_module") == ("", -1)


def unexplained_imports(path: Path) -> list[int]:
    """Lines of ``path`` that import stabledrl inside a function with no comment saying why: on the
    statement's own lines or on the import lines (or the line) just above it."""
    source = path.read_text()
    lines, tree = source.splitlines(), ast.parse(source)
    inside = [node for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
              for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))]
    wrong = []
    for node in sorted(set(inside), key=lambda n: n.lineno):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if not any(n.startswith("stabledrl") for n in names):
            continue
        said = [lines[i] for i in range(node.lineno - 1, node.end_lineno)]
        above = node.lineno - 2
        while above >= 0 and (not lines[above].strip() or lines[above].lstrip().startswith(("import ", "from "))):
            said.append(lines[above])
            above -= 1
        if above >= 0 and lines[above].lstrip().startswith("#"):
            said.append(lines[above])
        if not any("#" in line for line in said):
            wrong.append(node.lineno)
    return wrong


def test_an_import_inside_a_function_says_why():
    """The project's modules are imported at the top of a module; one imported inside a function
    (a heavy dependency kept out of a light entry point, or a cycle it breaks) carries a comment."""
    wrong = [f"{path.relative_to(ROOT)}:{line}" for folder, _ in ROOMS.values() for path in room_files(folder)
             for line in unexplained_imports(path)]
    assert not wrong, "imports inside functions without a reason:\n" + "\n".join(wrong)


def test_the_import_check_sees_an_import_without_a_reason(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    x = 1\n    from stabledrl.common import types\n\n"
                   "def g():\n    import ray  # heavy\n\n    from stabledrl.coordinator import driver\n"
                   "    import json\n")
    assert unexplained_imports(bad) == [3]


def test_the_layer_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from stabledrl.cli.main import main\n    import stabledrl.learner.engine\n"
                   "    from stabledrl import evaluation\n    import common.types\n")
    assert imports(bad) == ({"cli", "learner", "evaluation"}, {"common"})


@pytest.mark.parametrize("folder", ["tests", "deploy"])
def test_tests_and_scripts_import_only_the_namespace(folder):
    old = [f"{p.relative_to(ROOT)} imports {sorted(imports(p)[1])}" for p in sorted((ROOT / folder).rglob("*.py"))
           if imports(p)[1] and "__pycache__" not in p.parts]
    assert not old, "\n".join(old)


def test_importing_the_scheduler_loads_no_torch_and_no_ray():
    code = ("import sys, stabledrl.coordinator.decisions.scheduler\n"
            "print(sorted(m for m in ('torch', 'ray', 'transformers', 'deepspeed', 'stabledrl.rollout', "
            "'stabledrl.learner') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_importing_stabledrl_loads_no_torch_and_no_ray():
    code = "import sys, stabledrl\nprint(sorted(m for m in ('torch', 'ray', 'deepspeed') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]", out.stdout + out.stderr

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


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(rooms of stabledrl this file imports, old top-level names it imports)."""
    rooms, old = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
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

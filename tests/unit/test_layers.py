"""The rooms' layers hold: common <- rollout, learner <- coordinator <- recipes <- cli (docs/design.md),
nothing imports upward (a function-level import counts too), rollout and learner never import each
other, and the scheduler's decisions load no torch and no Ray."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYER = {"common": 0, "rollout": 1, "learner": 1, "coordinator": 2, "recipes": 3, "cli": 4}
# `python -m coordinator` is `stabledrl` under its older name: an entry point, which nothing imports
ENTRY_POINTS = {"coordinator/__main__.py"}


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out & set(LAYER)


def test_nothing_imports_upward_and_rollout_and_learner_never_import_each_other():
    wrong = []
    for room, layer in LAYER.items():
        for path in sorted((ROOT / room).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            if name in ENTRY_POINTS:
                continue
            for other in imports(path):
                if LAYER[other] > layer or (LAYER[other] == layer and other != room):
                    wrong.append(f"{name} imports {other}")
    assert not wrong, "\n".join(wrong)


def test_the_layer_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from cli.main import main\n    import learner.engine\n")
    assert imports(bad) == {"cli", "learner"}


def test_importing_the_scheduler_loads_no_torch_and_no_ray():
    code = ("import sys, coordinator.scheduler\n"
            "print(sorted(m for m in ('torch', 'ray', 'transformers', 'deepspeed', 'rollout', 'learner') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]", out.stdout + out.stderr

"""One namespace: the wheel installs the package ``stabledrl`` and nothing beside it, every module of
the project's folders is in it, and the public API answers at ``stabledrl``."""
from __future__ import annotations

import os
import pkgutil
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import stabledrl

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"common": "stabledrl/common", "rollout": "stabledrl/rollout", "learner": "stabledrl/learner",
           "coordinator": "stabledrl/coordinator", "stabledrl": "stabledrl"}


def test_the_wheel_holds_only_the_stabledrl_package_and_every_module(tmp_path):
    source = tmp_path / "source"  # a copy: the build writes build/ and *.egg-info beside the sources
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "runs", ".cache", "build", "docs",
                                                              "*.egg-info", "__pycache__", ".whl"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("stabledrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"stabledrl"}
    expected = {f"{target}/{p.relative_to(ROOT / folder)}" for folder, target in FOLDERS.items()
                for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts}
    assert expected - set(names) == set()
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "stabledrl = stabledrl.cli.main:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_the_public_api_and_the_version():
    assert stabledrl.__version__ != "0+unknown"
    for name in ("train", "evaluate", "load_config", "JobConfig", "ModelConfig", "LearnerConfig", "ConfigError"):
        assert name in dir(stabledrl) and getattr(stabledrl, name) is not None
    cfg = stabledrl.load_config(ROOT / "deploy/configs/quickstart.yaml", ["run.steps=3"])
    assert isinstance(cfg, stabledrl.JobConfig) and cfg.run.steps == 3
    out = subprocess.run([sys.executable, "-m", "stabledrl", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"stabledrl {stabledrl.__version__}"


def test_a_config_error_names_the_field():
    import pytest

    with pytest.raises(stabledrl.ConfigError, match="run.steps"):
        stabledrl.load_config(ROOT / "deploy/configs/quickstart.yaml", ["run.steps=-1"])


def modules() -> list[str]:
    names = []
    for package in ("stabledrl", "stabledrl.common", "stabledrl.rollout", "stabledrl.learner", "stabledrl.coordinator"):
        path = __import__(package, fromlist=["x"]).__path__
        names += [package] + [m.name for m in pkgutil.walk_packages(path, package + ".", onerror=lambda _: None)]
    return sorted(set(names) - {"stabledrl.__main__"})


def test_every_module_imports_first_in_a_fresh_process():
    """An import cycle shows only when its modules are imported in one order: each module is imported
    as the first of the project's in a forked child (the third-party packages are loaded once). A
    module that its package's own import loads takes no child of its own: imported first, it would
    import its package first, and that child did exactly that."""
    code = """
import json, os, sys, importlib
import torch, transformers, pydantic, numpy, ray, deepspeed, peft, matplotlib.pyplot, safetensors, yaml
failed, loaded, children = [], {}, 0  # loaded: package -> the project's modules its first import loads
for name in sys.argv[1:]:  # sorted: a package before its modules
    package = name.rpartition(".")[0]
    if name in loaded.get(package, ()):
        loaded[name] = loaded[package]  # its first import is its package's
        continue
    children += 1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(name)
        except BaseException as e:
            print(f"{name}: {type(e).__name__}: {e}", flush=True)
            os._exit(1)
        with os.fdopen(w, "w") as f:
            json.dump([m for m in sys.modules if m.split(".")[0] == "stabledrl"], f)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        report = f.read()
    if os.waitpid(pid, 0)[1] != 0:
        failed.append(name)
    else:
        loaded[name] = set(json.loads(report))
print("CHILDREN", children)
print("FAILED", failed)
"""
    names = modules()
    assert len(names) > 150
    out = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.stdout.strip().endswith("FAILED []"), out.stdout[-4000:] + out.stderr[-2000:]

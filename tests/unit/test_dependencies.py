"""The package's dependencies as the docs describe them: every optional extra installs something
the code imports, and no page tells a user to install what `pip install stabledrl` already brings."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
IMPORT_NAMES = {"math-verify": "math_verify", "pyyaml": "yaml", "ray": "ray"}
DEV_TOOLS = "dev"  # pytest and ruff: run, not imported


def name_of(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()


def source_imports() -> str:
    files = [p for p in ROOT.rglob("*.py") if not {".venv", "runs", "tests"} & set(p.relative_to(ROOT).parts)]
    return "\n".join(p.read_text(errors="replace") for p in files)


def test_every_optional_extra_installs_something_the_code_imports():
    code = source_imports()
    for extra, requirements in PROJECT["optional-dependencies"].items():
        if extra == DEV_TOOLS:
            continue
        for requirement in requirements:
            module = IMPORT_NAMES.get(name_of(requirement), name_of(requirement).replace("-", "_"))
            assert re.search(rf"^\s*(import|from) {module}\b", code, re.M), (extra, requirement)


def test_no_page_tells_to_install_a_core_dependency():
    from stabledrl.cli.reports import PROTOCOL_NEEDS

    pages = {p: p.read_text() for p in [ROOT / "README.md", *ROOT.glob("docs/*.md"),
                                        ROOT / "deploy" / "README.md"] if p.is_file()}
    pages["stabledrl eval --help"] = PROTOCOL_NEEDS
    for requirement in PROJECT["dependencies"]:
        name = name_of(requirement)
        for page, text in pages.items():
            # torch's CUDA build comes from its own index, before the project: the one install a GPU needs first
            told = re.findall(rf"pip install ['\"]?{re.escape(name)}\b.*", text, re.I)
            assert all(name == "torch" and "--index-url" in line for line in told), (page, name, told)

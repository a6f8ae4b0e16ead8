"""Every relative link of the user-facing pages leads somewhere: the file exists and, where the link
names a section, the page has that heading."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "deploy" / "README.md", *sorted(ROOT.glob("docs/*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_of_the_page_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not this test's business
            continue
        path, _, section = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif section and file.suffix == ".md":
            headings = {anchor(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), re.M)}
            if section not in headings:
                broken.append(target)
    assert not broken, broken

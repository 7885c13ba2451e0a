"""docs/README.md indexes every page of docs/, and no link between the docs is broken.

A reader finds a page through the index, by purpose (guides, reference, design,
measurements); a page missing from it is a page nobody finds. The links between pages and
to their headings are checked here so that moving or renaming a page or a heading cannot
leave a dead link behind.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.server.live import REPO

DOCS = REPO / "docs"
INDEX = DOCS / "README.md"
PAGES = [*sorted(DOCS.rglob("*.md")), REPO / "README.md", REPO / "bench" / "NOTES.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_index_sorts_pages_by_purpose() -> None:
    text = INDEX.read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[:4] == ["Guides", "Reference", "Design", "Measurements"]


def test_every_page_is_in_the_index() -> None:
    linked = {
        (INDEX.parent / target.split("#")[0]).resolve()
        for target in LINK.findall(INDEX.read_text())
    }
    for page in DOCS.rglob("*.md"):
        if page != INDEX:
            assert page.resolve() in linked, (
                f"docs/README.md does not list {page.relative_to(REPO)}"
            )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_between_pages_resolve(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.relative_to(REPO)}: {target} does not exist"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.relative_to(REPO)}: no heading for {target}"

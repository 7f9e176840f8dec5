"""The README and the site's front page (docs/index.md) list every page of the docs, the same ones.

The two front pages are read in different places (the repository, the site) and drifted: each
missed pages the other listed. Pages under ``api/`` (generated from docstrings) and the results
pages other than the published one are reached from their own index pages.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")


def documentation_table(text: str) -> set[str]:
    """The pages linked from the ``## Documentation`` section's table."""
    section = text.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return {m for row in rows for m in LINK.findall(row)}


def test_readme_and_the_sites_front_page_list_every_page() -> None:
    readme = {p.removeprefix("docs/") for p in documentation_table(_read(ROOT / "README.md"))}
    index = documentation_table(_read(DOCS / "index.md"))
    pages = {
        str(p.relative_to(DOCS))
        for p in DOCS.rglob("*.md")
        if p.parts[len(DOCS.parts)] not in ("api", "results") and p.name != "index.md"
    }
    pages.add("results/published.md")
    api = {p for p in index if p.startswith("api/")}
    assert api, "docs/index.md links the API reference"
    assert readme - pages == set(), "README links pages that do not exist"
    assert pages - readme == set(), "pages missing from the README's documentation table"
    assert pages - (index - api) == set(), "pages missing from docs/index.md's table"
    assert (index - api) - pages == set(), "docs/index.md links pages that do not exist"


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")

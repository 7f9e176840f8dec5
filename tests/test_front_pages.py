"""The README and the site's front page (docs/index.md) list every page of the docs, the same ones.

The two front pages are read in different places (the repository, the site) and drifted: each
missed pages the other listed. Pages under ``api/`` (generated from docstrings) and the results
pages other than the published one are reached from their own index pages.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

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


def test_the_config_groups_table_lists_every_option_in_conf() -> None:
    """docs/concepts/configs.md's table of groups names exactly the YAML files of each group."""
    text = _read(DOCS / "concepts" / "configs.md")
    rows = [line for line in text.splitlines() if line.startswith("| `") and "/` |" in line]
    assert rows
    for row in rows:
        group, options = (cell.strip() for cell in row.split(" | ")[:2])
        group = group.strip("|` ").rstrip("/")
        listed = set(re.findall(r"`([^`]+)`", re.sub(r"\([^()]*\)", "", options)))
        on_disk = {p.stem for p in (ROOT / "conf" / group).glob("*.yaml")}
        assert listed == on_disk, f"conf/{group}/: the table lists {sorted(listed)}"


def test_the_top_level_keys_of_train_yaml_are_all_named() -> None:
    """The sentence after the groups table names every top-level key of conf/train.yaml."""
    text = _read(DOCS / "concepts" / "configs.md")
    sentence = text.split("Top-level keys of `train.yaml`:", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"`([a-z_]+)`", sentence))
    keys = set(yaml.safe_load(_read(ROOT / "conf" / "train.yaml"))) - {"defaults"}
    assert keys - named == set(), "keys of conf/train.yaml the docs do not name"

"""bench/published.py's page: one row's command and training run per row, and ``--only``
writing to a folder of its own, never over the docs' page."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def published():
    spec = importlib.util.spec_from_file_location("published", ROOT / "bench" / "published.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["published"] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def test_only_writes_its_own_folder_and_the_page_names_each_rows_commands(tmp_path: Path) -> None:
    page = ROOT / "docs" / "results" / "published.md"
    before = page.read_bytes()
    published().main(["--only", "CartPole-v1", "--report-only", "--work", str(tmp_path)])
    assert page.read_bytes() == before  # the docs' page untouched
    own = (tmp_path / "only_CartPole-v1" / "published.md").read_text()
    assert re.search(
        r"^\| CartPole-v1 \| `python bench/published.py --only CartPole-v1` \| `python train.py "
        r"\+experiment=ppo_classic_control task.env_id=CartPole-v1 total_env_steps=500000 seed=1 "
        r"[^`|]*` \| (?:~\d+m\d\ds|-) \|$",
        own,
        re.M,
    ), own


def test_the_docs_page_gives_every_rows_commands() -> None:
    page = (ROOT / "docs" / "results" / "published.md").read_text()
    module = published()
    for bench in module.BENCHMARKS:
        assert f"`python bench/published.py --only {bench.env_id}`" in page, bench.env_id
        assert f"+experiment={bench.experiment} task.env_id={bench.env_id} " in page

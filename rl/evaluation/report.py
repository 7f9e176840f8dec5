"""Evaluation results written and shown: the per-checkpoint JSON and text tables."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl.collection.episodes import EvalResult


def write_eval_json(path: Path, result: EvalResult, settings: Mapping[str, Any]) -> None:
    """Write the settings, mean metrics and per-episode records as JSON."""
    path.write_text(
        json.dumps(
            {"settings": dict(settings), "metrics": result.metrics, "episodes": result.episodes},
            indent=1,
        )
    )


def format_table(rows: Mapping[str, float], title: str) -> str:
    """A two-column text table of metrics."""
    width = max(len(k) for k in rows) if rows else 10
    lines = [title, "-" * (width + 14)]
    lines += [f"{k:<{width}}  {v:>12.4f}" for k, v in rows.items()]
    return "\n".join(lines)

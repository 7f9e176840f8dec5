"""Evaluation results written and shown: the result files and text tables."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl.collection.episodes import EvalResult
from rl.utils.files import write_atomic


def settings_tag(settings: Mapping[str, Any]) -> str:
    """``<split>-<N>ep-<sampled|argmax>-<hash>`` (the hash: of all of ``settings``)."""
    digest = hashlib.blake2b(
        json.dumps(dict(settings), sort_keys=True, default=str).encode(), digest_size=4
    ).hexdigest()
    mode = "argmax" if settings.get("deterministic") else "sampled"
    return f"{settings.get('split') or 'all'}-{settings.get('num_episodes')}ep-{mode}-{digest}"


def eval_json_path(checkpoint: Path, settings: Mapping[str, Any]) -> Path:
    """``<checkpoint>.eval.<settings_tag>.json``: ``evaluate.py``'s result for these settings.

    Results of different settings sit side by side, and none replaces the training-time final
    evaluation, ``<checkpoint>.eval.json``.
    """
    return checkpoint.with_suffix(f".eval.{settings_tag(settings)}.json")


def write_eval_json(path: Path, result: EvalResult, settings: Mapping[str, Any]) -> None:
    """Write the settings, mean metrics and per-episode records as JSON."""
    write_atomic(
        path,
        json.dumps(
            {"settings": dict(settings), "metrics": result.metrics, "episodes": result.episodes},
            indent=1,
        ),
        what="evaluation result",
    )


def format_table(rows: Mapping[str, float], title: str) -> str:
    """A two-column text table of metrics."""
    width = max(len(k) for k in rows) if rows else 10
    lines = [title, "-" * (width + 14)]
    lines += [f"{k:<{width}}  {v:>12.4f}" for k, v in rows.items()]
    return "\n".join(lines)

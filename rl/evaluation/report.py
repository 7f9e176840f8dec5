"""Evaluation results written and shown: result files, summaries, text tables and PNG plots.

Plots use matplotlib's object API with the Agg canvas only (no ``pyplot``, no global backend
switch): they work headless and never change the calling program's backend.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from rl.collection.episodes import EvalResult
from rl.utils.files import read_regular_file, write_atomic
from rl.utils.finite import as_float

log = logging.getLogger(__name__)

SUMMARY_NAME = "eval_summary"
# Columns of the printed summary, in this order, when present.
TABLE_METRICS = ("success", "spl", "return", "length", "final_distance", "game_return")
# Panels in this order, when the metric is present: (metric, axis label).
PLOTTED_METRICS = (("success", "success"), ("spl", "SPL"), ("return", "return"))
# The training metric logged for each plotted one.
TRAINING_KEYS = {
    "success": "charts/success",
    "spl": "charts/spl",
    "return": "charts/episodic_return",
}
# The most of ``metrics.jsonl`` read (a long run logging every few thousand steps writes a few MB).
MAX_METRICS_BYTES = 256 * 2**20
# The most log points kept of one (10**9 env steps logged every 1,000).
MAX_METRIC_POINTS = 1_000_000
# A logged value larger than this is no metric's (means, deviations and plot axes of values
# near a float's limit overflow): skipped like a NaN.
MAX_METRIC_MAGNITUDE = 1e100


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


def format_summary(
    rows: Sequence[Mapping[str, Any]], title: str, expert: Mapping[str, float] | None = None
) -> str:
    """A text table of summary rows (step, stage and the main metrics), expert row last."""
    keys = [k for k in TABLE_METRICS if any(k in r for r in rows)]
    if not keys:
        keys = sorted({k for r in rows for k in r} - {"checkpoint", "step", "stage"})
    header = f"{'step':>14} {'stage':>5} " + " ".join(f"{k:>14}" for k in keys)
    lines = [title, header, "-" * len(header)]

    def cells(row: Mapping[str, Any]) -> str:
        return " ".join(f"{float(row[k]):>14.4f}" if k in row else f"{'-':>14}" for k in keys)

    lines += [f"{int(r['step']):>14,} {int(r['stage']):>5} {cells(r)}" for r in rows]
    if expert is not None:
        lines.append(f"{'expert':>14} {'':>5} {cells(expert)}")
    return "\n".join(lines)


def summary_stems(settings: Mapping[str, Any]) -> tuple[str, str]:
    """``eval_summary.<settings_tag>`` (each setting's own) and ``eval_summary`` (the latest)."""
    return f"{SUMMARY_NAME}.{settings_tag(settings)}", SUMMARY_NAME


def write_summary(
    folder: Path,
    rows: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Any],
    expert: Mapping[str, float] | None = None,
) -> tuple[Path, Path]:
    """Write both :func:`summary_stems` as CSV and JSON; return the setting's own two files."""
    columns = ["checkpoint", "step", "stage"]
    columns += sorted({k for r in rows for k in r} - set(columns))
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=columns, restval="")
    writer.writeheader()
    writer.writerows(rows)
    data = json.dumps(
        {"settings": dict(settings), "checkpoints": list(rows), "expert": expert}, indent=1
    )
    own, latest = summary_stems(settings)
    for stem in (own, latest):  # (a link under a name is replaced, not followed)
        write_atomic(folder / f"{stem}.csv", table.getvalue(), what="evaluation summary")
        write_atomic(folder / f"{stem}.json", data, what="evaluation summary")
    return folder / f"{own}.csv", folder / f"{own}.json"


# ----------------------------------------------------------------- plots
def read_metrics(
    path: Path, keys: Collection[str] | None = None, max_points: int = MAX_METRIC_POINTS
) -> list[dict[str, float]]:
    """The finite numbers of each log point of a ``metrics.jsonl`` (points without any left out).

    Only the metrics ``keys`` are kept (None: all). The file is untrusted (a run folder may come
    from anywhere): a regular file only, at most :data:`MAX_METRICS_BYTES` of it and
    ``max_points`` points (the rest ignored, with a warning), and a line that is not a JSON
    record is skipped, as is a value that is not a number of at most
    :data:`MAX_METRIC_MAGNITUDE`.
    """
    raw = read_regular_file(Path(path), MAX_METRICS_BYTES)
    points: list[dict[str, float]] = []
    for line in io.BytesIO(raw or b""):  # (one line at a time: no copy of the whole file)
        try:
            record = json.loads(line.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):  # not JSON, an int of 4,300 digits, too deep
            continue
        if not isinstance(record, dict):
            continue
        point = {
            k: float(v)
            for k, v in record.items()
            if (keys is None or k in keys) and _finite(v) and abs(v) <= MAX_METRIC_MAGNITUDE
        }
        if not point:
            continue
        if len(points) == max_points:
            log.warning("%s: more than %d log points; the rest is ignored", path, max_points)
            break
        points.append(point)
    return points


def training_curve(metrics_file: Path) -> list[dict[str, float]]:
    """The plotted metrics of a run's training episodes: ``{"step", "success", ...}`` per log."""
    rows = []
    for point in read_metrics(metrics_file, {"env_step", *TRAINING_KEYS.values()}):
        row = {key: point[name] for key, name in TRAINING_KEYS.items() if name in point}
        if row and "env_step" in point:
            rows.append({"step": point["env_step"], **row})
    return rows


def plot_checkpoint_metrics(
    rows: Sequence[Mapping[str, Any]],
    path: Path,
    *,
    title: str = "",
    expert: Mapping[str, float] | None = None,
    training: Sequence[Mapping[str, float]] = (),
) -> Path | None:
    """Plot success / SPL / return of evaluated checkpoints against env steps into ``path``.

    ``rows`` are the checkpoints' in step order (``step`` and the metrics); the expert's
    metrics are dashed lines, the training curve (:func:`training_curve`) a thin line.
    Returns ``path``, or None when no row has any of the plotted metrics.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [
        (key, label)
        for key, label in PLOTTED_METRICS
        if any(_finite(row.get(key)) for row in (*rows, *training))
    ]
    if not panels:
        return None
    fig = Figure(figsize=(4.0 * len(panels), 3.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    steps = [int(row["step"]) for row in rows]
    for ax, (key, label) in zip(axes, panels, strict=True):
        values = [float(row[key]) if _finite(row.get(key)) else math.nan for row in rows]
        ax.plot(steps, values, marker="o", markersize=3, label="checkpoints (evaluation)")
        curve = [(row["step"], float(row[key])) for row in training if _finite(row.get(key))]
        if curve:
            xs, ys = zip(*curve, strict=True)
            ax.plot(xs, ys, linewidth=0.8, alpha=0.7, color="tab:orange", label="training")
        if expert is not None and _finite(expert.get(key)):
            ax.axhline(float(expert[key]), linestyle="--", color="gray", label="expert")
        if curve or expert is not None:
            ax.legend(loc="best", fontsize="small")
        ax.set_xlabel("env steps")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if key in ("success", "spl"):
            ax.set_ylim(-0.05, 1.05)
    if title:
        fig.suptitle(title, fontsize="medium")
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=100)
    write_atomic(path, image.getvalue(), what="evaluation plot")
    return path


def _finite(value: Any) -> bool:
    """A real number (no bool) that is finite as a float."""
    return as_float(value, finite=True) is not None

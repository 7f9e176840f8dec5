"""PNG plots of a run's checkpoint evaluations, and the reading of its ``metrics.jsonl``.

matplotlib's object API with the Agg canvas only (no ``pyplot``, no global backend switch): it
works headless and never changes the calling program's backend.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl.utils.files import read_regular_file, write_atomic

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


def read_metrics(path: Path) -> list[dict[str, float]]:
    """The finite numbers of each log point of a ``metrics.jsonl`` (points without any left out).

    The file is untrusted (a run folder may come from anywhere): a regular file only, at most
    :data:`MAX_METRICS_BYTES` of it, and a line that is not a JSON record is skipped.
    """
    raw = read_regular_file(Path(path), MAX_METRICS_BYTES)
    points = []
    for line in (raw or b"").decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError):  # (nested beyond Python's stack)
            continue
        if isinstance(record, dict):
            point = {str(k): float(v) for k, v in record.items() if _finite(v)}
            if point:
                points.append(point)
    return points


def training_curve(metrics_file: Path) -> list[dict[str, float]]:
    """The plotted metrics of a run's training episodes: ``{"step", "success", ...}`` per log."""
    rows = []
    for point in read_metrics(metrics_file):
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
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # (an integer beyond a float's range)
        return False

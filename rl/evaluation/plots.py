"""PNG plots of a run's checkpoint evaluations (success, SPL, return against env steps).

Beside the evaluations, the run's training curve (``metrics.jsonl``: the same metrics of the
training episodes, :func:`training_curve`) is drawn as a thin line.

Uses matplotlib's object API with the Agg canvas only (no ``pyplot``, no global backend
switch), so it works headless and never changes the backend of the calling program.
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


# The most of ``metrics.jsonl`` read for a plot (a long run logging every few thousand steps
# writes a few MB; a larger file is read up to this point).
MAX_METRICS_BYTES = 256 * 2**20


def training_curve(metrics_file: Path) -> list[dict[str, float]]:
    """The plotted metrics of a run's training episodes: ``{"step", "success", ...}`` per log.

    Reads ``metrics.jsonl`` (one record per log point), a regular file only and at most
    :data:`MAX_METRICS_BYTES` of it; a missing file, a link, a FIFO or a line that is not a
    JSON record of numbers (a run killed mid-write, a crafted file) gives what could be read.
    """
    rows = []
    raw = read_regular_file(Path(metrics_file), MAX_METRICS_BYTES)
    if raw is None:
        return []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError):  # (nested beyond Python's stack)
            continue
        if not isinstance(record, dict):
            continue
        row = {
            key: record[name] for key, name in TRAINING_KEYS.items() if _finite(record.get(name))
        }
        if row and _finite(record.get("env_step")):
            rows.append({"step": float(record["env_step"]), **row})
    return rows


def plot_checkpoint_metrics(
    rows: Sequence[Mapping[str, Any]],
    path: Path,
    *,
    title: str = "",
    expert: Mapping[str, float] | None = None,
    training: Sequence[Mapping[str, float]] = (),
) -> Path | None:
    """Plot success / SPL / return of evaluated checkpoints against env steps.

    Args:
        rows: One mapping per checkpoint, in step order, with ``step`` and metric values
            (``success``, ``spl``, ``return``, ...).
        path: The PNG to write.
        title: Figure title (e.g. the run folder).
        expert: Mean metrics of the task's expert on the same episodes, drawn as dashed lines.
        training: The run's training curve (:func:`training_curve`), drawn as a thin line.

    Returns:
        ``path``, or None when no row has any of the plotted metrics.
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
    # (a link under the name is replaced, not followed; a full disk is named)
    write_atomic(path, image.getvalue(), what="evaluation plot")
    return path


def _finite(value: Any) -> bool:
    try:
        return isinstance(value, int | float) and math.isfinite(float(value))
    except OverflowError:  # (an integer beyond a float's range)
        return False

"""Compare runs: final and best metrics by override, mean ± std over seeds; curves with a band.

    python -m rl.compare outputs/ppo_nav/multirun/2026-11-27_10-00-00
    python -m rl.compare RUN_DIR RUN_DIR ... --metrics eval/success charts/SPS --out compare/

A path is a run folder (it holds ``metrics.jsonl``) or a folder of them, such as a multirun's
sweep folder. A run's group is its command-line overrides (``.hydra/overrides.yaml``) without
``seed=...`` and without those every run shares, so the runs of a group differ only in their
seed. docs/howto/sweeps.md describes the table and the plot.
"""

from __future__ import annotations

import argparse
import csv
import io
import logging
import os
import statistics
import sys
import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rl.evaluation.report import read_metrics
from rl.utils.files import load_yaml_data, read_regular_file, write_atomic

log = logging.getLogger(__name__)

__all__ = ["Group", "Run", "compare", "find_runs", "format_table", "main", "read_run"]

# Metrics tabulated when none are named, where any run logged them: the evaluation's, else
# (no evaluation) the training episodes'.
DEFAULT_METRICS = (
    ("eval/success", "eval/spl", "eval/episodic_return"),
    ("charts/success", "charts/spl", "charts/episodic_return"),
)
MAX_DEPTH = 3  # folders below a given path searched for runs
MAX_OVERRIDES_BYTES = 2**20
MAX_POINTS = 2_000_000  # log points of all runs together (a sweep of 100 runs: ~500,000)


@dataclass
class Run:
    """One run folder: its overrides and its log points (``env_step`` -> metrics)."""

    path: Path
    overrides: list[str]
    points: list[dict[str, float]] = field(default_factory=list)

    @property
    def seed(self) -> str | None:
        """The ``seed=`` override, if the run had one."""
        found = [o.split("=", 1)[1] for o in self.overrides if _key(o) == "seed"]
        return found[-1] if found else None

    def final(self, metric: str) -> float | None:
        """The metric at the run's last log point that has it."""
        values = [p[metric] for p in self.points if metric in p]
        return values[-1] if values else None

    def best(self, metric: str) -> float | None:
        """The highest value of the metric over the run's log points."""
        values = [p[metric] for p in self.points if metric in p]
        return max(values) if values else None

    def curve(self, metric: str) -> tuple[list[float], list[float]]:
        """``(env steps, values)`` of the metric."""
        points = [p for p in self.points if metric in p and "env_step" in p]
        return [p["env_step"] for p in points], [p[metric] for p in points]


@dataclass
class Group:
    """Runs that differ only in their seed, labelled by their distinguishing overrides."""

    label: str
    runs: list[Run]


# ------------------------------------------------------------------------------- reading
def find_runs(paths: Sequence[Path]) -> list[Path]:
    """Every run folder at or below ``paths`` (in order, each once; links not followed)."""
    found: list[Path] = []
    for path in paths:
        found += _walk(Path(path), MAX_DEPTH)
    return list(dict.fromkeys(found))


def _walk(folder: Path, depth: int) -> list[Path]:
    try:  # (unreadable: the runs elsewhere are still compared)
        if folder.is_symlink() or not folder.is_dir():
            return []
        metrics = folder / "metrics.jsonl"
        if metrics.is_file() and not metrics.is_symlink():
            return [folder]
        if depth == 0:
            return []
        with os.scandir(folder) as entries:
            subfolders = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError as e:
        log.warning("skipping %s: %s", folder, e.strerror or e)
        return []
    runs: list[Path] = []
    for sub in sorted(subfolders, key=_natural):
        runs += _walk(sub, depth - 1)
    return runs


def _natural(path: Path) -> tuple[Any, ...]:
    """Job folders ``0_<overrides>, 1_<overrides>, ..., 10_<overrides>`` in number order."""
    name = path.name
    head = name.split("_", 1)[0]
    return (0, int(head), name) if head.isascii() and head.isdigit() else (1, 0, name)


def read_run(folder: Path, metrics: Collection[str] | None = None) -> Run:
    """A run folder's overrides and numeric log points (what can be read: it is untrusted).

    ``metrics``: the metrics kept of each point (None: all).
    """
    overrides: list[str] = []
    raw = read_regular_file(folder / ".hydra" / "overrides.yaml", MAX_OVERRIDES_BYTES)
    if raw is not None:
        try:
            loaded = load_yaml_data(raw.decode("utf-8", errors="replace"))
        except yaml.YAMLError:
            loaded = None
        if isinstance(loaded, list):
            overrides = [_printable(str(o)) for o in loaded if isinstance(o, str | int | float)]
    points = read_metrics(folder / "metrics.jsonl", metrics)
    return Run(path=folder, overrides=overrides, points=points)


def _printable(text: str) -> str:
    """``text`` with its control characters escaped, as ``repr`` writes them.

    Overrides label the table's rows: a terminal would act on an escape sequence from a file.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _key(override: str) -> str:
    """``seed`` of ``seed=2``, ``pipeline.optimizer.lr`` of ``+pipeline.optimizer.lr=1e-3``."""
    return override.split("=", 1)[0].lstrip("+~")


# ------------------------------------------------------------------------------ grouping
def group_runs(runs: Sequence[Run]) -> list[Group]:
    """Runs grouped by their overrides without the seed and without what every run shares."""
    own = [[o for o in run.overrides if _key(o) != "seed" and not _key(o).startswith("hydra.")]
           for run in runs]  # fmt: skip
    shared = set.intersection(*(set(o) for o in own)) if own else set()
    groups: dict[str, list[Run]] = {}
    for run, overrides in zip(runs, own, strict=True):
        label = " ".join(o for o in overrides if o not in shared) or "(all runs)"
        groups.setdefault(label, []).append(run)
    return [Group(label, members) for label, members in groups.items()]


def _mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else None


def _seeds(group: Group) -> str:
    return " ".join(str(r.seed) for r in group.runs if r.seed is not None)


def compare(groups: Sequence[Group], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """One row per group: its label, runs, seeds, and per metric its final and best values.

    Each ``"<metric> final"`` and ``"<metric> best"`` entry is ``{"mean", "std", "n"}``: over
    the ``n`` runs of the group that logged the metric (``std`` None for one run, ``mean`` None
    for none).
    """
    rows = []
    for group in groups:
        row: dict[str, Any] = {
            "group": group.label,
            "runs": len(group.runs),
            "seeds": _seeds(group),
        }
        for metric in metrics:
            for kind in ("final", "best"):
                values = [v for r in group.runs if (v := getattr(r, kind)(metric)) is not None]
                mean, std = _mean_std(values) if values else (None, None)
                row[f"{metric} {kind}"] = {"mean": mean, "std": std, "n": len(values)}
        rows.append(row)
    return rows


def format_table(groups: Sequence[Group], metrics: Sequence[str]) -> str:
    """A Markdown table: group, runs, seeds, then final and best (mean ± std) per metric."""
    header = ["group", "runs", "seeds"]
    for metric in metrics:
        header += [f"{metric} final", f"{metric} best"]
    lines = [header]
    for row in compare(groups, metrics):
        line = [row["group"], str(row["runs"]), row["seeds"] or "-"]
        for metric in metrics:
            line += [_cell(row[f"{metric} {kind}"]) for kind in ("final", "best")]
        lines.append(line)
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    text = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
            for row in lines]  # fmt: skip
    text.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(text)


def _cell(cell: Mapping[str, Any]) -> str:
    if cell["mean"] is None:
        return "-"
    if cell["std"] is None:
        return f"{cell['mean']:.4g}"
    return f"{cell['mean']:.4g} ± {cell['std']:.2g}"


def _csv(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str]) -> str:
    out = io.StringIO()
    columns = ["group", "runs", "seeds"]
    for metric in metrics:
        for kind in ("final", "best"):
            columns += [f"{metric} {kind} mean", f"{metric} {kind} std"]
    writer = csv.writer(out)
    writer.writerow(columns)
    for row in rows:
        cells = [row["group"], row["runs"], row["seeds"]]
        for metric in metrics:
            for kind in ("final", "best"):
                cell = row[f"{metric} {kind}"]
                cells += ["" if cell["mean"] is None else cell["mean"],
                          "" if cell["std"] is None else cell["std"]]  # fmt: skip
        writer.writerow(cells)
    return out.getvalue()


# ---------------------------------------------------------------------------------- plot
def plot_curves(groups: Sequence[Group], metric: str, path: Path) -> Path | None:
    """Each group's mean curve of ``metric`` with a ± std band into ``path`` (None: no curve).

    Each run's curve is interpolated onto the union of the group's env steps, within its range.
    """
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    drawn = False
    for group in groups:
        curves = [c for c in (r.curve(metric) for r in group.runs) if c[0]]
        if not curves:
            continue
        grid = np.unique(np.concatenate([np.asarray(steps) for steps, _ in curves]))
        stacked = np.full((len(curves), grid.size), np.nan)
        for i, (steps, values) in enumerate(curves):
            inside = (grid >= steps[0]) & (grid <= steps[-1])
            stacked[i, inside] = np.interp(grid[inside], steps, values)
        with warnings.catch_warnings():  # (a grid point inside one run's range only: no std)
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(stacked, axis=0)  # (every grid point is some run's step)
            std = np.nan_to_num(np.nanstd(stacked, axis=0, ddof=1))
        label = f"{group.label} ({len(curves)} runs)"
        (line,) = ax.plot(grid, mean, label=label, linewidth=1.2)
        ax.fill_between(grid, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        drawn = True
    if not drawn:
        return None
    ax.set_xlabel("env steps")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=100)
    write_atomic(path, image.getvalue(), what="comparison plot")
    return path


# ----------------------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rl.compare``: print the table, write ``compare.csv`` and ``compare.png``."""
    parser = argparse.ArgumentParser(
        prog="python -m rl.compare",
        description="Final and best metrics of runs grouped by override (mean ± std over "
        "seeds), and their curves with a band.",
    )
    parser.add_argument("paths", nargs="+", type=Path, help="run folders or sweep folders")
    parser.add_argument("--metrics", nargs="+", default=None, help="metrics to tabulate")
    parser.add_argument("--curve", default=None, help="the plotted metric (default: the first)")
    parser.add_argument(
        "--out", type=Path, default=None,
        help="folder for compare.csv and compare.png (default: the one path given, else .)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    folders = find_runs(args.paths)
    if not folders:
        parser.error(f"no run folder (one holding metrics.jsonl) at or below {args.paths}")
    # Only what can be tabulated or plotted is kept: the metrics asked for, else the defaults.
    wanted = {"env_step", *(args.metrics or (m for ms in DEFAULT_METRICS for m in ms))}
    if args.curve:
        wanted.add(args.curve)
    runs, points = [], 0
    for folder in folders:
        runs.append(read_run(folder, wanted))
        points += len(runs[-1].points)
        if points > MAX_POINTS:
            parser.error(
                f"the runs up to {folder} hold more than {MAX_POINTS:,} log points in all; "
                "compare fewer runs at a time"
            )
    logged = {key for run in runs for point in run.points for key in point}
    defaults = next(
        ([m for m in ms if m in logged] for ms in DEFAULT_METRICS if logged & set(ms)), []
    )
    metrics = args.metrics or defaults
    if not metrics:
        known = [m for ms in DEFAULT_METRICS for m in ms]
        parser.error(f"none of {known} was logged; name the metrics with --metrics")
    groups = group_runs(runs)
    print(f"{len(runs)} runs in {len(groups)} groups")
    print(format_table(groups, metrics))
    single = len(args.paths) == 1 and args.paths[0].is_dir() and len(folders) > 1
    out = args.out if args.out is not None else (args.paths[0] if single else Path("."))
    curve = args.curve or _first_curve(runs, metrics)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "compare.csv", _csv(compare(groups, metrics), metrics), what="table")
        print(f"table: {out / 'compare.csv'}")
        plotted = plot_curves(groups, curve, out / "compare.png")
    except OSError as e:  # a full disk, a folder or a link where a file goes: one line
        print(f"error: {e.strerror or e}", file=sys.stderr)
        return 1
    print(
        f"no curve: no run logged {curve}" if plotted is None else f"curves of {curve}: {plotted}"
    )
    return 0


def _first_curve(runs: Sequence[Run], metrics: Sequence[str]) -> str:
    """The first metric some run logged at two points or more (a curve), else the first."""
    for metric in metrics:
        if any(len(run.curve(metric)[0]) > 1 for run in runs):
            return metric
    return metrics[0]

"""A metrics sink that keeps what a trainer logged, to compare two runs' logs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rl.loggers import MetricsSink


def _timed(key: str) -> bool:
    """Wall-clock measures, which differ between any two runs."""
    return key == "charts/SPS" or key.startswith("time/")


class Recorded(MetricsSink):
    """Every log point's metrics (wall-clock ones left out) and finished episodes, by env step."""

    def __init__(self) -> None:
        self.logs: list[tuple[int, dict[str, float]]] = []
        self.episodes: list[tuple[int, list[dict[str, float]]]] = []

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.logs.append((step, {k: v for k, v in metrics.items() if not _timed(k)}))

    def log_episodes(self, step: int, episodes: Sequence[Mapping[str, float]]) -> None:
        self.episodes.append((step, [dict(e) for e in episodes]))

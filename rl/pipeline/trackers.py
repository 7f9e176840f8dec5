"""Weighted running means of scalars (AllenAct's ``ScalarMeanTracker``)."""

from __future__ import annotations

from collections.abc import Mapping


class ScalarMeanTracker:
    """Accumulate weighted sums of named scalars and report their means."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._counts: dict[str, float] = {}

    def add_scalars(
        self, scalars: Mapping[str, float], n: float | Mapping[str, float] = 1
    ) -> None:
        """Add ``scalars``, each weighted by ``n`` (samples it is a mean over; or one per key)."""
        for key, value in scalars.items():
            weight = n[key] if isinstance(n, Mapping) else n
            self._sums[key] = self._sums.get(key, 0.0) + float(value) * weight
            self._counts[key] = self._counts.get(key, 0.0) + weight

    def merge(self, state: Mapping[str, Mapping[str, float]]) -> None:
        """Add the sums and counts of another tracker's :meth:`state_dict`."""
        for key, value in state["sums"].items():
            self._sums[key] = self._sums.get(key, 0.0) + float(value)
        for key, count in state["counts"].items():
            self._counts[key] = self._counts.get(key, 0.0) + float(count)

    def means(self) -> dict[str, float]:
        """Weighted means of everything added since the last reset."""
        return {k: self._sums[k] / self._counts[k] for k in self._sums if self._counts[k] > 0}

    def counts(self) -> dict[str, float]:
        """Total weights since the last reset."""
        return dict(self._counts)

    def reset(self) -> None:
        """Forget everything."""
        self._sums.clear()
        self._counts.clear()

    def pop_and_reset(self) -> dict[str, float]:
        """Return :meth:`means`, then reset."""
        means = self.means()
        self.reset()
        return means

    def state_dict(self) -> dict[str, dict[str, float]]:
        """Sums and counts so far (plain floats; for checkpoints)."""
        return {"sums": dict(self._sums), "counts": dict(self._counts)}

    def load_state_dict(self, state: Mapping[str, Mapping[str, float]]) -> None:
        """Restore sums and counts saved by :meth:`state_dict`."""
        self._sums = {k: float(v) for k, v in state["sums"].items()}
        self._counts = {k: float(v) for k, v in state["counts"].items()}

    def __len__(self) -> int:
        return len(self._sums)

"""The logged names of the samplers' episode metrics."""

from __future__ import annotations

# cleanrl-compatible names for the samplers' generic episode metrics.
_EPISODE_KEY = {"return": "charts/episodic_return", "length": "charts/episodic_length"}


def episode_metric_key(name: str) -> str:
    """Logged key of an episode metric (``return`` -> ``charts/episodic_return``)."""
    return _EPISODE_KEY.get(name, f"charts/{name}")

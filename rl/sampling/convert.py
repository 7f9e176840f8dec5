"""What crosses from samplers to torch: observation batches and episode-metric names."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

# cleanrl-compatible names for the samplers' generic episode metrics.
_EPISODE_KEY = {"return": "charts/episodic_return", "length": "charts/episodic_length"}


def obs_to_torch(obs: Mapping[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """NumPy observation batch -> tensors on ``device`` (zero-copy on CPU)."""
    return {k: torch.from_numpy(v).to(device, non_blocking=True) for k, v in obs.items()}


def episode_metric_key(name: str) -> str:
    """Logged key of an episode metric (``return`` -> ``charts/episodic_return``)."""
    return _EPISODE_KEY.get(name, f"charts/{name}")

"""The small configs tests share: a PointNav layout that trains in seconds, a serial sampler of
four environments, a tiny recurrent policy (``from small import SMALL, MODEL, SERIAL``).

Tests that need another episode length take ``small_nav(max_steps=...)``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MODEL", "SERIAL", "SMALL", "small_nav"]


def small_nav(max_steps: int = 30) -> dict[str, Any]:
    """A 9x9 PointNav layout of 2x2 rooms, episodes of at most ``max_steps``."""
    return {"_target_": "rl.tasks.PointNavEnv", "size": 9, "rooms_per_side": 2,
            "max_steps": max_steps}  # fmt: skip


SMALL = small_nav()
MODEL = {"_target_": "rl.models.ActorCritic", "_partial_": True, "cnn_channels": [8],
         "trunk_layers": [16], "rnn": "gru", "rnn_hidden_size": 8}  # fmt: skip
SERIAL = {"_target_": "rl.sampling.SerialSampler", "_partial_": True, "num_envs": 4}

"""Finite checks of what environments return, once per step over the whole batch.

A NaN or infinite reward or float observation would poison the update, so it stops the run
with a :class:`~rl.utils.finite.NonFiniteError` naming the environment, its episode's step and
the field. Every sampler words it alike (the multiprocess one runs serial samplers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from rl.utils.finite import NonFiniteError

__all__ = ["FiniteChecks", "all_finite", "first_nonfinite_row", "is_float"]


def all_finite(values: np.ndarray) -> bool:
    """No NaN or infinity in ``values``: one sum, checked element-wise only if it overflowed."""
    return math.isfinite(values.sum()) or bool(np.isfinite(values).all())


def first_nonfinite_row(values: torch.Tensor) -> int | None:
    """The first row of ``values`` (``[K, ...]``, any device) holding a NaN or infinity."""
    bad = ~torch.isfinite(values.reshape(len(values), -1)).all(1)
    rows = bad.nonzero()
    return int(rows[0, 0]) if len(rows) else None


def is_float(dtype: Any) -> bool:
    """Whether observations of ``dtype`` can be NaN or infinite."""
    return dtype is not None and np.dtype(dtype).kind in "fc"


class FiniteChecks:
    """Finite checks mixed into a sampler; sets ``current_env`` to the environment at fault."""

    _float_keys: list[str]  # observation keys of a float dtype
    _dict_obs: bool
    env_offset: int
    _episode_start: list[dict[str, Any]]
    current_env: int | None

    def _check_obs(
        self,
        obs: dict[str, np.ndarray],
        envs: list[int],
        when: Callable[[int], str],
        what: str = "observation",
    ) -> None:
        """Raise :class:`NonFiniteError` for the first non-finite float observation.

        Args:
            obs: ``[K, ...]`` observation rows by key.
            envs: Local environment index of each row.
            when: ``when(row)``: at which step the row was observed, in words.
            what: ``observation`` or ``final observation``.
        """
        for key in self._float_keys:
            values = obs.get(key)
            if values is None or len(values) == 0 or all_finite(values):
                continue
            row = int(np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(1))[0])
            field = f"{what} {key!r}" if self._dict_obs else what
            self._nonfinite(envs[row], field, values[row], when(row))

    def _start_seed(self, env: int) -> int | None:
        """The seed environment ``env``'s episode started with (None: an unseeded reset)."""
        return self._episode_start[env].get("seed")

    def _nonfinite(self, env: int, field: str, value: Any, when: str) -> None:
        self.current_env = self.env_offset + env  # a sampler process's error names it too
        bad = np.asarray(value, dtype=np.float64).ravel()
        bad = bad[~np.isfinite(bad)]
        seed = self._start_seed(env)
        raise NonFiniteError(
            f"environment {self.env_offset + env} returned a non-finite {field} "
            f"({bad[0] if bad.size else value}) at {when}"
            + ("" if seed is None else f" (episode seed {seed})")
            + "; non-finite rewards and observations would poison the update, so they stop "
            "the run"
        )

    def _check_step(
        self,
        obs: dict[str, np.ndarray],
        rewards: np.ndarray,
        final_obs: dict[str, np.ndarray],
        final_idx: list[int],
        active: list[int],
        steps: Sequence[int],
        reset: Sequence[bool],
    ) -> None:
        """Raise :class:`NonFiniteError` for a step's first non-finite reward or observation.

        ``final_obs``: the truncated episodes' final observations, at positions ``final_idx``.
        """
        if not all_finite(rewards):
            pos = int(np.flatnonzero(~np.isfinite(rewards))[0])
            self._nonfinite(
                active[pos], "reward", rewards[pos], f"step {steps[pos]} of its episode"
            )
        self._check_obs(
            obs,
            active,
            lambda pos: (
                f"the reset after step {steps[pos]} of its episode"
                if reset[pos]
                else f"step {steps[pos]} of its episode"
            ),
        )
        if final_idx:
            self._check_obs(
                final_obs,
                [active[pos] for pos in final_idx],
                lambda k: f"step {steps[final_idx[k]]} of its episode (truncated)",
                "final observation",
            )

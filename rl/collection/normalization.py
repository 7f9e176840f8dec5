"""Observation and reward normalisation, owned by the collector (SB3's ``VecNormalize``).

Float ``Box`` observation entries reach the policy as ``(x - mean) / std`` clipped to
``[-clip, clip]``; rewards are divided by the running std of each environment's discounted
return (clipped; episode returns are logged as the environments gave them). The statistics are
frozen during a rollout and merged after it from the rollout's moments (Chan et al.), so the
policy sees the same inputs when it acts and when the update re-runs it, and an in-process
collector, one synchronous worker and every DDP rank hold bitwise the same statistics. Workers
send their moments with the data; the learner merges them in worker order. Evaluation reuses
the checkpoint's statistics, frozen.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, cast

import gymnasium as gym
import numpy as np
import torch

from rl.distributed.reduce import all_reduce_sum, is_distributed
from rl.utils.config import Check, load_section
from rl.utils.finite import NonFiniteError, as_float

__all__ = ["NormalizeSettings", "Normalizer", "RunningMeanStd"]


@dataclasses.dataclass(frozen=True)
class NormalizeSettings:
    """The ``normalize`` section of a run's config.

    Attributes:
        observations: Normalise the float observation entries.
        rewards: Scale the rewards by the running std of the discounted return.
        clip: Clip normalised observations and scaled rewards to ``[-clip, clip]``.
        gamma: Discount of that return (None: the current stage's).
        epsilon: Added to the variance before the square root.
    """

    observations: bool
    rewards: bool
    clip: Annotated[float, Check(gt=0)]
    gamma: Annotated[float | None, Check(ge=0, le=1)]
    epsilon: Annotated[float, Check(gt=0)]


class RunningMeanStd:
    """Count, mean and variance of a stream of ``shape``-shaped values (float64).

    Starts as CleanRL's and SB3's do: mean 0, variance 1, a count of ``1e-4``.
    """

    def __init__(self, shape: Sequence[int] = ()) -> None:
        self.mean = torch.zeros(tuple(shape), dtype=torch.float64)
        self.var = torch.ones(tuple(shape), dtype=torch.float64)
        self.count = 1e-4

    def merge(self, count: float, mean: torch.Tensor, var: torch.Tensor) -> None:
        """Merge a batch's ``count``, ``mean`` and (population) ``var`` (Chan et al.)."""
        if count <= 0:
            return
        delta = mean - self.mean
        total = self.count + count
        m2 = self.var * self.count + var * count + delta.pow(2) * self.count * count / total
        self.mean = self.mean + delta * count / total
        self.var = m2 / total
        self.count = total

    def state_dict(self) -> dict[str, Any]:
        """``{"mean", "var", "count"}`` (``weights_only``-safe)."""
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": float(self.count)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s values (a ValueError: they do not fit, or not finite)."""
        mean, var = state["mean"], state["var"]
        if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in (mean, var)):
            raise ValueError("mean and var are not floating tensors")
        if mean.shape != self.mean.shape or var.shape != self.var.shape:
            raise ValueError(
                f"statistics of shape {tuple(mean.shape)}, expected {tuple(self.mean.shape)}"
            )
        if not (bool(torch.isfinite(mean).all()) and bool(torch.isfinite(var).all())):
            raise ValueError("statistics are not finite")
        count = as_float(state["count"], finite=True)
        if count is None or count < 0 or bool((var < 0).any()):
            raise ValueError("a count or a variance is negative, or the count not a number")
        self.mean = mean.to(torch.float64).clone()
        self.var = var.to(torch.float64).clone()
        self.count = count


class _Moments:
    """Sums of a rollout's values for one statistic: count, sum, sum of squares (float64)."""

    def __init__(self, shape: Sequence[int]) -> None:
        self.count = 0.0
        self.sum = torch.zeros(tuple(shape), dtype=torch.float64)
        self.sumsq = torch.zeros(tuple(shape), dtype=torch.float64)

    def add(self, values: torch.Tensor) -> None:
        x = values.detach().to("cpu", torch.float64).reshape(-1, *self.sum.shape)
        self.count += x.shape[0]
        self.sum += x.sum(0)
        self.sumsq += x.pow(2).sum(0)

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "sum": self.sum, "sumsq": self.sumsq}


def _merge_sums(stats: RunningMeanStd, sums: Mapping[str, Any]) -> None:
    count = float(sums["count"])
    if count <= 0:
        return
    mean = sums["sum"] / count
    var = (sums["sumsq"] / count - mean.pow(2)).clamp(min=0.0)
    stats.merge(count, mean, var)


class Normalizer:
    """The normalisation of one run: ``observation_space``'s float ``Box`` entries and rewards."""

    def __init__(self, observation_space: gym.spaces.Dict, settings: NormalizeSettings) -> None:
        self.settings = settings
        self.obs_keys = (
            [
                k
                for k, s in observation_space.spaces.items()
                if isinstance(s, gym.spaces.Box) and np.issubdtype(s.dtype, np.floating)
            ]
            if settings.observations
            else []
        )
        shapes = {
            k: tuple(cast(gym.spaces.Box, observation_space[k]).shape) for k in self.obs_keys
        }
        self.obs_stats = {k: RunningMeanStd(shapes[k]) for k in self.obs_keys}
        self.return_stats = RunningMeanStd(())
        self._obs_moments = {k: _Moments(shapes[k]) for k in self.obs_keys}
        self._return_moments = _Moments(())
        self._frozen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._reward_scale = 1.0
        self._freeze()

    @classmethod
    def build(
        cls, observation_space: gym.spaces.Dict, settings: NormalizeSettings | None
    ) -> Normalizer | None:
        """A normalizer, or None when ``settings`` normalise nothing."""
        if settings is None or not (settings.observations or settings.rewards):
            return None
        return cls(observation_space, settings)

    def _freeze(self) -> None:
        """Take the statistics the next rollout normalises with (float32 on the CPU)."""
        eps, self._frozen = self.settings.epsilon, {}
        for k, stats in self.obs_stats.items():
            std = torch.sqrt(stats.var + eps)
            self._frozen[k] = (stats.mean.float(), (1.0 / std).float())
        self._reward_scale = 1.0 / math.sqrt(float(self.return_stats.var) + eps)

    def observation_transform(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``{entry: (mean, 1 / std)}`` (float32) of the frozen statistics, for an export."""
        return {k: (mean.clone(), inv_std.clone()) for k, (mean, inv_std) in self._frozen.items()}

    def observations(self, obs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``obs`` with the float entries normalised (a new dict; other entries as they are)."""
        if not self.obs_keys:
            return dict(obs)
        out, clip = dict(obs), self.settings.clip
        for k, (mean, inv_std) in self._frozen.items():
            x = obs[k]
            out[k] = ((x - mean.to(x.device)) * inv_std.to(x.device)).clamp(-clip, clip)
        return out

    def record_observations(self, obs: Mapping[str, torch.Tensor]) -> None:
        """Count raw observations ``[N, ...]`` into this rollout's moments."""
        for k in self.obs_keys:
            self._obs_moments[k].add(obs[k])

    def rewards(
        self,
        rewards: torch.Tensor,
        returns: torch.Tensor,
        done: torch.Tensor,
        stage_gamma: float | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Scale a step's rewards ``[N]``; move the discounted returns ``[N]`` (float64) on.

        Each return accumulates ``gamma * return + reward`` and is counted into this rollout's
        moments, then restarts at 0 where ``done``. ``stage_gamma`` is used unless
        ``settings.gamma`` names one (a ValueError where neither does).
        """
        if not self.settings.rewards:
            return rewards, returns
        gamma = self.settings.gamma if self.settings.gamma is not None else stage_gamma
        if gamma is None:
            raise ValueError("reward normalisation needs a discount: normalize.gamma or a stage's")
        returns = returns * gamma + rewards.to(torch.float64)
        self._return_moments.add(returns)
        returns = torch.where(done.to(returns.device), torch.zeros_like(returns), returns)
        clip = self.settings.clip
        return (rewards * self._reward_scale).clamp(-clip, clip), returns

    def moments(self) -> dict[str, Any]:
        """The moments recorded since the last call (what a worker sends with its rollout)."""
        out = {
            "obs": {k: m.as_dict() for k, m in self._obs_moments.items()},
            "return": self._return_moments.as_dict(),
        }
        self._obs_moments = {k: _Moments(m.sum.shape) for k, m in self._obs_moments.items()}
        self._return_moments = _Moments(())
        return out

    def merge(self, moments: Sequence[Mapping[str, Any]], distributed: bool = False) -> None:
        """Merge rollouts' moments (in worker order) into the statistics; freeze them.

        ``distributed``: sum each one over every DDP rank first (a collective: every rank calls
        it with the same number of moments).
        """
        for part in moments:
            if distributed and is_distributed():
                part = _all_reduce_moments(part)
            for k, sums in part["obs"].items():
                _merge_sums(self.obs_stats[k], sums)
                _check_finite(self.obs_stats[k], f"observation {k!r}")
            if self.settings.rewards:
                _merge_sums(self.return_stats, part["return"])
                _check_finite(self.return_stats, "the discounted return")
        self._freeze()

    def commit(self, distributed: bool = False) -> None:
        """Merge this collector's own rollout moments (an in-process collector's update)."""
        self.merge([self.moments()], distributed)

    def state_dict(self) -> dict[str, Any]:
        """Settings and statistics (``weights_only``-safe)."""
        return {
            "settings": dataclasses.asdict(self.settings),
            "obs": {k: s.state_dict() for k, s in self.obs_stats.items()},
            "return": self.return_stats.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the statistics of :meth:`state_dict` (the settings are this object's)."""
        if set(state["obs"]) != set(self.obs_stats):
            raise ValueError(
                f"statistics of {sorted(state['obs'])}, expected {sorted(self.obs_stats)}"
            )
        for k, s in state["obs"].items():
            self.obs_stats[k].load_state_dict(s)
        self.return_stats.load_state_dict(state["return"])
        self._freeze()

    @classmethod
    def from_state(
        cls, observation_space: gym.spaces.Dict, state: Mapping[str, Any] | None
    ) -> Normalizer | None:
        """The normalizer a checkpoint saved (frozen for evaluation), or None if it has none."""
        if state is None:
            return None
        try:  # (the settings too are the file's: typed and ranged like the config's)
            settings = load_section(NormalizeSettings, state["settings"], "normalizer.settings")
            normalizer = cls(observation_space, settings)
            normalizer.load_state_dict(state)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise ValueError(
                f"the saved normalisation statistics are malformed ({type(e).__name__}: {e})"
            ) from e
        return normalizer


def _check_finite(stats: RunningMeanStd, what: str) -> None:
    """A :class:`NonFiniteError` if ``stats`` became NaN or infinite (values around 1e200)."""
    if not (bool(torch.isfinite(stats.mean).all()) and bool(torch.isfinite(stats.var).all())):
        raise NonFiniteError(
            f"normalize: the running statistics of {what} are not finite (mean "
            f"{stats.mean.max().item():.3g}, variance {stats.var.max().item():.3g}): the values "
            "are too large to normalise (squared, beyond float64); scale them in the task, or "
            "turn normalize off for them"
        )


def _all_reduce_moments(part: Mapping[str, Any]) -> dict[str, Any]:
    """``part``'s counts and sums summed over every rank (one collective)."""
    flat: list[float] = []
    layout: list[tuple[str | None, str, tuple[int, ...]]] = []
    for key, sums in [*part["obs"].items(), (None, part["return"])]:
        flat.append(float(sums["count"]))
        layout.append((key, "count", ()))
        for name in ("sum", "sumsq"):
            flat += sums[name].reshape(-1).tolist()
            layout.append((key, name, tuple(sums[name].shape)))
    summed = all_reduce_sum(flat)
    out: dict[str, Any] = {"obs": {}, "return": {}}
    i = 0
    for key, name, shape in layout:
        size = int(np.prod(shape)) if shape else 1
        values = summed[i : i + size]
        i += size
        target = out["return"] if key is None else out["obs"].setdefault(key, {})
        if name == "count":
            target[name] = values[0]
        else:
            target[name] = torch.tensor(values, dtype=torch.float64).reshape(shape)
    return out

"""The sampler interface the engine drives, and what one step returns (a ``TensorDict``)."""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from tensordict.utils import NestedKey

from rl.tasks.fields import StepField
from rl.utils.misc import evenly_distribute_count_into_bins


@dataclasses.dataclass
class EpisodeRecord:
    """One finished episode.

    Attributes:
        env_index: Global index of the environment that ran it.
        metrics: ``return``, ``length`` and the task's own ``info["episode_metrics"]``.
        episode_seed: The seed the episode was reset with (evaluation mode), else None.
    """

    env_index: int
    metrics: dict[str, float]
    episode_seed: int | None = None


STEP_KEYS = ("obs", "rewards", "terminated", "truncated", "paused")
"""The entries of every step ``TensorDict`` (besides the task's fields and ``final_obs``)."""

EPISODES = "episodes"
"""The entry of the episodes that ended in a step (:func:`episode_entries`)."""


def episode_entries(
    records: Sequence[EpisodeRecord], ended: torch.Tensor | np.ndarray
) -> TensorDict:
    """The episodes ``records`` as entries of a step: row ``i`` holds the one that ended there.

    ``ended``: ``[N]`` bool, the rows where an episode ended, one record each, in row order.
    Entries (batch ``[N]``, on ``ended``'s device): ``ended``, ``env_index`` (int64),
    ``seed`` (int64, -1 for none) and ``metrics`` (float64 by name, NaN where an episode has
    none of that name). Indexing the step indexes them with it: an episode is never dropped
    silently with a copy of the step.
    """
    on = ended.device if isinstance(ended, torch.Tensor) else torch.device("cpu")
    flags = ended.cpu().numpy() if isinstance(ended, torch.Tensor) else np.asarray(ended)
    n, rows = len(flags), np.flatnonzero(flags).tolist()
    if len(rows) != len(records):
        raise ValueError(f"{len(records)} episode records for {len(rows)} rows that ended")
    names = list(dict.fromkeys(k for r in records for k in r.metrics))
    # NumPy for these few rows, one table (metrics by name, then the ints), filled a row of
    # the step at a time: a torch call per value would cost more than the step's own
    # bookkeeping. Its rows are the entries (views).
    table = np.full((len(names), n), math.nan)
    ints = np.full((2, n), -1, dtype=np.int64)
    for row, record in zip(rows, records, strict=True):
        table[:, row] = [record.metrics.get(k, math.nan) for k in names]
        seed = record.episode_seed
        ints[:, row] = (record.env_index, -1 if seed is None else seed)
    metrics, index_seed = torch.from_numpy(table), torch.from_numpy(ints)
    flags_t = torch.from_numpy(np.array(flags, dtype=bool))
    if on.type != "cpu":
        metrics, index_seed, flags_t = metrics.to(on), index_seed.to(on), flags_t.to(on)
    size = torch.Size([n])
    columns = metrics.unbind(0)
    data: dict[NestedKey, Any] = {
        "ended": flags_t,
        "env_index": index_seed[0],
        "seed": index_seed[1],
        "metrics": TensorDict._new_unsafe(dict(zip(names, columns, strict=True)), batch_size=size),
    }
    return TensorDict._new_unsafe(data, batch_size=size)


def step_tensordict(
    obs: Mapping[str, np.ndarray],
    fields: Mapping[str, np.ndarray],
    *,
    rewards: np.ndarray | None = None,
    terminated: np.ndarray | None = None,
    truncated: np.ndarray | None = None,
    paused: np.ndarray | None = None,
    final_obs: Mapping[str, np.ndarray] | None = None,
    episodes: Sequence[EpisodeRecord] = (),
) -> TensorDict:
    """What a sampler returns: one ``TensorDict`` of batch ``[N]`` over NumPy rows (no copy).

    Entries (``torch`` tensors over the given arrays):

    - ``obs``: the observations to act on next, by key (nested). For an environment whose
      episode just ended it is already the first observation of its next episode (auto-reset).
    - the task's step fields (:mod:`rl.tasks.fields`), e.g. ``expert_actions``: what the
      environment reported with those observations.
    - after a step, ``rewards`` (float32), ``terminated`` and ``truncated`` (bool, never both)
      and ``paused`` (bool, evaluation mode: the environment ran out of episodes and leaves the
      active set after this step; its ``obs`` row is meaningless);
    - ``final_obs`` (nested, only in steps where an episode was truncated): the last
      observation of each truncated episode, so its value can be bootstrapped (other rows are
      zeros);
    - ``episodes`` (only in steps where an episode ended): the episodes that ended, one a row
      where ``terminated | truncated`` (:func:`episode_entries`, :func:`finished_episodes`).

    A reset's ``TensorDict`` holds ``obs`` and the task's fields only.
    """
    n = len(next(iter(obs.values())))
    data: dict[NestedKey, Any] = {
        "obs": TensorDict._new_unsafe(
            {k: torch.from_numpy(v) for k, v in obs.items()}, batch_size=torch.Size([n])
        )
    }
    for key, value in fields.items():
        data[key] = torch.from_numpy(value)
    for key, flags in (
        ("rewards", rewards), ("terminated", terminated), ("truncated", truncated),
        ("paused", paused),
    ):  # fmt: skip
        if flags is not None:
            data[key] = torch.from_numpy(flags)
    if final_obs:
        data["final_obs"] = TensorDict._new_unsafe(
            {k: torch.from_numpy(v) for k, v in final_obs.items()}, batch_size=torch.Size([n])
        )
    if episodes:
        assert terminated is not None and truncated is not None
        data[EPISODES] = episode_entries(episodes, np.logical_or(terminated, truncated))
    return TensorDict._new_unsafe(data, batch_size=torch.Size([n]))


def finished_episodes(step: TensorDict) -> list[EpisodeRecord]:
    """The episodes that ended in ``step`` (a sampler's step ``TensorDict``), in row order.

    Read from its ``episodes`` entries ([] where it has none: a reset, or no episode ended).
    """
    entries = step.get(EPISODES, None)
    return [] if entries is None else decode_episodes([entries])


def decode_episodes(entries: Sequence[TensorDict]) -> list[EpisodeRecord]:
    """The episodes of several steps' ``episodes`` entries, in step order, then row order.

    One decode for them all: a concatenation and one host copy a column, not a few each step
    (a rollout's recorder keeps its steps' entries and decodes them once). Steps whose
    episodes have other metric names than the first's are decoded by themselves.
    """
    if not entries:
        return []
    # Each entry's tensors read once (a TensorDict get per column and step would cost more).
    tops: list[dict[Any, Any]] = [dict(e.items()) for e in entries]
    metrics: list[dict[Any, Any]] = [dict(top["metrics"].items()) for top in tops]
    names = list(metrics[0])
    if len(entries) > 1 and any(list(m) != names for m in metrics):
        return [ep for e in entries for ep in decode_episodes([e])]

    def column(parts: list[torch.Tensor]) -> torch.Tensor:
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    rows = np.flatnonzero(column([top["ended"] for top in tops]).cpu().numpy())
    if len(rows) == 0:
        return []
    # One stack of the columns, one copy to the host, one list of these rows.
    index_seed = [column([top[k] for top in tops]) for k in ("env_index", "seed")]
    ints = torch.stack(index_seed).cpu().numpy()[:, rows].T.tolist()
    values: list[list[float]] = [[] for _ in ints]
    if names:
        table = torch.stack([column([m[k] for m in metrics]) for k in names])
        values = table.cpu().numpy()[:, rows].T.tolist()
    return [
        EpisodeRecord(
            env_index,
            {k: v for k, v in zip(names, row, strict=True) if v == v},  # (NaN: not this one's)
            None if seed < 0 else seed,
        )
        for (env_index, seed), row in zip(ints, values, strict=True)
    ]


def split_episode_seeds(episode_seeds: Sequence[int], num_envs: int) -> list[list[int]]:
    """Contiguous shares of the evaluation episodes, one per environment (every sampler's split).

    Args:
        episode_seeds: The evaluation episodes' seeds (at least one).
        num_envs: Environments wanted; capped at the number of episodes.

    Returns:
        ``min(num_envs, len(episode_seeds))`` shares, larger first.
    """
    if len(episode_seeds) == 0:
        raise ValueError("evaluation needs at least one episode")
    num_envs = min(num_envs, len(episode_seeds))
    counts = evenly_distribute_count_into_bins(len(episode_seeds), num_envs)
    bounds = np.cumsum([0, *counts])
    return [[int(s) for s in episode_seeds[bounds[i] : bounds[i + 1]]] for i in range(num_envs)]


# The most environments one sampler runs: far above any experiment (16 to 256), far below what
# exhausts memory before the first step (100,000 ran 176 s into a MemoryError).
MAX_NUM_ENVS = 4096


class Sampler(abc.ABC):
    """A batch of environments stepped together.

    Training mode auto-resets forever; evaluation mode (``episode_seeds`` given) runs each
    environment through its share of a fixed list of seeded episodes and then pauses it.
    """

    num_envs: int
    observation_space: gym.spaces.Dict
    action_space: gym.Space
    step_fields: dict[str, StepField]  # the task's per-step fields (rl.tasks.fields)

    @abc.abstractmethod
    def reset(self) -> TensorDict:
        """Reset every environment; return their first observations and fields, batch ``[N]``."""

    @abc.abstractmethod
    def step(self, actions: np.ndarray) -> TensorDict:
        """Step the active environments with ``actions`` (``[N_active, ...]``).

        Returns:
            The step (:func:`step_tensordict`), batch ``[N_active]`` as before the step.
        """

    @property
    @abc.abstractmethod
    def num_active(self) -> int:
        """Environments still running (all of them in training mode)."""

    def new_episodes(self) -> TensorDict:
        """Cut every environment's episode and start a new one (training mode).

        AllenAct's forced scene advance (``advance_scene_rollout_period``): the interrupted
        episodes are not reported as finished. Returns what :meth:`reset` returns.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot start new episodes on demand")

    @abc.abstractmethod
    def close(self) -> None:
        """Release the environments (idempotent)."""

    def state_dict(self) -> dict[str, Any]:
        """What is needed to restore the episodes in flight (for exact resume).

        The result must load with ``torch.load(weights_only=True)`` (plain containers, numbers,
        strings, tensors). Samplers that cannot do this keep this default, and a resumed run
        starts fresh episodes instead.

        Raises:
            NotImplementedError: This sampler cannot save its episodes in flight.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot save its episodes in flight (no state_dict); "
            "a resumed run starts fresh episodes"
        )

    def load_state_dict(self, state: dict[str, Any]) -> TensorDict:
        """Restore the episodes in flight saved by :meth:`state_dict` (instead of :meth:`reset`).

        Args:
            state: What :meth:`state_dict` returned, on a sampler built with the same arguments.

        Returns:
            What :meth:`reset` returns: the observations (and fields) the saved sampler was
            about to act on.

        Raises:
            NotImplementedError: This sampler cannot restore episodes.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot restore episodes in flight (no load_state_dict)"
        )

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

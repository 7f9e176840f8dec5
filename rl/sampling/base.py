"""The sampler interface the engine drives, what one step returns, and the loop that steps it.

A step is a ``TensorDict`` (:func:`step_tensordict`). Collection, evaluation on episode lists,
probe videos and expert trajectories all run through one loop, :func:`run_steps`: an
:class:`Actor` acts on a step, the sampler steps, and the actor makes the next step of the
result; everything an actor carries between steps (a recurrent state) is in its step.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from tensordict.utils import NestedKey

from rl.tasks.agents import AGENT_ACTIVE
from rl.tasks.fields import EXPERT_ACTIONS, StepField
from rl.utils.misc import evenly_distribute_count_into_bins


@dataclasses.dataclass
class EpisodeRecord:
    """One finished episode.

    Attributes:
        env_index: Global index of the environment that ran it.
        metrics: ``return``, ``length`` and the task's own ``info["episode_metrics"]``.
        episode_seed: Its reset seed in evaluation mode, else None.
    """

    env_index: int
    metrics: dict[str, float]
    episode_seed: int | None = None


EPISODES = "episodes"  # the step entry of the episodes that ended (episode_entries)


def episode_entries(
    records: Sequence[EpisodeRecord], ended: torch.Tensor | np.ndarray
) -> TensorDict:
    """``records`` as a step's entries, batch ``[N]``: row ``i`` holds the episode ended there.

    ``ended``: ``[N]`` bool, one record per true row, in row order. Entries (on ``ended``'s
    device): ``ended``, ``env_index`` (int64), ``seed`` (int64, -1: none) and ``metrics``
    (float64 by name, NaN where an episode lacks one). Being rows, they follow any indexing of
    the step, so no episode is silently dropped.
    """
    if isinstance(ended, torch.Tensor):  # (a copy: the entries never alias the caller's flags)
        on, flags = ended.device, ended.to("cpu", torch.bool, copy=True).numpy()
    else:
        on, flags = torch.device("cpu"), np.array(ended, dtype=bool)
    n, rows = len(flags), flags.nonzero()[0].tolist()
    if len(rows) != len(records):
        raise ValueError(f"{len(records)} episode records for {len(rows)} rows that ended")
    if len(records) == 1:
        names = list(records[0].metrics)
    else:
        names = list(dict.fromkeys(k for r in records for k in r.metrics))
    # Filled in NumPy, then viewed as tensors row by row: a torch call per value, or unbind(),
    # costs more than the rest of this function (np.full: a Python wrapper of these two calls).
    table = np.empty((len(names), n))
    table.fill(math.nan)
    ints = np.empty((2, n), dtype=np.int64)
    ints.fill(-1)
    for row, record in zip(rows, records, strict=True):
        metrics = record.metrics
        table[:, row] = [metrics.get(k, math.nan) for k in names]
        ints[0, row] = record.env_index
        if record.episode_seed is not None:
            ints[1, row] = record.episode_seed

    def tensor(values: np.ndarray) -> torch.Tensor:
        viewed = torch.from_numpy(values)
        return viewed if on.type == "cpu" else viewed.to(on)

    size = torch.Size([n])
    data: dict[NestedKey, Any] = {
        "ended": tensor(flags),
        "env_index": tensor(ints[0]),
        "seed": tensor(ints[1]),
        "metrics": TensorDict._new_unsafe(
            {k: tensor(table[j]) for j, k in enumerate(names)}, batch_size=size
        ),
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
    """What a sampler returns: a ``TensorDict`` of batch ``[N]`` viewing the arrays (no copy).

    - ``obs`` (nested by key): what to act on next; after an episode ended, already the next
      episode's first observation (auto-reset);
    - the task's step fields (:mod:`rl.tasks.fields`), reported with those observations;
    - after a step: ``rewards`` (float32), ``terminated`` and ``truncated`` (bool, never both),
      ``paused`` (bool, evaluation: out of episodes, the row leaves after this step and its
      ``obs`` is meaningless);
    - ``final_obs`` (only if an episode was truncated): each truncated episode's last
      observation, to bootstrap from (zeros elsewhere);
    - ``episodes`` (only if an episode ended): :func:`episode_entries`.

    A reset holds ``obs`` and the task's fields only.
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
    """The episodes that ended in a sampler's ``step``, in row order ([] for none)."""
    entries = step.get(EPISODES, None)
    return [] if entries is None else decode_episodes([entries])


def decode_episodes(entries: Sequence[TensorDict]) -> list[EpisodeRecord]:
    """The episodes of several steps' ``episodes`` entries, in step order, then row order.

    Decoded together (one host copy a column, not a few each step); steps whose metric names
    differ from the first's are decoded one by one.
    """
    if not entries:
        return []
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
    index_seed = [column([top[k] for top in tops]) for k in ("env_index", "seed")]
    ints = torch.stack(index_seed).cpu().numpy()[:, rows].T.tolist()
    values: list[list[float]] = [[] for _ in ints]
    if names:
        table = torch.stack([column([m[k] for m in metrics]) for k in names])
        values = table.cpu().numpy()[:, rows].T.tolist()
    return [
        EpisodeRecord(
            env_index,
            {k: v for k, v in zip(names, row, strict=True) if v == v},  # NaN: not this one's
            None if seed < 0 else seed,
        )
        for (env_index, seed), row in zip(ints, values, strict=True)
    ]


def split_episode_seeds(episode_seeds: Sequence[int], num_envs: int) -> list[list[int]]:
    """Contiguous shares of the evaluation episodes, larger first, one per environment.

    There are ``min(num_envs, len(episode_seeds))`` shares (at least one episode is required).
    """
    if len(episode_seeds) == 0:
        raise ValueError("evaluation needs at least one episode")
    num_envs = min(num_envs, len(episode_seeds))
    counts = evenly_distribute_count_into_bins(len(episode_seeds), num_envs)
    bounds = np.cumsum([0, *counts])
    return [[int(s) for s in episode_seeds[bounds[i] : bounds[i + 1]]] for i in range(num_envs)]


def check_state_layout(state: Mapping[str, Any], num_envs: int, env_offset: int) -> None:
    """Raise ValueError unless ``state`` is a sampler's of ``num_envs`` at ``env_offset``."""
    keys = ("num_envs", "env_offset")
    saved = [state.get(k) if isinstance(state, Mapping) else None for k in keys]
    if saved != [num_envs, env_offset] or any(isinstance(v, bool) for v in saved):
        raise ValueError(
            f"sampler state for {saved[0]!r:.20} envs at offset {saved[1]!r:.20}, "
            f"but this sampler has {num_envs} at offset {env_offset}"
        )


# Far above any experiment's 16-256 environments, far below what exhausts memory at startup.
MAX_NUM_ENVS = 4096


class Sampler(abc.ABC):
    """A batch of environments stepped together.

    Training mode auto-resets forever; evaluation mode (``episode_seeds`` given) runs each
    environment through its share of a fixed list of seeded episodes and then pauses it.
    """

    num_envs: int
    observation_space: gym.spaces.Dict
    action_space: gym.Space
    step_fields: dict[str, StepField]

    @abc.abstractmethod
    def reset(self) -> TensorDict:
        """Reset every environment; return their first observations and fields, batch ``[N]``."""

    @abc.abstractmethod
    def step(self, actions: np.ndarray) -> TensorDict:
        """Step the active environments with ``[N_active, ...]`` actions (:func:`step_tensordict`).

        The batch is the environments active before the step.
        """

    @property
    @abc.abstractmethod
    def num_active(self) -> int:
        """Environments still running (all of them in training mode)."""

    def new_episodes(self) -> TensorDict:
        """Cut every episode and start new ones, as :meth:`reset` (training mode).

        AllenAct's forced scene advance: the cut episodes are not reported as finished.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot start new episodes on demand")

    @abc.abstractmethod
    def close(self) -> None:
        """Release the environments (idempotent)."""

    def state_dict(self) -> dict[str, Any]:
        """What restores the episodes in flight (exact resume).

        It must load with ``torch.load(weights_only=True)``. Samplers that cannot save keep this
        default (NotImplementedError), and a resumed run starts fresh episodes.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot save its episodes in flight (no state_dict); "
            "a resumed run starts fresh episodes"
        )

    def load_state_dict(self, state: dict[str, Any]) -> TensorDict:
        """Restore :meth:`state_dict`'s episodes on a sampler built alike; replaces :meth:`reset`.

        Returns what :meth:`reset` does: what the saved sampler was about to act on.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot restore episodes in flight (no load_state_dict)"
        )

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ------------------------------------------------------------------ the step loop
class NoExpertError(ValueError):
    """The task gives no expert action (``info["expert_action"]``), so it cannot be evaluated."""


class Actor(Protocol):
    """What acts in the loop for the ``N`` environments of a sampler's step."""

    def start(self, first: TensorDict) -> TensorDict:
        """The actor's first step, of the sampler's reset ``first``."""
        ...

    def act(self, step: TensorDict) -> np.ndarray | torch.Tensor:
        """Actions ``[N, ...]`` for ``step``: NumPy, or a tensor on the sampler's device."""
        ...

    def next_step(
        self, step: TensorDict, result: TensorDict, keep: torch.Tensor | None
    ) -> TensorDict:
        """The step to act on next, from the sampler's ``result`` of acting on ``step``.

        ``keep``: ``[N]`` bool, the environments that stay (None: all).
        """
        ...


def steps_device(step: Mapping[str, Any]) -> torch.device:
    """Where a sampler's ``step`` lives (its observations'; NumPy: the CPU)."""
    first = next(iter(step["obs"].values()), None)
    return first.device if isinstance(first, torch.Tensor) else torch.device("cpu")


def actions_for(
    actions: torch.Tensor,
    steps_on: torch.device,
    to_host: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> np.ndarray | torch.Tensor:
    """``actions`` as a sampler whose steps live ``steps_on`` takes them.

    A sampler on the actions' accelerator takes the tensor where it is; any other takes NumPy
    (a view of a CPU tensor). ``to_host`` brings accelerator actions to the host (None:
    ``Tensor.cpu``).
    """
    if actions.device.type != "cpu":
        if steps_on == actions.device:
            return actions
        actions = actions.cpu() if to_host is None else to_host(actions)
    return actions.numpy()


def run_steps(
    sampler: Sampler,
    actor: Actor,
    step: TensorDict,
    on_step: Callable[[int, TensorDict, TensorDict], bool] | None = None,
    max_steps: int | None = None,
) -> TensorDict:
    """Run ``actor`` from ``step`` until no environment is active, ``max_steps`` or a stop.

    Args:
        sampler: The environments.
        actor: What acts.
        step: The actor's first step (from a reset, or a previous run's last step).
        on_step: ``on_step(t, step, result)`` after each step ``t`` (before paused
            environments leave); True ends the run.
        max_steps: Steps at most (None: until every environment is paused).

    Returns:
        The actor's next step, for a run that goes on.
    """
    t = 0
    while sampler.num_active and (max_steps is None or t < max_steps):
        # A tensor only for a sampler that takes tensors.
        result = sampler.step(actor.act(step))  # type: ignore[arg-type]
        stop = on_step is not None and on_step(t, step, result)
        # Fewer active than stepped: some paused (evaluation).
        keep = None if sampler.num_active == len(result) else ~result.get("paused")
        step = actor.next_step(step, result, keep)
        t += 1
        if stop:
            break
    return step


class ExpertActor:
    """The task's expert (its ``expert_actions`` step field) in a policy's place.

    Args:
        task: The task's name, for errors.
    """

    def __init__(self, task: str) -> None:
        self.task = task

    def act(self, step: Mapping[str, Any]) -> np.ndarray:
        """The expert's actions (a :class:`NoExpertError` where the task gives none)."""
        if EXPERT_ACTIONS not in step.keys():
            raise NoExpertError(
                f"task {self.task!r} declares no expert (the step field {EXPERT_ACTIONS!r}: "
                "step_fields = {'expert_actions': rl.tasks.fields.expert_field()} on the env "
                'class, reading info["expert_action"]); running the expert needs a task with one'
            )
        expert = step[EXPERT_ACTIONS]
        missing = expert < 0
        if AGENT_ACTIVE in step.keys():  # agents out of their episode act for nothing
            missing &= step[AGENT_ACTIVE]
            expert = expert.clamp(min=0)
        if missing.any():
            raise NoExpertError(
                f'task {self.task!r} gave no expert action (info["expert_action"]) at a step; '
                "running the expert needs one at every step"
            )
        return np.asarray(expert.cpu())  # a batched environment's may be on an accelerator

    def start(self, first: TensorDict) -> TensorDict:
        """The sampler's reset itself."""
        return first

    def next_step(
        self, step: TensorDict, result: TensorDict, keep: torch.Tensor | None = None
    ) -> TensorDict:
        """The sampler's result itself: nothing to carry."""
        return result if keep is None else result[keep]

"""Time-major rollout storage ``[T, N, ...]`` for on-policy training.

Index conventions: ``obs[t]`` is the observation the action at step ``t`` was taken on;
``episode_starts[t]`` marks ``obs[t]`` as the first of an episode (the recurrent state is reset
before it is processed); ``rewards[t]``, ``terminated[t]``, ``truncated[t]`` are what the
environment returned for that action; ``obs[T]`` / ``episode_starts[T]`` are the observation
after the rollout, used to bootstrap. ``hiddens[t]`` is the recurrent state the policy held
before processing ``obs[t]`` (before its reset at an episode start); ``hidden`` is ``hiddens[0]``.

Minibatches are sequences: whole rollouts of a subset of environments by default, or chunks of
``recurrence`` steps (truncated BPTT, Sample Factory's ``recurrence``), each starting from the
state stored at its first step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

import gymnasium as gym
import numpy as np
import torch

from rl.storage.advantages import compute_discounted_returns, compute_gae
from rl.utils.misc import evenly_distribute_count_into_bins


@dataclasses.dataclass
class RolloutBatch:
    """A minibatch of ``n`` sequences of ``T`` steps, time-major ``[T, n, ...]``.

    A sequence is a whole rollout of one environment, or a chunk of one (truncated BPTT).

    Attributes:
        obs: Observations by key, ``[T, n, *shape]``.
        episode_starts: ``[T, n]`` bool.
        hidden: ``[L, n, H]`` recurrent state before each sequence's first observation (as the
            rollout policy held it).
        actions: ``[T, n]`` actions taken (the expert's where teacher forcing chose it).
        old_logprobs: ``[T, n]`` log-probabilities of ``actions`` under the rollout policy.
        old_values: ``[T, n]`` value estimates from the rollout.
        advantages: ``[T, n]``.
        returns: ``[T, n]`` value targets.
        expert_actions: ``[T, n]`` expert's actions, -1 where the task gives none.
        advantage_stats: ``(mean, std)`` of the whole rollout's advantages (over every
            distributed worker); losses that normalise advantages use these instead of the
            minibatch's own when set (None: per-minibatch statistics).
    """

    obs: dict[str, torch.Tensor]
    episode_starts: torch.Tensor
    hidden: torch.Tensor
    actions: torch.Tensor
    old_logprobs: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    expert_actions: torch.Tensor
    advantage_stats: tuple[float, float] | None = None

    @property
    def num_samples(self) -> int:
        """``T * n``."""
        return self.actions.numel()


# Per-step fields, ``[T, N]`` each (observations and episode starts are ``[T + 1, N, ...]``,
# the recurrent states ``hiddens`` ``[T, L, N, H]``).
STEP_FIELDS = (
    "actions",
    "logprobs",
    "values",
    "rewards",
    "terminated",
    "truncated",
    "truncation_values",
    "expert_actions",
)


class RolloutStorage:
    """Fixed-capacity buffers for one rollout of ``num_envs`` environments.

    Args:
        num_steps: Capacity in time steps (a rollout may use fewer: see :meth:`reset`).
        num_envs: Number of environments (N).
        obs_shapes: Shape of each observation entry (without batch dims), by key.
        obs_dtypes: Torch dtype of each observation entry, by key.
        hidden_shape: ``(L, H)`` of the recurrent state, ``(0, 0)``-like for memoryless models.
        device: Where the buffers live.
    """

    def __init__(
        self,
        *,
        num_steps: int,
        num_envs: int,
        obs_shapes: Mapping[str, tuple[int, ...]],
        obs_dtypes: Mapping[str, torch.dtype],
        hidden_shape: tuple[int, int],
        device: torch.device | str = "cpu",
    ) -> None:
        self.capacity = num_steps
        self.num_envs = num_envs
        self.device = torch.device(device)
        t, n = num_steps, num_envs

        def zeros(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=self.device)

        self.obs = {k: zeros(t + 1, n, *obs_shapes[k], dtype=obs_dtypes[k]) for k in obs_shapes}
        self.episode_starts = zeros(t + 1, n, dtype=torch.bool)
        self.hiddens = zeros(t, hidden_shape[0], n, hidden_shape[1])
        self.actions = zeros(t, n, dtype=torch.long)
        self.logprobs = zeros(t, n)
        self.values = zeros(t, n)
        self.rewards = zeros(t, n)
        self.terminated = zeros(t, n, dtype=torch.bool)
        self.truncated = zeros(t, n, dtype=torch.bool)
        self.truncation_values = zeros(t, n)
        self.expert_actions = zeros(t, n, dtype=torch.long)
        self.advantages = zeros(t, n)
        self.returns = zeros(t, n)
        self.num_steps = num_steps
        self.step = 0
        # False once a step was inserted without its recurrent state (chunks cannot start there).
        self.hiddens_recorded = True
        # (mean, std) of the rollout's advantages handed to every minibatch (None: per-minibatch
        # normalisation); the distributed trainer sets global statistics here.
        self.advantage_stats: tuple[float, float] | None = None

    @classmethod
    def for_space(
        cls,
        *,
        num_steps: int,
        num_envs: int,
        observation_space: gym.spaces.Dict,
        hidden_shape: tuple[int, int],
        device: torch.device | str = "cpu",
    ) -> RolloutStorage:
        """A storage for observations of a (Dict) observation space."""
        spaces = observation_space.spaces
        return cls(
            num_steps=num_steps,
            num_envs=num_envs,
            obs_shapes={k: tuple(s.shape or ()) for k, s in spaces.items()},
            obs_dtypes={
                k: torch.from_numpy(np.zeros((), dtype=s.dtype)).dtype for k, s in spaces.items()
            },
            hidden_shape=hidden_shape,
            device=device,
        )

    @property
    def hidden(self) -> torch.Tensor:
        """``[L, N, H]`` recurrent state before ``obs[0]`` (``hiddens[0]``)."""
        return self.hiddens[0]

    def reset(self, num_steps: int | None = None) -> None:
        """Start a new rollout of ``num_steps`` (default: capacity) steps.

        A rollout may end after fewer steps (straggler preemption): everything downstream
        (returns, minibatches, :meth:`last_obs`) uses the :attr:`step` steps actually recorded.
        """
        num_steps = self.capacity if num_steps is None else num_steps
        if not 0 < num_steps <= self.capacity:
            raise ValueError(f"rollout length {num_steps} not in [1, {self.capacity}]")
        self.num_steps = num_steps
        self.step = 0
        self.hiddens_recorded = True
        self.advantage_stats = None

    def set_first(
        self, obs: Mapping[str, torch.Tensor], episode_starts: torch.Tensor, hidden: torch.Tensor
    ) -> None:
        """Record the observation and recurrent state the rollout starts from."""
        for k, v in obs.items():
            self.obs[k][0].copy_(v)
        self.episode_starts[0].copy_(episode_starts)
        self.hiddens[0].copy_(hidden)

    def insert(
        self,
        *,
        next_obs: Mapping[str, torch.Tensor],
        actions: torch.Tensor,
        logprobs: torch.Tensor,
        values: torch.Tensor,
        rewards: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        truncation_values: torch.Tensor,
        expert_actions: torch.Tensor,
        hidden: torch.Tensor | None = None,
    ) -> None:
        """Record one step: the action taken on ``obs[step]`` and what followed (``[N]`` each).

        ``hidden`` (``[L, N, H]``) is the recurrent state the policy held before ``obs[step]``;
        truncated-BPTT chunks start from it (None: not recorded; only whole-rollout
        minibatches can then be drawn).
        """
        t = self.step
        if t >= self.num_steps:
            raise RuntimeError(f"rollout storage is full ({self.num_steps} steps)")
        if hidden is None:
            self.hiddens_recorded = False
        elif t > 0:
            self.hiddens[t].copy_(hidden)
        self.actions[t].copy_(actions)
        self.logprobs[t].copy_(logprobs)
        self.values[t].copy_(values)
        self.rewards[t].copy_(rewards)
        self.terminated[t].copy_(terminated)
        self.truncated[t].copy_(truncated)
        self.truncation_values[t].copy_(truncation_values)
        self.expert_actions[t].copy_(expert_actions)
        for k, v in next_obs.items():
            self.obs[k][t + 1].copy_(v)
        self.episode_starts[t + 1].copy_(terminated | truncated)
        self.step = t + 1

    def write_envs(self, envs: slice, fields: Mapping[str, torch.Tensor]) -> None:
        """Copy a block of environments' recorded data into columns ``envs``.

        ``fields`` maps storage fields to tensors with the block's own length: ``obs/<key>``
        and ``episode_starts`` ``[T + 1, n, ...]``, ``hiddens`` ``[T, L, n, H]``, the per-step
        fields (``actions``, ``logprobs``, ...) ``[T, n]``; other keys are ignored. Used to
        assemble one rollout from several collectors' (call :meth:`reset` first and set
        :attr:`step` after).
        """
        for name, value in fields.items():
            if name.startswith("obs/"):
                target = self.obs[name[4:]]
            elif name in ("episode_starts", "hiddens", *STEP_FIELDS):
                target = getattr(self, name)
            else:
                continue
            if name == "hiddens":
                target[: value.shape[0], :, envs].copy_(value)
            else:
                target[: value.shape[0], envs].copy_(value)

    def last_obs(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``(obs[T], episode_starts[T])``: where the next rollout starts."""
        t = self.step
        return {k: v[t] for k, v in self.obs.items()}, self.episode_starts[t]

    def compute_returns(
        self, *, next_value: torch.Tensor, gamma: float, use_gae: bool, gae_lambda: float
    ) -> None:
        """Fill ``advantages`` and ``returns`` for the recorded steps."""
        t = self.step
        kwargs = dict(
            rewards=self.rewards[:t],
            values=self.values[:t],
            next_value=next_value,
            terminated=self.terminated[:t],
            truncated=self.truncated[:t],
            truncation_values=self.truncation_values[:t],
            gamma=gamma,
        )
        if use_gae:
            adv, ret = compute_gae(**kwargs, gae_lambda=gae_lambda)
        else:
            adv, ret = compute_discounted_returns(**kwargs)
        self.advantages[:t] = adv
        self.returns[:t] = ret

    def sequence_length(self, recurrence: int) -> int:
        """Length of the minibatch sequences for BPTT chunks of ``recurrence`` steps.

        ``0`` (or a chunk at least as long as the rollout) gives whole rollouts. A rollout
        whose length ``recurrence`` does not divide (one a straggler rule cut short) gets the
        longest chunk up to ``recurrence`` that does.
        """
        t = self.step
        if recurrence <= 0 or recurrence >= t:
            return t
        return next(r for r in range(recurrence, 0, -1) if t % r == 0)

    def minibatches(
        self,
        num_mini_batch: int,
        generator: torch.Generator | None = None,
        recurrence: int = 0,
    ) -> Iterator[RolloutBatch]:
        """Yield ``num_mini_batch`` minibatches of sequences drawn at random without replacement.

        With ``recurrence=0`` a sequence is a whole rollout of one environment and the update
        re-runs the RNN from the rollout's first state (exact full-sequence BPTT). Otherwise
        the rollout is cut into chunks of :meth:`sequence_length` steps, each starting from the
        recurrent state stored at its first step (truncated BPTT).
        """
        length = self.sequence_length(recurrence)
        if length < self.step and not self.hiddens_recorded:
            raise ValueError(
                f"recurrence={recurrence}: this rollout was recorded without per-step recurrent "
                "states (insert(hidden=...)), so BPTT chunks have no state to start from; "
                "record them or use recurrence=0"
            )
        num_sequences = self.num_envs * (self.step // length)
        if num_mini_batch > num_sequences:
            raise ValueError(
                f"num_mini_batch={num_mini_batch} > {num_sequences} sequences "
                f"({self.num_envs} environments x {self.step // length} chunks of {length} "
                "steps): minibatches are split by sequence"
            )
        perm = torch.randperm(num_sequences, generator=generator).to(self.device)
        start = 0
        for size in evenly_distribute_count_into_bins(num_sequences, num_mini_batch):
            chosen = perm[start : start + size]
            start += size
            if length == self.step:
                yield self.batch(chosen)
            else:
                yield self._chunk_batch(chosen, length)

    def _chunk_batch(self, sequences: torch.Tensor, length: int) -> RolloutBatch:
        """The chunks ``sequences`` (numbered chunk-major: ``chunk * num_envs + env``)."""
        envs = sequences % self.num_envs
        starts = (sequences // self.num_envs) * length  # [n]
        times = starts + torch.arange(length, device=self.device).unsqueeze(1)  # [T, n]
        return RolloutBatch(
            obs={k: v[times, envs] for k, v in self.obs.items()},
            episode_starts=self.episode_starts[times, envs],
            hidden=self.hiddens[starts, :, envs].transpose(0, 1),
            actions=self.actions[times, envs],
            old_logprobs=self.logprobs[times, envs],
            old_values=self.values[times, envs],
            advantages=self.advantages[times, envs],
            returns=self.returns[times, envs],
            expert_actions=self.expert_actions[times, envs],
            advantage_stats=self.advantage_stats,
        )

    def batch(self, env_indices: torch.Tensor) -> RolloutBatch:
        """All recorded steps of the environments ``env_indices``."""
        t = self.step
        idx = env_indices
        return RolloutBatch(
            obs={k: v[:t, idx] for k, v in self.obs.items()},
            episode_starts=self.episode_starts[:t, idx],
            hidden=self.hidden[:, idx],
            actions=self.actions[:t, idx],
            old_logprobs=self.logprobs[:t, idx],
            old_values=self.values[:t, idx],
            advantages=self.advantages[:t, idx],
            returns=self.returns[:t, idx],
            expert_actions=self.expert_actions[:t, idx],
            advantage_stats=self.advantage_stats,
        )

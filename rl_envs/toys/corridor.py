"""A corridor task written twice: one gymnasium environment, and N of them at once in torch.

:class:`CorridorEnv` and :class:`BatchedCorridor` are the same task, step for step: the first
is what :class:`~rl.sampling.SerialSampler` steps, the second a
:class:`~rl.tasks.batched.BatchedEnv` (no per-environment Python in a step, on any device), and
``CorridorEnv.batched_env`` names it, so ``sampler=batched`` steps the batched twin of a task
whose ``_target_`` is ``CorridorEnv``. They are the tests' reference that a batched sampler
returns what the serial one does, and a small example of a batched environment.

The agent walks a corridor of ``length`` cells: actions ``0`` (left), ``1`` (stay), ``2``
(right). Reaching the last cell terminates the episode (reward 1), any other step costs
0.125; ``max_steps`` truncates it. Observations: ``state`` (float32 ``[cell, step]``) and
``cell`` (``Discrete(length)``). Step fields: ``expert_actions`` (always right) and ``moved``
(a transition field: the step's change of cell). Episode metrics: ``success`` and ``start``.
Each episode starts at a cell drawn from the environment's own random stream, a 31-bit linear
congruential generator that a seeded reset reseeds: integer arithmetic that both versions
compute exactly (``CorridorEnv`` saves it as its reset state, so resume is exact).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from rl.tasks.batched import EPISODE_KEY, BatchedEnv
from rl.tasks.fields import EXPERT_ACTIONS, StepField, expert_field
from rl.utils.finite import as_count
from rl.utils.saved import saved_tensor

__all__ = ["BatchedCorridor", "CorridorEnv"]

_MOD = 2**31
_MUL, _ADD = 1103515245, 12345
_STEP_REWARD, _GOAL_REWARD = -0.125, 1.0
RIGHT = 2

STEP_FIELDS: dict[str, StepField] = {
    EXPERT_ACTIONS: expert_field(),
    "moved": StepField("moved", dtype="float32", transition=True),
}


def _spaces(length: int) -> tuple[gym.spaces.Dict, gym.spaces.Discrete]:
    observations = gym.spaces.Dict(
        {
            "state": gym.spaces.Box(0.0, np.inf, shape=(2,), dtype=np.float32),
            "cell": gym.spaces.Discrete(length),
        }
    )
    return observations, gym.spaces.Discrete(3)


class CorridorEnv(gym.Env):
    """One corridor (see the module docstring).

    Args:
        length: Cells (at least 2); episodes start on one of the first ``length - 1``.
        max_steps: Truncation limit.
        nan_start: The reward of step 2 of an episode that starts on this cell is NaN (for
            the finite checks' tests; None: never).
    """

    batched_env: ClassVar[str] = "rl_envs.toys.corridor.BatchedCorridor"
    step_fields: ClassVar[dict[str, StepField]] = STEP_FIELDS
    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, *, length: int = 6, max_steps: int = 8, nan_start: int | None = None):
        if length < 2:
            raise ValueError(f"a corridor needs at least 2 cells, got {length}")
        self.length, self.max_steps, self.nan_start = length, max_steps, nan_start
        self.observation_space, self.action_space = _spaces(length)
        self._rng = 0
        self._cell = self._t = self._start = 0

    def _obs(self) -> dict[str, Any]:
        return {"state": np.array([self._cell, self._t], dtype=np.float32), "cell": self._cell}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start on a cell drawn from the environment's stream (reseeded by ``seed``)."""
        super().reset(seed=seed)
        if seed is not None:
            self._rng = seed % _MOD
        self._rng = (self._rng * _MUL + _ADD) % _MOD
        self._start = self._cell = self._rng % (self.length - 1)
        self._t = 0
        return self._obs(), {"expert_action": RIGHT}

    def step(self, action: int) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Move left, stay or move right."""
        old = self._cell
        self._cell = min(max(old + int(action) - 1, 0), self.length - 1)
        self._t += 1
        terminated = self._cell == self.length - 1
        truncated = self._t >= self.max_steps and not terminated
        reward = _GOAL_REWARD if terminated else _STEP_REWARD
        if self._start == self.nan_start and self._t == 2:
            reward = float("nan")
        info: dict[str, Any] = {"expert_action": RIGHT, "moved": float(self._cell - old)}
        if terminated or truncated:
            info["episode_metrics"] = {"success": float(terminated), "start": float(self._start)}
        return self._obs(), reward, terminated, truncated, info

    def reset_state(self) -> dict[str, Any]:
        """The random stream's state (what an unseeded reset depends on)."""
        return {"rng": self._rng}

    def set_reset_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`reset_state` (from a file: checked)."""
        rng = state["rng"]
        if as_count(rng, 0, _MOD) is None:
            raise ValueError(f"'rng': expected an int in [0, {_MOD}), got {rng!r:.40}")
        self._rng = rng


class BatchedCorridor(BatchedEnv):
    """``num_envs`` corridors on ``device``, stepped together (:class:`CorridorEnv`'s twin).

    Args:
        num_envs: How many.
        device: Where they live.
        length: Cells.
        max_steps: Truncation limit.
        nan_start: As :class:`CorridorEnv`'s.
    """

    def __init__(
        self,
        *,
        num_envs: int,
        device: torch.device | str,
        length: int = 6,
        max_steps: int = 8,
        nan_start: int | None = None,
    ) -> None:
        if length < 2:
            raise ValueError(f"a corridor needs at least 2 cells, got {length}")
        self.num_envs, self.device = num_envs, torch.device(device)
        self.length, self.max_steps, self.nan_start = length, max_steps, nan_start
        self.observation_space, self.action_space = _spaces(length)
        self.step_fields = dict(STEP_FIELDS)
        zeros = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        # Each corridor's random stream, cell, step of its episode and start cell
        self.rng, self.cell, self.t, self.start = (zeros.clone() for _ in range(4))

    def _seeds(self, seeds: Sequence[int | None]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(seed mod 2**31, whether given)`` per environment, on the device."""
        values = [-1 if s is None else int(s) % _MOD for s in seeds]
        tensor = torch.tensor(values, dtype=torch.int64, device=self.device)
        return tensor, tensor >= 0

    def _start_episodes(self, rows: torch.Tensor, seeds: Sequence[int | None] | None) -> None:
        """New episodes in ``rows`` ([N] bool), reseeded where a seed is given."""
        rng = self.rng
        if seeds is not None:
            values, given = self._seeds(seeds)
            rng = torch.where(rows & given, values, rng)
        rng = torch.where(rows, (rng * _MUL + _ADD) % _MOD, rng)
        self.rng = rng
        self.start = torch.where(rows, rng % (self.length - 1), self.start)
        self.cell = torch.where(rows, self.start, self.cell)
        self.t = torch.where(rows, 0, self.t)

    def _obs(self) -> TensorDict:
        state = torch.stack([self.cell, self.t], 1).to(torch.float32)
        return TensorDict._new_unsafe(
            {"state": state, "cell": self.cell}, batch_size=torch.Size([self.num_envs])
        )

    def _observed(self) -> dict[Any, Any]:
        """The observations and the fields that come with them."""
        return {
            "obs": self._obs(),
            EXPERT_ACTIONS: torch.full_like(self.cell, RIGHT),
            "moved": torch.zeros(self.num_envs, dtype=torch.float32, device=self.device),
        }

    def reset(self, seeds: Sequence[int | None]) -> TensorDict:
        """Start every corridor's episode (each with its seed, or its own stream)."""
        every = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        self._start_episodes(every, seeds)
        return TensorDict._new_unsafe(self._observed(), batch_size=torch.Size([self.num_envs]))

    def step(
        self, actions: torch.Tensor, next_seeds: Sequence[int | None] | None = None
    ) -> TensorDict:
        """Move every agent; the corridors whose episode ended start the next at once."""
        old = self.cell
        self.cell = torch.clamp(old + actions - 1, 0, self.length - 1)
        self.t = self.t + 1
        terminated = self.cell == self.length - 1
        truncated = (self.t >= self.max_steps) & ~terminated
        rewards = torch.where(terminated, _GOAL_REWARD, _STEP_REWARD).to(torch.float32)
        if self.nan_start is not None:
            poisoned = (self.start == self.nan_start) & (self.t == 2)
            rewards = torch.where(poisoned, torch.nan, rewards)
        moved = (self.cell - old).to(torch.float32)
        done = terminated | truncated
        last = self._obs()
        final = last.apply(lambda v: torch.where(_rows(truncated, v), v, torch.zeros_like(v)))
        episode: dict[Any, Any] = {
            "success": terminated.to(torch.float32),
            "start": self.start.to(torch.float32),
        }
        self._start_episodes(done, next_seeds)
        n = torch.Size([self.num_envs])
        data: dict[Any, Any] = {
            **self._observed(),
            "moved": moved,
            "rewards": rewards,
            "terminated": terminated,
            "truncated": truncated,
            "final_obs": final,
            EPISODE_KEY: TensorDict._new_unsafe(episode, batch_size=n),
        }
        return TensorDict._new_unsafe(data, batch_size=n)

    def state_dict(self) -> dict[str, Any]:
        """Every corridor's cell, step, start and random stream."""
        return {k: getattr(self, k).cpu().clone() for k in ("rng", "cell", "t", "start")}

    def load_state_dict(self, state: dict[str, Any]) -> TensorDict:
        """Restore :meth:`state_dict`; what the saved corridors were about to act on.

        Raises:
            ValueError: A value of another kind, size or range (it may come from a file).
        """
        highs = {"rng": _MOD, "cell": self.length, "t": self.max_steps, "start": self.length - 1}
        n = (self.num_envs,)
        saved = {k: saved_tensor(state, k, n, torch.int64, 0, high) for k, high in highs.items()}
        for key, value in saved.items():
            setattr(self, key, value.to(self.device, copy=True))
        return TensorDict._new_unsafe(self._observed(), batch_size=torch.Size([self.num_envs]))


def _rows(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``rows`` ([N] bool) shaped to broadcast against ``like`` ([N, ...])."""
    return rows.reshape(-1, *([1] * (like.dim() - 1)))

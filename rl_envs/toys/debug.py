"""Debug environments for sampler tests: a tiny counter task that can fail on purpose.

:class:`FaultyEnv` behaves normally until the environment that was first reset with
``fail_seed`` reaches its ``fail_at_step``-th step (counted over its whole life, across
auto-resets); it then raises, exits the process with ``os._exit``, kills itself with
``SIGSEGV`` or ``SIGKILL``, hangs, or returns a NaN reward or observation, as chosen.
Samplers seed environment ``i`` with ``env_seeds(num_envs, seed)[i]``, so a test picks the
failing environment by its seed.
:class:`SlowEnv` is the same counter task sleeping ``delay`` seconds per step (a straggler for
distributed preemption tests). The module is importable in worker processes (no torch, no
state at import time).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, ClassVar, Literal

import gymnasium as gym
import numpy as np

from rl.tasks.fields import EXPERT_ACTIONS, StepField, expert_field

__all__ = ["FaultyEnv", "SlowEnv"]

FailureMode = Literal["raise", "exit", "segfault", "kill", "hang", "nan_reward", "nan_obs"]
_MODES = ("raise", "exit", "segfault", "kill", "hang", "nan_reward", "nan_obs")


class FaultyEnv(gym.Env):
    """A counter environment that fails on purpose.

    Observation: ``[3]`` float32 ``(step in episode, episode seed mod 1000, last action)``.
    Actions: ``Discrete(2)``. Reward 1 per step; the episode terminates after action 1 at an
    even step and is truncated at ``max_steps``. ``info["expert_action"]`` is always 0.

    Args:
        fail_seed: The environment first reset with this seed fails (None: never fails).
        fail_at_step: Fail on this step of that environment's life (1 = its first step).
        mode: ``raise`` (a ``ValueError``), ``exit`` (``os._exit(3)``), ``segfault``
            (``SIGSEGV``), ``kill`` (``SIGKILL``), ``hang`` (sleeps ``hang_seconds``), or
            ``nan_reward`` / ``nan_obs`` (that one step returns a NaN reward / observation).
        fail_on_reset: Fail in the first ``reset`` with ``fail_seed`` instead of a step.
        max_steps: Truncation limit.
        hang_seconds: How long ``hang`` sleeps.
    """

    # a constant expert (always 0), recorded as the rollout field expert_actions
    step_fields: ClassVar[dict[str, StepField]] = {EXPERT_ACTIONS: expert_field()}

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        *,
        fail_seed: int | None = None,
        fail_at_step: int = 1,
        mode: FailureMode = "raise",
        fail_on_reset: bool = False,
        max_steps: int = 10,
        hang_seconds: float = 3600.0,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"unknown failure mode {mode!r}")
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.fail_seed = fail_seed
        self.fail_at_step = fail_at_step
        self.mode = mode
        self.fail_on_reset = fail_on_reset
        self.max_steps = max_steps
        self.hang_seconds = hang_seconds
        self._doomed = False
        self._life_steps = 0
        self._t = 0
        self._episode_seed = 0

    def _fail(self, where: str) -> None:
        if self.mode == "raise":
            raise ValueError(f"FaultyEnv failed on purpose at {where}")
        if self.mode == "exit":
            os._exit(3)
        if self.mode == "segfault":
            # Default action (die): libraries such as pygame install SIGSEGV handlers.
            signal.signal(signal.SIGSEGV, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(self.hang_seconds)

    def _obs(self, action: int) -> np.ndarray:
        return np.array([self._t, self._episode_seed % 1000, action], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode; the first seeded reset decides whether this env is doomed."""
        super().reset(seed=seed)
        if seed is not None and self.fail_seed is not None and seed == self.fail_seed:
            self._doomed = True
            if self.fail_on_reset:
                self._fail("reset")
        self._episode_seed = seed if seed is not None else int(self.np_random.integers(1000))
        self._t = 0
        return self._obs(-1), {"expert_action": 0}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Advance the counter; fail if this is the chosen step of the doomed env."""
        self._life_steps += 1
        poison = self._doomed and self._life_steps == self.fail_at_step
        if poison and not self.mode.startswith("nan_"):
            self._fail(f"step {self._life_steps}")
        self._t += 1
        terminated = action == 1 and self._t % 2 == 0
        truncated = self._t >= self.max_steps
        info: dict[str, Any] = {"expert_action": 0}
        if terminated or truncated:
            info["episode_metrics"] = {"seed_mod": float(self._episode_seed % 1000)}
        obs, reward = self._obs(int(action)), 1.0
        if poison and self.mode == "nan_reward":
            reward = float("nan")
        elif poison:
            obs[2] = np.nan
        return obs, reward, bool(terminated), bool(truncated), info


class SlowEnv(FaultyEnv):
    """:class:`FaultyEnv` (never failing) that sleeps ``delay`` seconds in every step.

    Args:
        delay: Seconds per step.
        max_steps: Truncation limit.
        slow_seed: Only the environment first reset with this seed is slow (None: all are).
    """

    def __init__(
        self, *, delay: float = 0.0, max_steps: int = 10, slow_seed: int | None = None
    ) -> None:
        super().__init__(max_steps=max_steps)
        self.delay = delay
        self.slow_seed = slow_seed
        self._slow = slow_seed is None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode; the first seeded reset decides whether this env is slow."""
        if seed is not None and seed == self.slow_seed:
            self._slow = True
        return super().reset(seed=seed, options=options)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Sleep (if slow), then advance the counter."""
        if self._slow and self.delay > 0:
            time.sleep(self.delay)
        return super().step(action)

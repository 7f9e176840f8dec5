"""Per-step fields a task reports in ``info``: declared once, carried to the losses.

A task declares the :class:`StepField` s that reach the rollout, by field name, on its
environment class (``step_fields``) or in its config's ``step_fields``, which adds to and
overrides the class's. How samplers read them: docs/howto/add-a-task.md ("step fields").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = [
    "EXPERT_ACTIONS",
    "RESERVED_FIELDS",
    "StepField",
    "declared_step_fields",
    "expert_field",
    "step_fields_of",
]

# The rollout field of the task's expert actions (imitation losses, teacher forcing).
EXPERT_ACTIONS = "expert_actions"

# Names the framework uses itself in a sampler's step or in the rollout.
RESERVED_FIELDS = frozenset(
    {
        "obs", "rewards", "terminated", "truncated", "paused", "final_obs", "episodes",
        "actions", "logprobs", "values", "truncation_values", "episode_starts", "state",
        "advantages", "returns",
    }
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class StepField:
    """One value per step that a task reports in ``info``.

    Attributes:
        info: The ``info`` key holding it.
        shape: Its shape (``()``: a scalar).
        dtype: Its NumPy dtype.
        missing: The value recorded where ``info`` lacks the key.
        transition: A value of the step, like the reward (read from the step's own ``info``,
            also where the episode ended; ``missing`` after a reset), not of the observation
            (recorded beside the action taken on it).
    """

    info: str
    shape: tuple[int, ...] = ()
    dtype: str = "float32"
    missing: float = 0.0
    transition: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype).str)

    def empty(self, n: int) -> np.ndarray:
        """``[n, *shape]`` rows filled with :attr:`missing`."""
        return np.full((n, *self.shape), self.missing, dtype=self.dtype)


def expert_field() -> StepField:
    """``info["expert_action"]`` (one discrete action), -1 where the task gives none."""
    return StepField("expert_action", dtype="int64", missing=-1)


def step_fields_of(task: Mapping[str, Any], env: gym.Env, name: str) -> dict[str, StepField]:
    """The step fields of ``task``: ``env``'s class's, then its config's (``name`` in errors)."""
    return declared_step_fields(task, getattr(env.unwrapped, "step_fields", None), name)


def declared_step_fields(
    task: Mapping[str, Any], declared: Mapping[str, Any] | None, name: str
) -> dict[str, StepField]:
    """The step fields of ``task``: ``declared`` (an environment class's), then its config's."""
    specs: dict[str, Any] = dict(declared or {})
    own = task.get("step_fields") or {}
    if not isinstance(own, Mapping):
        raise ValueError(f"task {name!r}: step_fields is a {type(own).__name__}, not a mapping")
    specs.update(own)
    fields: dict[str, StepField] = {}
    for key, spec in specs.items():
        where = f"task {name!r}: step field {key!r}"
        if key in RESERVED_FIELDS:
            raise ValueError(f"{where} is a name the framework uses; choose another")
        if isinstance(spec, StepField):
            fields[key] = spec
            continue
        if not isinstance(spec, Mapping) or "info" not in spec:
            raise ValueError(
                f"{where}: expected a StepField or a mapping with an 'info' key ({{info: ..., "
                f"shape: [...], dtype: ..., missing: ..., transition: ...}}), got {spec!r}"
            )
        unknown = set(spec) - {"info", "shape", "dtype", "missing", "transition"}
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}")
        try:
            fields[key] = StepField(**dict(spec))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from e
    return fields

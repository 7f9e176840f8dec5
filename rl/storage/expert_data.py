"""Stored expert trajectories for off-policy updates (e.g. offline behaviour cloning).

:func:`generate_expert_trajectories` records a task's expert on seeded episodes into a ``.npz``;
:class:`ExpertTrajectoryIterator` yields endless time-major windows of it. Command line:
``python -m rl.storage.expert_data``.
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rl.sampling.base import ExpertActor, run_steps
from rl.sampling.serial import SerialSampler
from rl.tasks.fields import EXPERT_ACTIONS
from rl.utils.config import MAX_EPISODES, Check, ConfigError
from rl.utils.files import write_atomic


def expert_batch(
    obs: Mapping[str, torch.Tensor],
    episode_starts: torch.Tensor,
    expert_actions: torch.Tensor,
    steps: torch.Tensor,
) -> TensorDict:
    """A window of expert steps as a ``[T, B]`` ``TensorDict`` (what losses read).

    ``obs`` entries are ``[T, B, *shape]``; ``steps`` are the steps' indices in the file.
    """
    return TensorDict(
        {
            "obs": dict(obs),
            "episode_starts": episode_starts,
            "expert_actions": expert_actions,
            "steps": steps,
        },
        batch_size=episode_starts.shape,
    )


def generate_expert_trajectories(
    *, task: Mapping[str, Any], num_episodes: int, seed: int, path: str | Path
) -> Path:
    """Run the task's expert on ``num_episodes`` seeded episodes and save them to ``path``.

    Args:
        task: Plain task config whose env reports ``info["expert_action"]``.
        num_episodes: Episodes to record, in ``[1, MAX_EPISODES]`` (else ConfigError, checked
            first); episode ``i`` resets with seed ``seed + i``.
        seed: First episode seed.
        path: Output ``.npz`` (written atomically).
    """
    if not isinstance(num_episodes, int) or isinstance(num_episodes, bool):
        raise ConfigError(f"generate.num_episodes: expected an int, got {num_episodes!r}")
    if (problem := Check(ge=1, le=MAX_EPISODES).problem(num_episodes)) is not None:
        raise ConfigError(f"generate.num_episodes: {problem}")
    steps: dict[str, list[np.ndarray]] = {}
    actions: list[int] = []
    starts: list[bool] = [True]  # whether each recorded step starts an episode

    def record(t: int, step: TensorDict, result: TensorDict) -> bool:
        for key, value in step["obs"].items():
            steps.setdefault(key, []).append(value[0].numpy())
        actions.append(int(step[EXPERT_ACTIONS][0]))
        starts.append(bool(result["terminated"][0] | result["truncated"][0]))
        return False

    episodes = [seed + i for i in range(num_episodes)]
    expert = ExpertActor(str(task.get("_target_")))
    with SerialSampler(task=task, num_envs=1, episode_seeds=episodes) as sampler:
        run_steps(sampler, expert, expert.start(sampler.reset()), record)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"obs/{k}": np.stack(v) for k, v in steps.items()}
    arrays["expert_action"] = np.asarray(actions, dtype=np.int64)
    arrays["episode_start"] = np.asarray(starts[:-1], dtype=bool)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
    write_atomic(path, buffer.getvalue())
    return path


class ExpertTrajectoryIterator:
    """Endless minibatches of random ``seq_len``-step windows from an expert-trajectory file.

    Each window's first step is marked an episode start, so the recurrent state starts there.

    Args:
        path: The ``.npz`` written by :func:`generate_expert_trajectories`.
        batch_size: Windows per minibatch (B).
        seq_len: Steps per window (T).
        seed: Seed of the window sampler.
        generate: A missing file is generated with these arguments of
            :func:`generate_expert_trajectories`; None makes it an error (always, in a resumed
            run: it never generates data).
    """

    def __init__(
        self,
        *,
        path: str,
        batch_size: int = 16,
        seq_len: int = 32,
        seed: int = 0,
        generate: Mapping[str, Any] | None = None,
    ) -> None:
        file = Path(path)
        if not file.is_file():
            if generate is None:
                raise FileNotFoundError(
                    f"expert trajectories {file} not found; create them with "
                    f"`python -m rl.storage.expert_data --out {file}`, or set `generate` (a "
                    "resumed run never generates data; its path is the command's: type the "
                    "path the run was trained with, "
                    "pipeline.stages.N.offpolicy_component.data_iterator.path=FILE)"
                )
            generate_expert_trajectories(**generate, path=file)
        with np.load(file) as data:
            self.obs = {
                k[4:]: torch.from_numpy(data[k]) for k in data.files if k.startswith("obs/")
            }
            self.expert_actions = torch.from_numpy(data["expert_action"])
            self.episode_starts = torch.from_numpy(data["episode_start"])
        self.num_steps = int(self.expert_actions.shape[0])
        if self.num_steps < seq_len:
            raise ValueError(f"{file} holds {self.num_steps} steps, fewer than seq_len={seq_len}")
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self.window = (0, self.num_steps)  # the steps this iterator's windows lie in

    def shard(self, rank: int, world_size: int) -> None:
        """Draw only from the ``rank``-th contiguous block of the steps, seeded ``seed + rank``.

        Raises:
            ValueError: A block is shorter than ``seq_len``.
        """
        lo = rank * self.num_steps // world_size
        hi = (rank + 1) * self.num_steps // world_size
        if hi - lo < self.seq_len:
            raise ValueError(
                f"{world_size} workers: a share of {hi - lo} expert steps is shorter than "
                f"seq_len={self.seq_len}; record more episodes"
            )
        self.window = (lo, hi)
        self.generator = torch.Generator().manual_seed(self.seed + rank)

    def __iter__(self) -> Iterator[TensorDict]:
        return self

    def __next__(self) -> TensorDict:
        lo, hi = self.window
        starts = lo + torch.randint(
            0, hi - lo - self.seq_len + 1, (self.batch_size,), generator=self.generator
        )
        idx = starts.unsqueeze(0) + torch.arange(self.seq_len).unsqueeze(1)  # [T, B]
        episode_starts = self.episode_starts[idx].clone()
        episode_starts[0] = True
        return expert_batch(
            obs={k: v[idx] for k, v in self.obs.items()},
            episode_starts=episode_starts,
            expert_actions=self.expert_actions[idx],
            steps=idx,
        )


def main() -> None:
    """``python -m rl.storage.expert_data --out FILE [--episodes N] [--size 19]``."""
    parser = argparse.ArgumentParser(description="Record PointNav expert trajectories.")
    parser.add_argument("--out", required=True)
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=int, default=19)
    parser.add_argument("--rooms-per-side", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=100)
    args = parser.parse_args()
    task = {
        "_target_": "rl_envs.pointnav.PointNavEnv",
        "size": args.size,
        "rooms_per_side": args.rooms_per_side,
        "max_steps": args.max_steps,
    }
    out = generate_expert_trajectories(
        task=task, num_episodes=args.episodes, seed=args.seed, path=args.out
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

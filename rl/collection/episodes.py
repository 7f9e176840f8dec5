"""Running fixed lists of seeded episodes (evaluation), every episode counted exactly once.

:func:`evaluate_policy` runs a model, :func:`evaluate_expert` the task's expert, on the same
episode list split the same way over environments; an environment that has run its share is
paused (dropped from the batch, recurrent state included) until all are done.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rl.collection.acting import PolicyActor
from rl.collection.normalization import Normalizer
from rl.models.policy import Policy
from rl.sampling.base import finished_episodes
from rl.sampling.convert import episode_metric_key
from rl.sampling.factory import build_sampler
from rl.sampling.runner import Actor, ExpertActor, run_steps


@dataclasses.dataclass
class EvalResult:
    """Outcome of an evaluation.

    Attributes:
        metrics: Mean of each episode metric (``success``, ``spl``, ``return``, ...).
        episodes: One record per episode, in episode-list order, with its ``episode_seed``.
    """

    metrics: dict[str, float]
    episodes: list[dict[str, Any]]

    def as_logged(self, prefix: str = "eval") -> dict[str, float]:
        """Metrics under logged names, e.g. ``eval/success``, ``eval/episodic_return``."""
        return {
            f"{prefix}/{episode_metric_key(k).split('/', 1)[1]}": v
            for k, v in self.metrics.items()
        }


def episode_seed_list(num_episodes: int, first_seed: int) -> list[int]:
    """The fixed evaluation episode list: seeds ``first_seed .. first_seed + n - 1``."""
    return list(range(first_seed, first_seed + num_episodes))


@torch.no_grad()
def evaluate_policy(
    *,
    model: Policy,
    task: Mapping[str, Any],
    episode_seeds: Sequence[int],
    num_envs: int = 16,
    deterministic: bool = False,
    action_seed: int = 0,
    device: torch.device | str = "cpu",
    normalizer: Normalizer | None = None,
) -> EvalResult:
    """Run ``model`` on every episode of ``episode_seeds`` once.

    Each environment runs a contiguous share of the list; one that has finished its share is
    paused (dropped from the batch, its recurrent state included) until all are done.

    Args:
        model: The policy.
        task: Plain task config (``_target_`` + arguments).
        episode_seeds: Seeds of the episodes to run.
        num_envs: Environments stepped together (capped at the number of episodes).
        deterministic: Argmax actions instead of sampled ones.
        action_seed: Seed of the generator that samples actions (sampled mode).
        device: Where the model runs.
        normalizer: The training run's observation normalisation, applied frozen (None:
            observations as the environments return them).

    Returns:
        Mean metrics and per-episode records.
    """
    device = torch.device(device)
    model.eval()
    generator = torch.Generator(device=device).manual_seed(action_seed)

    def actor(num: int) -> Actor:
        return PolicyActor(
            model, num, device=device, deterministic=deterministic, generator=generator,
            normalizer=normalizer,
        )  # fmt: skip

    return run_episode_list(task, episode_seeds, num_envs, actor)


def evaluate_expert(
    *,
    task: Mapping[str, Any],
    episode_seeds: Sequence[int],
    num_envs: int = 16,
) -> EvalResult:
    """Run the task's expert (``expert_actions``) on every episode of ``episode_seeds``.

    The reference for a policy's evaluation: the same episode list, split and paused the same
    way as :func:`evaluate_policy`, with the expert's action taken at every step.

    Args:
        task: Plain task config (``_target_`` + arguments).
        episode_seeds: Seeds of the episodes to run.
        num_envs: Environments stepped together (capped at the number of episodes).

    Returns:
        Mean metrics and per-episode records.

    Raises:
        NoExpertError: If the task gives no expert action at some step.
    """
    expert = ExpertActor(str(task.get("_target_")))
    return run_episode_list(task, episode_seeds, num_envs, lambda _: expert)


def run_episode_list(
    task: Mapping[str, Any],
    episode_seeds: Sequence[int],
    num_envs: int,
    make_actor: Callable[[int], Actor],
) -> EvalResult:
    """The one loop over a fixed episode list: ``make_actor(N)`` acts for the environments.

    Each environment runs a contiguous share of the list; one that has run its share is paused
    (the actor drops it) until all are done, so every episode counts exactly once.
    """
    records: dict[int, dict[str, Any]] = {}
    with build_sampler(None, task=task, num_envs=num_envs, episode_seeds=episode_seeds) as sampler:

        def count(t: int, step: TensorDict, result: TensorDict) -> bool:
            for ep in finished_episodes(result):
                assert ep.episode_seed is not None
                records[ep.episode_seed] = {"episode_seed": ep.episode_seed, **ep.metrics}
            return False

        run_steps(sampler, make_actor(sampler.num_envs), sampler.reset(), count)
    return summarise_episodes(records, episode_seeds)


def summarise_episodes(
    records: Mapping[int, dict[str, Any]], episode_seeds: Sequence[int]
) -> EvalResult:
    """Per-episode records in list order and their means (NaNs ignored)."""
    if len(records) != len(episode_seeds):
        raise RuntimeError(
            f"evaluation finished {len(records)} episodes, expected {len(episode_seeds)}"
        )
    episodes = [records[s] for s in episode_seeds]
    # Every metric any episode has (a metric of some episodes only, e.g. an Atari game's score
    # where a game ended in a life's episode, is the mean over those that have it).
    keys = list(dict.fromkeys(k for e in episodes for k in e if k != "episode_seed"))
    metrics = {}
    for k in keys:
        values = [float(e[k]) for e in episodes if k in e and not math.isnan(float(e[k]))]
        metrics[k] = float(np.mean(values)) if values else float("nan")
    return EvalResult(metrics=metrics, episodes=episodes)

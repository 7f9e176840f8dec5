"""Running fixed lists of seeded episodes (evaluation), every episode counted exactly once.

Each environment runs a contiguous share of the list and is paused (dropped from the batch,
recurrent state included) once done, until all are. The environments step serially, or as one
batch where the run trained with ``sampler=batched`` (:class:`EvalSampler`): the same episodes,
the same results. :class:`PolicyActor` is the policy acting there (and in probe videos);
:func:`policy_step` is the same step for :class:`~rl.evaluation.InferenceAgent`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

import numpy as np
import torch
from tensordict import TensorDict

from rl.collection.normalization import Normalizer
from rl.models.policy import ACTIONS, NEXT_STATE, Policy, policy_input
from rl.sampling.base import (
    Actor,
    ExpertActor,
    actions_for,
    finished_episodes,
    run_steps,
    steps_device,
)
from rl.sampling.batched import MODES
from rl.sampling.convert import episode_metric_key
from rl.sampling.factory import build_sampler
from rl.sampling.watchdog import DEFAULT_TIMEOUT_S
from rl.utils.config import Check, load_section

# The batched sampler's public names (a saved run's ``_target_`` is compared, never imported).
BATCHED_SAMPLERS = ("rl.sampling.BatchedSampler", "rl.sampling.batched.BatchedSampler")
# What evaluation takes of a batched run's sampler config (its ``num_envs`` is evaluation's own).
_TAKEN = ("device", "vectorization_mode", "mp_start_method", "timeout")


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


@dataclasses.dataclass(frozen=True)
class EvalSampler:
    """How evaluation steps its environments: one by one (:meth:`serial`), or as one batch.

    Attributes:
        batched: Step the environments as one batch (``sampler=batched``).
        device: Where a task's own batched environment lives (no default: the run's
            ``sampler.device`` or evaluation's own).
        vectorization_mode: ``auto``, ``sync`` or ``async`` (``conf/sampler/batched.yaml``).
        mp_start_method: The start method of ``async``'s worker processes.
        timeout: Seconds one step of the batch may take (None: wait forever).
    """

    batched: bool
    device: str
    vectorization_mode: Annotated[str, Check(choices=MODES)] = "auto"
    mp_start_method: Annotated[str, Check(choices=("forkserver", "spawn", "fork"))] = "forkserver"
    timeout: Annotated[float | None, Check(gt=0)] = DEFAULT_TIMEOUT_S

    @classmethod
    def serial(cls) -> EvalSampler:
        """Step the environments one by one (on the CPU)."""
        return cls(batched=False, device="cpu")

    @classmethod
    def of_run(
        cls, sampler: Mapping[str, Any] | None, *, device: str | None = None
    ) -> EvalSampler:
        """Evaluation's sampler for a run whose plain sampler config is ``sampler``.

        A ``sampler=batched`` run evaluates batched with its settings (the environment count is
        evaluation's own), any other serially. ``device`` replaces the run's ``sampler.device``
        (``evaluate.py``: where the model runs).

        Raises:
            ConfigError: A batched run's setting out of range or missing.
        """
        if not isinstance(sampler, Mapping) or sampler.get("_target_") not in BATCHED_SAMPLERS:
            return cls.serial()
        settings: dict[str, Any] = {
            f.name: f.default
            for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING
        }
        settings["batched"] = True
        settings.update((k, sampler[k]) for k in _TAKEN if k in sampler)
        if device is not None:
            settings["device"] = str(device)
        return load_section(cls, settings, "sampler")

    def config(self) -> dict[str, Any] | None:
        """The sampler config :func:`~rl.sampling.build_sampler` takes (None: serial)."""
        if not self.batched:
            return None
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "batched"}
        return {"_target_": BATCHED_SAMPLERS[0], "_partial_": True, **fields}

    def describe(self) -> str:
        """One line for logs: which sampler, and where."""
        if not self.batched:
            return "serial sampler"
        return (
            f"batched sampler (device={self.device}, vectorization_mode={self.vectorization_mode})"
        )


@torch.no_grad()
def policy_step(
    model: Policy,
    obs: Mapping[str, torch.Tensor],
    starts: torch.Tensor,
    state: TensorDict,
    *,
    deterministic: bool,
    generator: torch.Generator | None = None,
    normalizer: Normalizer | None = None,
) -> tuple[torch.Tensor, TensorDict]:
    """The one policy step: ``(actions [N, ...], the state after)`` for ``[N, ...]`` inputs.

    ``normalizer``: the run's, applied frozen.
    """
    if normalizer is not None:
        obs = normalizer.observations(obs)
    step = model.act(
        policy_input(obs, starts, state), deterministic=deterministic, generator=generator
    )
    return step.get(ACTIONS), step.get(NEXT_STATE)


class PolicyActor:
    """A policy acting for ``num_envs`` environments; its state and episode starts in the step.

    :meth:`next_step` drops the environments not kept (their state too).

    Args:
        model: The policy (the caller puts it in eval mode).
        generator: Generator of sampled actions (None: the global one).
        normalizer: The run's observation normalisation, applied frozen.
    """

    def __init__(
        self,
        model: Policy,
        num_envs: int,
        *,
        device: torch.device | str,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        normalizer: Normalizer | None = None,
    ) -> None:
        self.model, self.num_envs, self.device = model, num_envs, torch.device(device)
        self.deterministic, self.generator, self.normalizer = deterministic, generator, normalizer
        self.steps_on = torch.device("cpu")  # where the sampler's steps live (set by start)

    def _obs(self, step: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        obs = {k: torch.as_tensor(v).to(self.device) for k, v in step["obs"].items()}
        return obs if self.normalizer is None else dict(self.normalizer.observations(obs))

    def start(self, first: Mapping[str, Any]) -> TensorDict:
        """The first step, of a sampler's reset ``first`` (``[N, ...]`` arrays or tensors)."""
        starts = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        self.steps_on = steps_device(first)
        state = self.model.initial_state(self.num_envs, self.device)
        return policy_input(self._obs(first), starts, state)

    def act(self, step: TensorDict) -> np.ndarray | torch.Tensor:
        """Actions ``[N, ...]`` for ``step``, as the sampler takes them (:func:`actions_for`)."""
        with torch.no_grad():
            self.model.act(step, deterministic=self.deterministic, generator=self.generator)
        return actions_for(step.get(ACTIONS), self.steps_on)

    def next_step(
        self, step: TensorDict, result: Mapping[str, Any], keep: torch.Tensor | None = None
    ) -> TensorDict:
        """Episode starts where ``result`` ended one, the state after; ``keep`` stays."""
        done = torch.as_tensor(result["terminated"]) | torch.as_tensor(result["truncated"])
        obs, done, state = self._obs(result), done.to(self.device), step.get(NEXT_STATE)
        if keep is not None:
            mask = keep.to(self.device)
            obs, done, state = {k: v[mask] for k, v in obs.items()}, done[mask], state[mask]
        return policy_input(obs, done, state)


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
    device: torch.device | str,
    normalizer: Normalizer | None = None,
    sampler: EvalSampler | None = None,
) -> EvalResult:
    """Run ``model`` on every episode of ``episode_seeds`` once.

    Args:
        model: The policy.
        task: Plain task config.
        episode_seeds: Seeds of the episodes to run.
        num_envs: Environments stepped together (capped at the number of episodes).
        deterministic: Argmax actions instead of sampled ones.
        action_seed: Seed of the generator that samples actions.
        device: Where the model runs.
        normalizer: The training run's observation normalisation, applied frozen.
        sampler: How the environments are stepped (None: serially).
    """
    device = torch.device(device)
    model.eval()
    generator = torch.Generator(device=device).manual_seed(action_seed)

    def actor(num: int) -> Actor:
        return PolicyActor(
            model, num, device=device, deterministic=deterministic, generator=generator,
            normalizer=normalizer,
        )  # fmt: skip

    return run_episode_list(task, episode_seeds, num_envs, actor, sampler)


def evaluate_expert(
    *,
    task: Mapping[str, Any],
    episode_seeds: Sequence[int],
    num_envs: int = 16,
    sampler: EvalSampler | None = None,
) -> EvalResult:
    """Run the task's expert (``expert_actions``) on every episode of ``episode_seeds`` once.

    The reference for :func:`evaluate_policy`: the same episodes, split the same way.

    Raises:
        NoExpertError: The task gives no expert action at some step.
    """
    expert = ExpertActor(str(task.get("_target_")))
    return run_episode_list(task, episode_seeds, num_envs, lambda _: expert, sampler)


def run_episode_list(
    task: Mapping[str, Any],
    episode_seeds: Sequence[int],
    num_envs: int,
    make_actor: Callable[[int], Actor],
    sampler: EvalSampler | None = None,
) -> EvalResult:
    """The one loop over a fixed episode list: ``make_actor(N)`` acts for the environments."""
    records: dict[int, dict[str, Any]] = {}
    config = None if sampler is None else sampler.config()
    with build_sampler(
        config, task=task, num_envs=num_envs, episode_seeds=episode_seeds
    ) as environments:

        def count(t: int, step: TensorDict, result: TensorDict) -> bool:
            for ep in finished_episodes(result):
                assert ep.episode_seed is not None
                records[ep.episode_seed] = {"episode_seed": ep.episode_seed, **ep.metrics}
            return False

        actor = make_actor(environments.num_envs)
        run_steps(environments, actor, actor.start(environments.reset()), count)
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
    # A metric of some episodes only (an Atari game's score, where a game ended in a life's
    # episode) is the mean over those that have it.
    keys = list(dict.fromkeys(k for e in episodes for k in e if k != "episode_seed"))
    metrics = {}
    for k in keys:
        values = [float(e[k]) for e in episodes if k in e and not math.isnan(float(e[k]))]
        metrics[k] = float(np.mean(values)) if values else float("nan")
    return EvalResult(metrics=metrics, episodes=episodes)

"""Evaluation settings, typed (the YAML files document each key).

``eval`` and ``valid`` of conf/train.yaml (``null`` turns one off), and conf/evaluate.yaml.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from rl.sampling.base import MAX_NUM_ENVS
from rl.tasks.splits import SPLITS
from rl.utils.config import MAX_EPISODES, MAX_WORKERS, Check, load_section, section_errors


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """Evaluation of the policy during training and after it (``eval`` in conf/train.yaml)."""

    num_episodes: Annotated[int, Check(ge=0, le=MAX_EPISODES)]
    interval: Annotated[int, Check(ge=0)]
    episode_seed: int
    num_envs: Annotated[int, Check(ge=1, le=MAX_NUM_ENVS)]
    deterministic: bool
    action_seed: int
    split: Annotated[str | None, Check(choices=SPLITS)]


@dataclasses.dataclass(frozen=True)
class ValidSettings:
    """Validation of every checkpoint in a separate process (``valid`` in conf/train.yaml)."""

    enabled: bool
    num_episodes: Annotated[int, Check(ge=1, le=MAX_EPISODES)]
    episode_seed: int
    num_envs: Annotated[int, Check(ge=1, le=MAX_NUM_ENVS)]
    deterministic: bool
    action_seed: int
    mp_start_method: Annotated[str, Check(choices=("forkserver", "spawn"))]
    torch_threads: Annotated[int, Check(ge=1, le=MAX_WORKERS)]
    split: Annotated[str | None, Check(choices=SPLITS)]


def eval_settings(section: Any) -> EvalSettings | None:
    """The ``eval`` section's settings (None: ``eval: null``)."""
    return None if section is None else load_section(EvalSettings, section, "eval")


def valid_settings(section: Any) -> ValidSettings | None:
    """The ``valid`` section's settings, None when validation is off."""
    if section is None:
        return None
    valid = load_section(ValidSettings, section, "valid")
    return valid if valid.enabled else None


def evaluation_errors(eval_section: Any, valid_section: Any) -> list[str]:
    """Problems of the resolved ``eval`` and ``valid`` sections (``null`` is fine for both)."""
    errors = []
    if eval_section is not None:
        errors += section_errors(EvalSettings, eval_section, "eval")
        if not errors and eval_section["interval"] > 0 and eval_section["num_episodes"] < 1:
            errors.append("eval.interval: periodic evaluation needs eval.num_episodes >= 1")
    if valid_section is not None:
        errors += section_errors(ValidSettings, valid_section, "valid")
    return errors


@dataclasses.dataclass(frozen=True)
class EvaluateSettings:
    """What ``evaluate.py`` runs (conf/evaluate.yaml)."""

    ckpt: str | None
    run_dir: str | None
    every_steps: Annotated[int, Check(ge=0)]
    test_expert: bool
    num_episodes: Annotated[int, Check(ge=1, le=MAX_EPISODES)]
    episode_seed: int
    num_envs: Annotated[int, Check(ge=1, le=MAX_NUM_ENVS)]
    deterministic: bool | None
    action_seed: int
    device: str
    torch_threads: Annotated[int | str | None, Check(ge=1, le=MAX_WORKERS, words=("auto",))]
    progress_bar: bool | None
    plot: bool
    export: Annotated[str | None, Check(choices=("onnx", "pt2"))]
    export_path: str | None
    output_dir: str
    split: Annotated[str | None, Check(choices=SPLITS)]
    trusted_targets: list[str]

    @property
    def episode_list(self) -> dict[str, Any]:
        """The settings that define the evaluated episodes and actions (written with results)."""
        return {
            "num_episodes": self.num_episodes,
            "episode_seed": self.episode_seed,
            "deterministic": self.deterministic,
            "action_seed": self.action_seed,
            "split": self.split,
        }

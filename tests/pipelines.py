"""Pipelines built in Python by tests, with the settings of ``conf/pipeline/ppo.yaml``.

The YAML is where the training settings' values live (``rl.pipeline.TrainingSettings`` declares
them, without defaults); a test building a ``TrainingPipeline`` by hand takes them from there
and overrides what it tests: ``ppo_pipeline(named_losses=..., stages=..., num_steps=16)``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
import yaml
from hydra.utils import instantiate

from rl.pipeline import TrainingPipeline, TrainingSettings

CONF = Path(__file__).resolve().parents[1] / "conf" / "pipeline"


def ppo_settings(**overrides: Any) -> dict[str, Any]:
    """``conf/pipeline/ppo.yaml``'s training settings (its default estimator built)."""
    raw = yaml.safe_load((CONF / "ppo.yaml").read_text())
    values = {k: raw[k] for k in TrainingSettings.names() if k in raw}
    values["advantage"] = instantiate(
        yaml.safe_load((CONF / "advantage" / "gae.yaml").read_text())
    )
    return {**values, **overrides}


def ppo_pipeline(**kwargs: Any) -> TrainingPipeline:
    """A ``TrainingPipeline`` of ``kwargs``, the settings ``ppo_settings`` fills in (Adam 1e-3)."""
    kwargs.setdefault("optimizer", functools.partial(torch.optim.Adam, lr=1e-3))
    settings = {k: kwargs.pop(k) for k in list(kwargs) if k in TrainingSettings.names()}
    return TrainingPipeline(**kwargs, **ppo_settings(**settings))

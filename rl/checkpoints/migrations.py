"""Saved configs of earlier versions, brought to today's layout before they are rebuilt.

A config already in today's layout passes unchanged. Covered: moved callables
(:data:`~rl.utils.config.MOVED_TARGETS`), renamed keys (:data:`RENAMED_KEYS`), pipeline settings
saved before their defaults lived in ``conf/pipeline/`` alone, and advantage settings saved
before the estimator became an object (``conf/pipeline/advantage/``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from rl.utils.config import moved_target

# TrainingPipeline's defaults before the settings' values lived in conf/pipeline/ alone.
_FORMER_DEFAULTS = {
    "num_steps": 128,
    "num_mini_batch": 4,
    "update_repeats": 4,
    "recurrence": 0,
    "max_grad_norm": 0.5,
    "gamma": 0.99,
    "advantage": "gae",  # (the old form: _advantage_settings makes it an object)
    "advance_scene_rollout_period": None,
    "save_interval": 0,
    "metric_accumulate_interval": 10_000,
}
_PIPELINE_TARGET = "rl.pipeline.TrainingPipeline"

# The settings the advantage estimator replaced, with the defaults they had then.
_OLD_ADVANTAGE = {
    "advantage": "gae",
    "use_gae": True,
    "gae_lambda": 0.95,
    "vtrace_rho_bar": 1.0,
    "vtrace_c_bar": 1.0,
    "vtrace_lambda": 1.0,
}


def _is_old(node: Mapping[str, Any]) -> bool:
    return any(k in node for k in _OLD_ADVANTAGE if k != "advantage") or isinstance(
        node.get("advantage"), str
    )


def _estimator(old: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(option of conf/pipeline/advantage, its node)`` for the old settings ``old``."""
    if old["advantage"] == "vtrace":
        return "vtrace", {
            "_target_": "rl.storage.VTrace",
            "rho_bar": old["vtrace_rho_bar"],
            "c_bar": old["vtrace_c_bar"],
            "vtrace_lambda": old["vtrace_lambda"],
        }
    if old["use_gae"] is False:
        return "returns", {"_target_": "rl.storage.DiscountedReturns"}
    return "gae", {"_target_": "rl.storage.GAE", "gae_lambda": old["gae_lambda"]}


def _advantage_settings(
    saved: dict[str, Any], choices: dict[str, str] | None
) -> tuple[dict[str, Any], dict[str, str] | None]:
    """The old advantage settings as an estimator node, and its ``pipeline/advantage`` choice."""
    pipe = saved.get("pipeline")
    if not isinstance(pipe, dict):
        return saved, choices
    listed = pipe.get("stages")
    stages = listed if isinstance(listed, list) else []
    nodes = [pipe, *(s for s in stages if isinstance(s, dict))]
    if not any(_is_old(node) for node in nodes):
        return saved, choices
    saved = copy.deepcopy(saved)
    pipe = saved["pipeline"]
    defaults = {k: pipe.pop(k, v) for k, v in _OLD_ADVANTAGE.items()}
    option, pipe["advantage"] = _estimator(defaults)
    for stage in pipe.get("stages") or []:
        if not isinstance(stage, dict):
            continue
        own = {k: stage.pop(k) for k in _OLD_ADVANTAGE if stage.get(k) is not None}
        for k in _OLD_ADVANTAGE:
            stage.pop(k, None)
        if own:
            stage["advantage"] = _estimator({**defaults, **own})[1]
    if choices is not None and "pipeline" in choices:
        choices = {**choices, "pipeline/advantage": option}
    return saved, choices


def _settings_defaults(saved: dict[str, Any]) -> dict[str, Any]:
    pipe = saved.get("pipeline")
    if not isinstance(pipe, dict) or pipe.get("_target_") != _PIPELINE_TARGET:
        return saved
    missing = {k: v for k, v in _FORMER_DEFAULTS.items() if k not in pipe}
    return {**saved, "pipeline": {**pipe, **missing}} if missing else saved


def _moved(node: Any) -> Any:
    """``node`` with every ``_target_`` naming a moved callable renamed (a copy where changed)."""
    if isinstance(node, dict):
        out = {k: _moved(v) for k, v in node.items()}
        target = out.get("_target_")
        if isinstance(target, str):
            out["_target_"] = moved_target(target) or target
        return out
    if isinstance(node, list):
        return [_moved(v) for v in node]
    return node


# Keys renamed since (section, old name, new name): "worker" names a collection worker only.
RENAMED_KEYS = (("distributed", "workers", "world_size"),)


def _renamed_keys(saved: dict[str, Any]) -> dict[str, Any]:
    for section, old, new in RENAMED_KEYS:
        node = saved.get(section)
        if isinstance(node, dict) and old in node and new not in node:
            saved = {**saved, section: {**node, new: node[old], old: None}}
    return saved


def migrate(
    saved: Mapping[str, Any], choices: Mapping[str, str] | None
) -> tuple[dict[str, Any], dict[str, str] | None]:
    """A saved config and its group choices in today's layout."""
    out = _settings_defaults(_renamed_keys(_moved(dict(saved))))
    return _advantage_settings(out, None if choices is None else dict(choices))

"""Which settings a resumed run may change, and the config it runs with.

Settings typed now that differ from the saved run's apply only where that is safe
(:data:`SAFE_RESUME_KEYS`); anything else is a :class:`~rl.utils.config.ConfigError` naming the
keys. The tree's interpolations are kept where the saved value is what they give, so a new
budget moves every budget derived from it.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from rl.checkpoints.config_tree import run_choices
from rl.checkpoints.invocation import (
    INVOCATION_GROUPS,
    INVOCATION_KEYS,
    RUN_SHAPE,
    drop_generation,
    invocation_only,
    invocation_paths,
    value_at,
)
from rl.checkpoints.saved_config import RebuiltConfig, fill_app_interpolations
from rl.utils.config import ConfigError

log = logging.getLogger(__name__)

# Config keys a resume may change (fnmatch patterns over dotted paths, covering everything below).
SAFE_RESUME_KEYS = (
    "total_env_steps",
    "pipeline.total_env_steps",
    "pipeline.stages.*.max_stage_steps",
    "pipeline.lr_scheduler.lr_lambda.steps",
    "pipeline.named_losses.*.clip_decay.steps",
    "pipeline.stages.*.teacher_forcing.steps",
    "pipeline.save_interval",
    "pipeline.metric_accumulate_interval",
    "pipeline.stages.*.save_interval",
    "pipeline.stages.*.metric_accumulate_interval",
    "pipeline.keep_last",  # (checkpoint retention: which files stay, never the training)
    "pipeline.best_metric",
    "pipeline.best_mode",
    "logger",
    "eval",
    "torch_threads",
    "tags",
    "optimized_metric",
    "valid",
    "video_interval",
)


def unresolved_config(cfg: DictConfig | Mapping[str, Any], plain: Mapping[str, Any]) -> dict:
    """``cfg`` as plain containers with its interpolations kept (for checkpoints).

    Those that resolve only inside a Hydra app (``${hydra:...}``) take their values in ``plain``.
    """
    if not isinstance(cfg, DictConfig):
        return copy.deepcopy(dict(plain))
    raw = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(raw, dict)
    raw.pop("hydra", None)
    return fill_app_interpolations(raw, dict(plain))


def _typed(cfg: DictConfig | Mapping[str, Any]) -> list[str] | None:
    """The overrides typed on the command line, as typed (None if unknown)."""
    if isinstance(cfg, DictConfig) and "hydra" in cfg:
        return list(cfg.hydra.overrides.task)
    if HydraConfig.initialized():
        return list(HydraConfig.get().overrides.task)
    return None


def typed_overrides(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """What a saved run's config is rebuilt with beside its own choices, on ``resume=``.

    The key overrides typed now (what they name is the user's to name) and this command's choice
    of the groups a saved run never chooses (``logger=...``).
    """
    choices = run_choices(cfg) or {}
    out = [f"{g}={o}" for g, o in choices.items() if g in INVOCATION_GROUPS]
    for item in _typed(cfg) or ():
        key = item.split("=", 1)[0].lstrip("~+")
        name = key.split("@", 1)[0]
        if name in choices or "@" in key or "/" in name or name.startswith("hydra"):
            continue  # (a config group choice)
        if name.split(".")[0] not in INVOCATION_KEYS:
            out.append(item)
    return out


def typed_override_keys(cfg: DictConfig | Mapping[str, Any]) -> list[str] | None:
    """Config keys named by the overrides typed on the command line (None if unknown)."""
    overrides = _typed(cfg)
    if overrides is None:
        return None
    keys = []
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("~+").split("@", 1)[0]
        if key and not key.startswith("hydra"):
            keys.append(key)
    return keys


_MISSING = object()


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves of a nested config by dotted path (lists by index; empty containers are leaves)."""
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(node, list) and node and any(isinstance(v, (dict, list)) for v in node):
        out = {}
        for i, v in enumerate(node):
            out.update(_flatten(v, f"{prefix}{i}."))
        return out
    return {prefix[:-1]: node}


def config_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{dotted_path: (old, new)}`` for every leaf that differs, but the command's own keys."""
    a = {k: v for k, v in _flatten(dict(old)).items() if _compared(k)}
    b = {k: v for k, v in _flatten(dict(new)).items() if _compared(k)}
    out = {}
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, _MISSING), b.get(key, _MISSING)
        if va is _MISSING or vb is _MISSING or va != vb or type(va) is not type(vb):
            out[key] = (va, vb)
    return out


def _compared(path: str) -> bool:
    return path.split(".")[0] not in INVOCATION_KEYS and invocation_only(path) is None


def is_safe_resume_key(path: str) -> bool:
    """True if ``path`` (or a parent of it) matches :data:`SAFE_RESUME_KEYS`."""
    parts = path.split(".")
    prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(p, pat) for p in prefixes for pat in SAFE_RESUME_KEYS)


def _covered(path: str, keys: list[str]) -> bool:
    return any(path == k or path.startswith(k + ".") or k.startswith(path + ".") for k in keys)


def _show(value: Any) -> str:
    return "<missing>" if value is _MISSING else repr(value)


# Config groups whose keys are constructor arguments (a missing key means the default).
_COMPONENT_GROUPS = frozenset({"task", "model", "pipeline", "sampler", "collector", "logger"})


def _added_since(
    diff: Mapping[str, tuple[Any, Any]], saved: Mapping[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """The differences that are settings added to conf/ since the run was saved (today's apply).

    Whole new sections, and new keys of settings sections. A key missing from a component's
    config (task, model) is not one: it means the constructor's default, which the run used.
    """
    return {
        k: v
        for k, v in diff.items()
        if v[0] is _MISSING and (k.split(".")[0] not in saved or _is_new_setting(k, saved))
    }


def _is_new_setting(key: str, saved: Mapping[str, Any]) -> bool:
    """A key of a settings section (``eval``, ``valid``, ...) that the saved config lacks."""
    section, _, rest = key.partition(".")
    return (
        section not in _COMPONENT_GROUPS
        and "." not in rest
        and isinstance(saved.get(section), Mapping)
        and rest not in saved[section]
    )


def _changes(keys: list[str], diff: Mapping[str, tuple[Any, Any]]) -> str:
    return "".join(f"\n  {k}: {_show(diff[k][0])} -> {_show(diff[k][1])}" for k in keys)


def _set_path(node: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    for part in parts[:-1]:
        key: Any = int(part) if isinstance(node, list) else part
        if isinstance(node, dict) and key not in node:
            node[key] = {}
        node = node[key]
    last: Any = int(parts[-1]) if isinstance(node, list) else parts[-1]
    if value is _MISSING:
        node.pop(last, None)
    else:
        node[last] = value


def resume_config(
    saved_run: RebuiltConfig,
    new_unresolved: Mapping[str, Any],
    typed_keys: list[str] | None,
    run_dir: Path,
) -> dict[str, Any]:
    """The resolved config a resumed run uses: the saved one plus the safe changes typed now.

    Args:
        saved_run: The saved config, rebuilt on the user's config tree.
        new_unresolved: The config composed by this invocation (interpolations kept).
        typed_keys: Keys typed on the command line (None: every difference counts as typed).
            A difference not typed (a default changed in ``conf/`` since, an experiment not
            repeated) keeps the saved value.
        run_dir: The run folder (the new ``output_dir``).

    Raises:
        ConfigError: A typed change, or a setting it derives, is unsafe.
    """
    saved_resolved = saved_run.config
    saved = copy.deepcopy(saved_run.unresolved)
    diff = config_diff(saved, new_unresolved)
    added = _added_since(diff, saved)
    diff = {k: v for k, v in diff.items() if k not in added}
    typed = {k: v for k, v in diff.items() if typed_keys is None or _covered(k, typed_keys)}
    untyped = sorted(set(diff) - set(typed))
    unsafe = [k for k in typed if not is_safe_resume_key(k)]
    if unsafe:
        raise ConfigError(
            "resume: these settings differ from the saved run and cannot change when resuming "
            "(start a new run, or init_from=CHECKPOINT for its weights only):"
            + _changes(unsafe, typed)
        )
    merged = copy.deepcopy(saved)
    for key, (_, value) in {**added, **typed}.items():
        _set_path(merged, key, value)
    _take_invocation_values(merged, new_unresolved)
    if added:
        log.info(
            "resume: the saved run predates %s; using today's: %s",
            ", ".join(sorted({k.split(".")[0] for k in added})),
            ", ".join(f"{k}={_show(v)}" for k, (_, v) in sorted(added.items())),
        )
    merged["output_dir"] = str(run_dir)
    merged["resume"] = new_unresolved.get("resume")
    merged["init_from"] = None
    merged["trusted_targets"] = new_unresolved.get("trusted_targets") or []
    plain = OmegaConf.to_container(OmegaConf.create(merged), resolve=True)
    assert isinstance(plain, dict)
    resolved = cast("dict[str, Any]", plain)  # (a config's keys are strings)
    _check_run_shape(saved_run.withheld, resolved)
    drop_generation(resolved)
    derived = {
        k: v
        for k, v in config_diff(saved_resolved, resolved).items()
        if k not in typed and k not in added and k.split(".")[0] in saved_resolved
    }
    bad = [k for k in derived if not is_safe_resume_key(k)]
    if bad:
        raise ConfigError(
            "resume: the changes typed now also change settings that cannot change when "
            "resuming:" + _changes(bad, derived)
        )
    if typed or derived:
        log.warning(
            "resume: settings changed from the saved run:\n  %s",
            "\n  ".join(
                f"{k}: {_show(a)} -> {_show(b)}{'' if k in typed else '  (derived)'}"
                for k, (a, b) in {**typed, **derived}.items()
            ),
        )
    if untyped:
        log.info(
            "resume: %d setting(s) differ from what this command composes but were not typed "
            "on the command line; the saved run's values are kept: %s",
            len(untyped),
            ", ".join(untyped),
        )
    return resolved


def _take_invocation_values(merged: dict[str, Any], invocation: Mapping[str, Any]) -> None:
    """Set the command's own values from ``invocation``.

    Not into a ``_target_`` node that lacks the key (another collector than the command's).
    """
    for path in invocation_paths(invocation):
        parent_path, _, leaf = path.rpartition(".")
        parent = value_at(merged, parent_path) if parent_path else merged
        if isinstance(parent, dict) and (leaf in parent or "_target_" not in parent):
            parent[leaf] = copy.deepcopy(value_at(invocation, path))


def _check_run_shape(withheld: Mapping[str, Any], resolved: Mapping[str, Any]) -> None:
    """A ConfigError saying what to type if a size that shapes the run differs from the run's."""
    other = {
        key: (withheld[key], value_at(resolved, key, _MISSING))
        for key in RUN_SHAPE
        if key in withheld and value_at(resolved, key, _MISSING) != withheld[key]
    }
    if other:
        raise ConfigError(
            "resume: a run folder never chooses sizes, and this command gives other ones than "
            "the run used; type the run's values to resume it as it ran ("
            + " ".join(f"{k}={json.dumps(v)}" for k, (v, _) in other.items())
            + "):"
            + "".join(
                f"\n  {k}: the run used {v!r}, this command gives {_show(now)}"
                for k, (v, now) in other.items()
            )
        )
    changed = [
        k for k, v in withheld.items() if not k.startswith("logger") and value_at(resolved, k) != v
    ]
    if changed:
        log.info(
            "resume: this command's values are used for addresses, loggers, paths and sizes "
            "(a run folder never chooses them); they differ from the saved run's at %s",
            ", ".join(sorted(changed)),
        )

"""Config checks that run before anything is built, so a bad config fails in seconds.

:func:`verify_cfg` collects every problem it finds and raises one :class:`ConfigError` naming
each offending key: a ``_target_`` that does not import, a key that its target does not accept,
a value of the wrong type for a simple annotation (int, float, bool, str, optionals of them),
a stage naming a loss that does not exist, and impossible rollout/minibatch splits.
"""

from __future__ import annotations

import importlib
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict


class ConfigError(ValueError):
    """The composed config cannot run; the message lists every problem."""


def import_target(path: str) -> Callable[..., Any]:
    """Import ``package.module.attr`` (as Hydra's ``_target_`` does)."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ImportError(f"{path!r} is not a dotted path")
    try:
        obj: Any = importlib.import_module(module_name)
        return getattr(obj, attr)  # type: ignore[no-any-return]
    except (ImportError, AttributeError):
        # Nested attribute (e.g. a class attribute): walk from the longest importable module.
        parts = path.split(".")
        for i in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for name in parts[i:]:
                obj = getattr(obj, name)
            return obj  # type: ignore[no-any-return]
        raise


def _hints(target: Callable[..., Any]) -> dict[str, Any]:
    fn = target.__init__ if inspect.isclass(target) else target  # type: ignore[misc]
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001  (unresolvable annotations: skip type checks)
        return {}


def _type_ok(value: Any, hint: Any) -> bool:
    """False only when ``value`` certainly does not fit a simple ``hint``."""
    if value is None:
        return hint is type(None) or _accepts_none(hint)
    if isinstance(value, Mapping):
        return True  # nested object configs are checked on their own
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(hint) if arg is not type(None))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple, typing.Sequence, __import__("collections.abc").abc.Sequence):
        return isinstance(value, (list, tuple))
    return True


def _accepts_none(hint: Any) -> bool:
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def check_targets(
    node: Any, path: str = "", runtime_kwargs: Mapping[str, set[str]] | None = None
) -> list[str]:
    """Errors for every ``_target_`` node under ``node`` (a plain container).

    Args:
        node: Resolved config (dicts and lists).
        path: Dotted path of ``node`` (for messages).
        runtime_kwargs: Keys the engine passes at build time, by node path (they must be
            accepted arguments but need not appear in the YAML).
    """
    errors: list[str] = []
    runtime_kwargs = runtime_kwargs or {}
    if isinstance(node, Mapping):
        if "_target_" in node:
            errors += _check_target_node(node, path, runtime_kwargs.get(path, set()))
        for key, value in node.items():
            if isinstance(key, str) and key.startswith("_"):
                continue
            errors += check_targets(value, f"{path}.{key}" if path else str(key), runtime_kwargs)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            errors += check_targets(value, f"{path}.{i}", runtime_kwargs)
    return errors


def _check_target_node(node: Mapping[str, Any], path: str, runtime: set[str]) -> list[str]:
    where = path or "<root>"
    target_path = node["_target_"]
    try:
        target = import_target(target_path)
    except Exception as e:  # noqa: BLE001
        return [f"{where}._target_: cannot import {target_path!r} ({type(e).__name__}: {e})"]
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    params = sig.parameters
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    hints = _hints(target)
    errors = []
    keys = [k for k in node if not (isinstance(k, str) and k.startswith("_"))]
    for key in keys:
        if key not in params and not var_kw:
            accepted = ", ".join(n for n, p in params.items() if p.kind is not p.VAR_POSITIONAL)
            errors.append(f"{where}.{key}: unknown key for {target_path} (accepted: {accepted})")
            continue
        if key in hints and not _type_ok(node[key], hints[key]):
            hint = hints[key]
            name = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
            errors.append(
                f"{where}.{key}: expected {name}, got {type(node[key]).__name__} {node[key]!r}"
            )
    if not node.get("_partial_", False):
        missing = [
            n
            for n, p in params.items()
            if p.default is inspect.Parameter.empty
            and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
            and n not in node
            and n not in runtime
            and n != "self"
        ]
        if missing:
            errors.append(f"{where}: missing required argument(s) {missing} for {target_path}")
    return errors


def to_plain(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """Resolve ``cfg`` once into plain dicts and lists (for workers, checkpoints, wandb)."""
    if isinstance(cfg, DictConfig):
        if "hydra" in cfg:  # composed with return_hydra_config (tests); @hydra.main drops it
            cfg = cfg.copy()
            with open_dict(cfg):
                cfg.pop("hydra")
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]
    return {k: v for k, v in cfg.items() if k != "hydra"}

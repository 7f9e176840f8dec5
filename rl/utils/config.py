"""Config checks that run before anything is built, so a bad config fails in seconds.

Checks return every problem as a message naming its key; the caller raises one
:class:`ConfigError` listing them all. :func:`check_targets` checks ``_target_`` nodes against
their signatures, :func:`section_errors` a plain section against its (default-free) dataclass.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf, open_dict

T = TypeVar("T")


class ConfigError(ValueError):
    """The composed config cannot run; the message lists every problem."""


def fraction_of_total(fraction: float, *, _root_: DictConfig) -> int:
    """``${fraction_of_total:f}``: ``f`` (in ``(0, 1]``) of the run's ``total_env_steps``.

    Stage budgets and schedule horizons written this way follow one ``total_env_steps=N``.
    """
    if not 0.0 < float(fraction) <= 1.0:
        raise ValueError(f"${{fraction_of_total:{fraction}}}: the fraction must be in (0, 1]")
    return max(1, round(float(fraction) * int(float(_root_["total_env_steps"]))))


OmegaConf.register_new_resolver("fraction_of_total", fraction_of_total, replace=True)


def task_name(*, _root_: DictConfig) -> str:
    """``${task_name:}``: the task's ``env_id``, else its ``_target_``'s last part, else ``task``.

    The generic presets name runs ``ppo_${task_name:}``: a task of one's own is not filed under
    the preset's environment.
    """
    task = _root_.get("task")
    if not isinstance(task, DictConfig):
        return "task"
    env_id = task.get("env_id")
    if env_id:
        return str(env_id)
    target = task.get("_target_")
    return str(target).rpartition(".")[2] if target else "task"


OmegaConf.register_new_resolver("task_name", task_name, replace=True)


# Callables that moved, by dotted prefix. A saved config naming an old path is rewritten on load
# (:mod:`rl.checkpoints.migrations`); a user's config naming one is refused with the new path.
MOVED_TARGETS: dict[str, str] = {
    "rl.tasks.nav_batched": "rl_envs.pointnav.batched",
    "rl.tasks.nav_checks": "rl_envs.pointnav.checks",
    "rl.tasks.nav_layout": "rl_envs.pointnav.layout",
    "rl.tasks.nav_view": "rl_envs.pointnav.view",
    "rl.tasks.nav_multi": "rl_envs.pointnav.multi",
    "rl.tasks.nav3d_checks": "rl_envs.pointnav3d.checks",
    "rl.tasks.nav3d_grid": "rl_envs.pointnav3d.grid",
    "rl.tasks.nav3d_layout": "rl_envs.pointnav3d.layout",
    "rl.tasks.nav3d_map": "rl_envs.pointnav3d.topdown",
    "rl.tasks.nav3d_world": "rl_envs.pointnav3d.world",
    "rl.tasks.nav3d": "rl_envs.pointnav3d.env",
    "rl.tasks.nav": "rl_envs.pointnav.env",
    "rl.tasks.toy_agents": "rl_envs.toys.agents",
    "rl.tasks.toy": "rl_envs.toys.spaces",
    "rl.tasks.corridor": "rl_envs.toys.corridor",
    "rl.tasks.debug": "rl_envs.toys.debug",
    "rl.tasks.minigrid": "rl_envs.minigrid",
    "rl.tasks.atari": "rl_envs.atari",
    "rl.tasks.PointNavEnv": "rl_envs.pointnav.PointNavEnv",
    "rl.tasks.PointNav3DEnv": "rl_envs.pointnav3d.PointNav3DEnv",
    "rl.tasks.Actions": "rl_envs.pointnav.Actions",
    "rl.tasks.RenderingUnavailableError": "rl_envs.pointnav3d.RenderingUnavailableError",
    "rl.tasks.make_minigrid_env": "rl_envs.minigrid.make_minigrid_env",
}


def moved_target(path: str) -> str | None:
    """Where the callable at dotted ``path`` is now, if it moved."""
    for old, new in MOVED_TARGETS.items():
        if path == old or path.startswith(old + "."):
            return new + path[len(old) :]
    return None


def import_target(path: str) -> Callable[..., Any]:
    """Import ``package.module.attr`` (as Hydra's ``_target_`` does)."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ImportError(f"{path!r} is not a dotted path")
    try:
        obj: Any = importlib.import_module(module_name)
        return getattr(obj, attr)
    except (ImportError, AttributeError):
        # A nested attribute (a class attribute): walk from the longest importable module.
        parts = path.split(".")
        for i in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for name in parts[i:]:
                obj = getattr(obj, name)
            return obj
        raise


def _hints(target: Callable[..., Any]) -> dict[str, Any]:
    fn = target.__init__ if inspect.isclass(target) else target
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:  # noqa: BLE001  (unresolvable annotations: skip type checks)
        return {}


def split_hint(hint: Any) -> tuple[Any, list[Check]]:
    """``(type, checks)`` of an annotation, ``Annotated[int, Check(ge=1)]`` or a plain type."""
    if typing.get_origin(hint) is typing.Annotated:
        base, *meta = typing.get_args(hint)
        return base, [m for m in meta if isinstance(m, Check)]
    return hint, []


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
    if origin in (list, tuple, Sequence):
        return isinstance(value, (list, tuple))
    return True


def _accepts_none(hint: Any) -> bool:
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def check_targets(
    node: Any,
    path: str = "",
    framework_keys: Mapping[str, frozenset[str]] | None = None,
) -> list[str]:
    """Errors for every ``_target_`` node under ``node``.

    Args:
        node: Resolved config (dicts and lists).
        path: Dotted path of ``node`` (for messages).
        framework_keys: Keys the framework reads itself in a node named ``name``, not passed
            to its target (``{"task": {"observations"}}`` applies to ``task`` and its copies
            elsewhere, such as ``...generate.task``); nodes inside them are still checked.
    """
    errors: list[str] = []
    framework_keys = framework_keys or {}
    if isinstance(node, Mapping):
        if "_target_" in node:
            name = path.rpartition(".")[2]
            own = {k: v for k, v in node.items() if k not in framework_keys.get(name, ())}
            errors += _check_target_node(own, path)
        for key, value in node.items():
            if isinstance(key, str) and key.startswith("_"):
                continue
            errors += check_targets(value, f"{path}.{key}" if path else str(key), framework_keys)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            errors += check_targets(value, f"{path}.{i}", framework_keys)
    return errors


def _check_target_node(node: Mapping[str, Any], path: str) -> list[str]:
    where = path or "<root>"
    target_path = node["_target_"]
    try:
        target = import_target(target_path)
    except Exception as e:  # noqa: BLE001
        moved = moved_target(str(target_path))
        if moved is not None:
            return [f"{where}._target_: {target_path!r} moved: write {moved!r}"]
        return [f"{where}._target_: cannot import {target_path!r} ({type(e).__name__}: {e})"]
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    params = sig.parameters
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    keys = [k for k in node if not (isinstance(k, str) and k.startswith("_"))]
    accepted = ", ".join(n for n, p in params.items() if p.kind is not p.VAR_POSITIONAL)
    errors = [
        f"{where}.{key}: unknown key for {target_path} (accepted: {accepted})"
        for key in keys
        if key not in params and not var_kw
    ]
    errors += argument_errors(target, {k: node[k] for k in keys if k in params or var_kw}, where)
    if not node.get("_partial_", False):
        missing = [
            n
            for n, p in params.items()
            if p.default is inspect.Parameter.empty
            and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
            and n not in node
            and n != "self"
        ]
        if missing:
            errors.append(f"{where}: missing required argument(s) {missing} for {target_path}")
    return errors


def _integral(value: Any, hint: Any) -> int | None:
    """``int(value)`` where an integral float is given for an integer ``hint`` (else None)."""
    if not isinstance(value, float) or not value.is_integer() or _type_ok(value, hint):
        return None
    return int(value) if _type_ok(int(value), hint) else None


def integral_floats_to_int(node: Any) -> None:
    """In place: integral floats (``save_interval=5e5``) as ints where a ``_target_`` says int."""
    if isinstance(node, dict):
        if "_target_" in node:
            try:
                hints = _hints(import_target(str(node["_target_"])))
            except Exception:  # noqa: BLE001  (check_targets reports it)
                hints = {}
            for key, hint in hints.items():
                if key in node and (value := _integral(node[key], split_hint(hint)[0])):
                    node[key] = value
        for key, value in node.items():
            if not (isinstance(key, str) and key.startswith("_")):
                integral_floats_to_int(value)
    elif isinstance(node, list):
        for value in node:
            integral_floats_to_int(value)


def integral_fields_to_int(cfg: DictConfig, cls: type) -> None:
    """Integral floats for ``cls``'s integer fields at ``cfg``'s top as ints, before resolving.

    So every interpolation of such a key (``${total_env_steps}``) reads the int.
    """
    hints = typing.get_type_hints(cls, include_extras=True)
    for name, hint in hints.items():
        if name in cfg and not OmegaConf.is_interpolation(cfg, name):
            value = _integral(cfg[name], split_hint(hint)[0])
            if value is not None:
                cfg[name] = value


def to_plain(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` resolved into plain dicts and lists, without ``hydra``."""
    if isinstance(cfg, DictConfig):
        if "hydra" in cfg:  # composed with return_hydra_config (tests); @hydra.main drops it
            cfg = cfg.copy()
            with open_dict(cfg):
                cfg.pop("hydra")
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]
    entries: Mapping[str, Any] = cfg  # (not a DictConfig: mypy keeps it in the union)
    return {k: v for k, v in entries.items() if k != "hydra"}


# Upper bounds of counts: far above real use, far below what exhausts memory or runs for days
# before anything is written.
MAX_WORKERS = 1024  # processes of one kind: sampler workers, collection workers, DDP workers
MAX_EPISODES = 10**6  # episodes of one list: evaluation, validation, expert trajectories


@dataclasses.dataclass(frozen=True)
class Check:
    """What a setting's value must satisfy: ``Annotated[int, Check(ge=1)]`` (None always passes).

    Attributes:
        ge: ``>=`` bound; ``gt`` and ``le`` likewise.
        choices: The value must be one of these.
        words: Strings a bounded number may also be (``Check(ge=1, words=("auto",))``).
        inf: The value may be ``inf`` or ``-inf`` (within the bounds); NaN never passes.
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[Any, ...] | None = None
    words: tuple[str, ...] = ()
    inf: bool = False

    def problem(self, value: Any) -> str | None:
        """Why ``value`` fails this check (None: it passes or is not a plain value)."""
        if value is None or isinstance(value, bool) or not isinstance(value, int | float | str):
            return None
        if isinstance(value, float) and not (
            math.isfinite(value) or (self.inf and not math.isnan(value))
        ):
            return f"must be a finite number, got {value!r}"
        bounded = any(b is not None for b in (self.ge, self.gt, self.le))
        if isinstance(value, str) and value in self.words:
            return None
        if isinstance(value, str) and self.choices is None and bounded:
            words = "".join(f" or {w!r}" for w in self.words)
            return f"expected a number{words}, got {value!r}"
        if self.choices is not None and value not in self.choices:
            return f"expected one of {', '.join(map(str, self.choices))}, got {value!r}"
        if isinstance(value, str):
            return None
        for bound, ok, text in (
            (self.ge, lambda v, b: v >= b, ">="),
            (self.gt, lambda v, b: v > b, ">"),
            (self.le, lambda v, b: v <= b, "<="),
        ):
            if bound is not None and not ok(value, bound):
                return f"must be {text} {bound}, got {value!r}"
        return None


def value_problems(value: Any, checks: list[Check]) -> list[str]:
    """Why a setting's ``value`` fails its ``checks`` (empty: it passes).

    A float (or one in a list: loss weights) must be finite unless a check allows ``inf``: a
    learning rate of ``nan`` would otherwise poison training later, unnamed.
    """
    finite = Check(inf=any(c.inf for c in checks))
    problems = [p for c in checks or [finite] if (p := c.problem(value)) is not None]
    if isinstance(value, list | tuple):
        problems += [
            f"item {i} {p}"
            for i, item in enumerate(value)
            if (p := finite.problem(item)) is not None
        ]
    return list(dict.fromkeys(problems))


def _accepts_mapping(hint: Any) -> bool:
    """Whether a settings field's annotation takes a mapping (``dict[...]``, optional or not)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_accepts_mapping(arg) for arg in typing.get_args(hint))
    return hint is dict or typing.get_origin(hint) in (dict, Mapping)


def _hint_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def argument_errors(fn: Callable[..., Any], values: Mapping[str, Any], where: str) -> list[str]:
    """Type and range problems of keyword ``values`` against ``fn``'s annotations."""
    hints = _hints(fn)
    errors = []
    for key, value in values.items():
        if key not in hints:
            continue
        hint, checks = split_hint(hints[key])
        if not _type_ok(value, hint):
            errors.append(
                f"{where}.{key}: expected {_hint_name(hint)}, got {type(value).__name__} {value!r}"
            )
            continue
        errors += [f"{where}.{key}: {p}" for p in value_problems(value, checks)]
    return errors


def section_errors(cls: type, section: Any, where: str) -> list[str]:
    """Problems of the resolved ``section`` at ``where`` ("": the top) as dataclass ``cls``."""
    if not isinstance(section, Mapping):
        return [f"{where}: expected a mapping, got {section!r}"]
    prefix = f"{where}." if where else ""
    names = [f.name for f in dataclasses.fields(cls)]
    hints = typing.get_type_hints(cls, include_extras=True)
    errors = [
        f"{prefix}{key}: unknown key (known: {', '.join(sorted(names))})"
        for key in section
        if key not in names
    ]
    for name in names:
        if name not in section:
            errors.append(f"{prefix}{name}: missing")
            continue
        hint, checks = split_hint(hints[name])
        value = section[name]
        if (isinstance(value, Mapping) and not _accepts_mapping(hint)) or not _type_ok(
            value, hint
        ):
            errors.append(f"{prefix}{name}: expected {_hint_name(hint)}, got {value!r}")
            continue
        errors += [f"{prefix}{name}: {p}" for p in value_problems(value, checks)]
    return errors


def load_section(cls: type[T], section: Any, where: str) -> T:
    """The settings dataclass ``cls`` filled from ``section``; a ConfigError lists its problems."""
    errors = section_errors(cls, section, where)
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
    return cls(**section)  # checked: exactly the fields

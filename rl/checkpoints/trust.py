"""Which callables a config read from a checkpoint may name: the ``_target_`` allow-list.

A checkpoint carries the config it was trained with, and evaluation and ``resume=`` build the
task and model from it with Hydra's ``instantiate``, which calls whatever a ``_target_`` names
(``pathlib.Path.write_text``, ``builtins.open``, ...). ``torch.load(weights_only=True)`` keeps
the *tensors* from running code; this module keeps the *config* from doing so. A saved config
may name only:

- the project's own configuration API: callables defined in ``rl.tasks``, ``rl.models``,
  ``rl.pipeline``, ``rl.losses``, ``rl.sampling``, ``rl.collection``, ``rl.loggers`` and
  ``rl.storage`` (not the checkpoint, engine or evaluation code, which writes files, and not
  :func:`rl.storage.generate_expert_trajectories`, which overwrites its output file);
- ``torch.optim`` optimizers and learning-rate schedulers (classes, nothing else of torch);
- environment constructors and wrappers of ``gymnasium``, ``minigrid`` and ``miniworld``
  (``gymnasium.make`` and subclasses of ``gymnasium.Env`` / ``gymnasium.Wrapper``, except the
  video recorders, which write where they are told);
- whatever the user trusts explicitly: the ``trusted_targets`` key of the command line or the
  experiment (``trusted_targets='[my_package.*]'``), never a list read from the checkpoint.

A target is judged twice: the dotted path as written must match a pattern before anything is
imported, and the object it resolves to must be *defined* where a pattern allows (its
``__module__`` and ``__qualname__``), so ``rl.tasks.gym.gym.utils.save_video`` (a path through
an imported module) is refused although it starts with ``rl.tasks.``. Strings that other code
turns into callables are judged too: ``wrappers`` given as dotted paths, and gymnasium ids of
the ``module:EnvName`` form (``gymnasium.make`` imports the module).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from rl.utils.config import import_target

# The project's packages whose callables are meant to be named in configs.
_RL_CONFIG_PACKAGES = ("tasks", "models", "pipeline", "losses", "sampling", "collection",
                       "loggers", "storage")  # fmt: skip
# Defined in an allowed package, but writes or overwrites files wherever it is told.
_DENIED = (
    "rl.storage.expert_data.generate_expert_trajectories",
    "*.RecordVideo",
    "*.RecordVideoV0",
)
# Keys whose string values are gymnasium ids (``module:EnvName`` imports the module).
_ENV_ID_KEYS = ("env_id", "id")


def _is_optim_class(obj: Any) -> bool:
    """An optimizer or learning-rate scheduler class."""
    import torch

    bases = (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)
    plateau = getattr(torch.optim.lr_scheduler, "ReduceLROnPlateau", None)
    if plateau is not None:
        bases += (plateau,)
    return inspect.isclass(obj) and issubclass(obj, bases)


def _is_env_constructor(obj: Any) -> bool:
    """``gymnasium.make``, or an environment or wrapper class."""
    import gymnasium

    if obj is gymnasium.make:
        return True
    return inspect.isclass(obj) and issubclass(obj, (gymnasium.Env, gymnasium.Wrapper))


@dataclasses.dataclass(frozen=True)
class TargetRule:
    """Callables a pattern of dotted paths allows.

    Attributes:
        pattern: An ``fnmatch`` pattern over dotted paths (``torch.optim.*``).
        kind: What the callable must be (None: anything the pattern matches).
        what: ``kind`` in words, for messages.
    """

    pattern: str
    kind: Callable[[Any], bool] | None = None
    what: str = ""

    def matches(self, path: str) -> bool:
        """Whether ``path`` matches the pattern (a pattern ``a.*`` also matches ``a``)."""
        return fnmatch.fnmatchcase(path, self.pattern) or (
            self.pattern.endswith(".*") and path == self.pattern[:-2]
        )


DEFAULT_RULES: tuple[TargetRule, ...] = (
    *(TargetRule(f"rl.{package}.*") for package in _RL_CONFIG_PACKAGES),
    TargetRule("torch.optim.*", _is_optim_class, "an optimizer or LR scheduler class"),
    *(
        TargetRule(f"{package}.*", _is_env_constructor, "an environment or wrapper class")
        for package in ("gymnasium", "minigrid", "miniworld")
    ),
)


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A callable named by a config that is not trusted.

    Attributes:
        key: Where the config names it (``task._target_``, ``task.wrappers.0``).
        target: The dotted path (or gymnasium id) as written.
        reason: Why it is refused.
    """

    key: str
    target: str
    reason: str

    def __str__(self) -> str:
        return f"{self.key}: {self.target!r} ({self.reason})"


def trust_rules(trusted_targets: Sequence[str] = ()) -> tuple[TargetRule, ...]:
    """The default rules plus one allowing anything for each user pattern."""
    return (*DEFAULT_RULES, *(TargetRule(str(p)) for p in trusted_targets))


def judge_target(path: str, rules: Sequence[TargetRule]) -> str | None:
    """Why the callable at dotted ``path`` is not trusted (None: it is).

    Nothing is imported unless ``path`` matches a rule.
    """
    if not isinstance(path, str) or not path:
        return "not a dotted path"
    if any(fnmatch.fnmatchcase(path, pattern) for pattern in _DENIED):
        return "writes files where it is told"
    if not any(rule.matches(path) for rule in rules):
        return "not in the allow-list"
    try:
        obj = import_target(path)
    except Exception as e:  # noqa: BLE001  (any failure to resolve is a refusal)
        return f"cannot be resolved: {type(e).__name__}"
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return "not a function or class"
    defined = f"{module}.{qualname}"
    if any(fnmatch.fnmatchcase(defined, pattern) for pattern in _DENIED):
        return f"defined as {defined}, which writes files where it is told"
    allowing = [rule for rule in rules if rule.matches(defined)]
    if not allowing:
        return f"defined as {defined}, outside the allow-list"
    if not any(rule.kind is None or rule.kind(obj) for rule in allowing):
        return f"not {' or '.join(sorted({r.what for r in allowing if r.what}))}"
    return None


def _judge_env_id(env_id: str, rules: Sequence[TargetRule]) -> str | None:
    """Why a gymnasium id is not trusted: ``module:EnvName`` imports an untrusted module."""
    module, sep, _ = env_id.partition(":")
    if not sep or any(rule.matches(module) and rule.kind is None for rule in rules):
        return None
    return f"imports the module {module!r}, outside the allow-list"


def _named_callables(node: Any, key: str) -> Iterator[tuple[str, str, bool]]:
    """``(key, dotted path or id, is_env_id)`` of every callable a config node names."""
    if isinstance(node, Mapping):
        if "_target_" in node:
            yield f"{key}._target_" if key else "_target_", node["_target_"], False
            for i, wrapper in enumerate(node.get("wrappers") or ()):
                if isinstance(wrapper, str):
                    yield f"{key}.wrappers.{i}", wrapper, False
            for id_key in _ENV_ID_KEYS:
                if isinstance(node.get(id_key), str):
                    yield f"{key}.{id_key}", node[id_key], True
        for k, value in node.items():
            yield from _named_callables(value, f"{key}.{k}" if key else str(k))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _named_callables(value, f"{key}.{i}" if key else str(i))


def untrusted_targets(config: Any, trusted_targets: Sequence[str] = ()) -> list[Refusal]:
    """Every callable a (saved) config names that is not trusted, with where and why.

    Every node is visited, ``_args_`` and ``_partial_`` ones included, whatever
    ``_recursive_`` says.

    Args:
        config: A plain config (dicts and lists), e.g. a checkpoint's ``config``.
        trusted_targets: Patterns the user trusts beyond the defaults (``my_package.*``).
    """
    rules = trust_rules(trusted_targets)
    refused = []
    for key, target, is_env_id in _named_callables(config, ""):
        judge = _judge_env_id if is_env_id else judge_target
        reason = judge(target, rules)
        if reason is not None:
            refused.append(Refusal(key, str(target), reason))
    return refused


def config_targets(config: Any) -> list[str]:
    """The exact dotted paths a config names (a run trusts the config it was started with)."""
    return [target for _, target, is_id in _named_callables(config, "") if not is_id]


__all__ = [
    "DEFAULT_RULES",
    "Refusal",
    "TargetRule",
    "config_targets",
    "judge_target",
    "trust_rules",
    "untrusted_targets",
]

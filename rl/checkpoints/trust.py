"""The user's ``trusted_targets``: callables a saved config may name beyond the config tree.

Patterns typed each time, never read from a file (``trusted_targets='[my_package.*]'``). A
target is judged twice: the dotted path as written must match a pattern before anything is
imported, and the object must be *defined* where a pattern allows, so ``my_package.os.system``
(a path through an imported module) is refused. Callables that write files where they are told
are refused whatever the patterns say.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Sequence

from rl.utils.config import import_target

# Callables that write or overwrite files wherever they are told: never trusted.
_DENIED = (
    "rl.storage.expert_data.generate_expert_trajectories",
    "*.RecordVideo",
    "*.RecordVideoV0",
)


@dataclasses.dataclass(frozen=True)
class TargetRule:
    """Callables an ``fnmatch`` pattern over dotted paths (``my_package.*``) allows."""

    pattern: str

    def matches(self, path: str) -> bool:
        """Whether ``path`` matches the pattern (a pattern ``a.*`` also matches ``a``)."""
        return fnmatch.fnmatchcase(path, self.pattern) or (
            self.pattern.endswith(".*") and path == self.pattern[:-2]
        )


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A callable (dotted path or gymnasium id) named at ``key`` that is refused, and why."""

    key: str
    target: str
    reason: str

    def __str__(self) -> str:
        return f"{self.key}: {self.target!r} ({self.reason})"


def trust_rules(trusted_targets: Sequence[str] = ()) -> tuple[TargetRule, ...]:
    """One rule allowing anything for each of the user's patterns."""
    return tuple(TargetRule(str(p)) for p in trusted_targets)


def judge_target(path: str, rules: Sequence[TargetRule]) -> str | None:
    """Why the callable at dotted ``path`` is not trusted (None: it is).

    Nothing is imported unless ``path`` matches a rule.
    """
    if not isinstance(path, str) or not path:
        return "not a dotted path"
    if any(fnmatch.fnmatchcase(path, pattern) for pattern in _DENIED):
        return "writes files where it is told"
    if not any(rule.matches(path) for rule in rules):
        return "no trusted_targets pattern allows it"
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
    if not any(rule.matches(defined) for rule in rules):
        return f"defined as {defined}, which no trusted_targets pattern allows"
    return None


def judge_env_id(env_id: str, rules: Sequence[TargetRule]) -> str | None:
    """Why a gymnasium id is not trusted: ``module:EnvName`` imports a module no rule allows."""
    module, sep, _ = env_id.partition(":")
    if not sep or any(rule.matches(module) for rule in rules):
        return None
    return f"imports the module {module!r}, which no trusted_targets pattern allows"

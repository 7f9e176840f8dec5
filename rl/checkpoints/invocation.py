"""Values a saved config never chooses: they belong to the command that runs, not to the file.

Network endpoints and authentication switches (a saved ``address: ray://...`` would join that
cluster and hand it the user's Ray token), loggers (a saved ``logger=wandb`` would upload
there), paths of files read or written, generated data and resource sizes take the value this
command gives them (:func:`invocation_only`; the table: docs/concepts/checkpoints.md). Where a
run's value shapes the run itself (:data:`RUN_SHAPE`), ``resume=`` refuses a difference.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

# Keys of the invocation itself: never part of a saved run's config.
INVOCATION_KEYS = ("output_dir", "resume", "init_from", "trusted_targets")
# Config groups whose choice a saved run never makes.
INVOCATION_GROUPS = ("logger",)

# Dotted-path patterns (``fnmatch``; a pattern covers everything below it) and why each is
# the command's to give.
_INVOCATION_ONLY: tuple[tuple[str, str], ...] = (
    ("collector.address", "a network address"),
    ("collector.allow_unauthenticated", "an authentication switch"),
    ("logger", "loggers and their remote settings"),
    ("pipeline.*data_iterator.path", "a file path"),
    ("pipeline.*data_iterator.generate", "generated data"),
    ("sampler.num_envs", "a resource size"),
    ("sampler.num_processes", "a resource size"),
    ("sampler.envs_per_process", "a resource size"),
    ("collector.num_workers", "a resource size"),
    ("collector.cpus_per_worker", "a resource size"),
    ("collector.gpus_per_worker", "a resource size"),
    ("collector.memory_per_worker", "a resource size"),
    ("distributed.world_size", "a resource size"),
    ("eval.num_envs", "a resource size"),
    ("eval.num_episodes", "a resource size"),
    ("valid.num_envs", "a resource size"),
    ("valid.num_episodes", "a resource size"),
    ("valid.torch_threads", "a resource size"),
    ("torch_threads", "a resource size"),
)
# Keys named like a network endpoint, wherever they are (a task's simulator server included).
_ADDRESS_NAMES = frozenset({"address", "host", "hostname", "port", "url", "uri", "endpoint"})
# Of those, the sizes that shape a run: a resumed run with other values would be another run.
RUN_SHAPE = (
    "sampler.num_envs",
    "sampler.num_processes",
    "sampler.envs_per_process",
    "collector.num_workers",
    "distributed.world_size",
)


def invocation_only(path: str) -> str | None:
    """Why the config key at dotted ``path`` (``pipeline.stages.0.gamma``) is the command's."""
    if not path:
        return None
    parts = path.split(".")
    if parts[-1] == "allow_unauthenticated":
        return "an authentication switch"
    if parts[-1] in _ADDRESS_NAMES:
        return "a network address"
    prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern, why in _INVOCATION_ONLY:
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            return why
    return None


def withhold(node: Any, path: str = "") -> tuple[Any, dict[str, Any]]:
    """``(a copy of node without its invocation-only keys, {dotted path: value} of those)``."""
    withheld: dict[str, Any] = {}

    def keep(value: Any, key: str) -> Any:
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                child = f"{key}.{k}" if key else str(k)
                if invocation_only(child):
                    withheld[child] = v
                else:
                    out[k] = keep(v, child)
            return out
        if isinstance(value, list):
            return [keep(v, f"{key}.{i}" if key else str(i)) for i, v in enumerate(value)]
        return value

    return keep(node, path), withheld


def value_at(node: Any, path: str, default: Any = None) -> Any:
    """The value at dotted ``path`` in nested dicts and lists (``default`` if absent)."""
    for part in path.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return default
    return node


def invocation_paths(node: Any) -> list[str]:
    """The dotted paths of ``node`` (a config) that :func:`invocation_only` names, outermost."""
    return list(withhold(node)[1])


def drop_generation(config: dict[str, Any]) -> None:
    """In place: a resumed run's data iterators never generate a missing data file.

    The resumed run reads the data the run was trained on, or fails naming the file.
    """
    pipeline = config.get("pipeline")
    stages = pipeline.get("stages") if isinstance(pipeline, dict) else None
    for stage in stages if isinstance(stages, list) else ():
        component = stage.get("offpolicy_component") if isinstance(stage, dict) else None
        iterator = component.get("data_iterator") if isinstance(component, dict) else None
        if isinstance(iterator, dict) and "generate" in iterator:
            iterator["generate"] = None

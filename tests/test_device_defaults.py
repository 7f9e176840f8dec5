"""No silent ``"cpu"`` device default below the composition root.

The composition roots (``rl.engine.run``, ``rl.evaluation.runs``, ``rl.api``) read the device
from the config and hand it to everything they build; a ``device="cpu"`` default further down
would let a forgotten argument silently mean the CPU. This test imports every module under
``rl/``, inspects every function's, method's and class's signature, and fails naming each
parameter called ``device`` or ``map_location`` whose default is the CPU, except the few
user-facing entry points whose documented behaviour is the CPU (``ALLOWED``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

import rl

# User-facing entry points that keep a documented CPU default (see their docstrings).
ALLOWED = {
    # Loading onto the CPU is the documented safe behaviour for reading a checkpoint file.
    "rl.checkpoints.files.load_checkpoint",
    # The deployment API for a user's own program: CPU unless they ask for another device.
    "rl.evaluation.inference.InferenceAgent.__init__",
    "rl.evaluation.inference.InferenceAgent.from_checkpoint",
}

NAMES = ("device", "map_location")


def is_cpu(default: Any) -> bool:
    if isinstance(default, str):
        return default == "cpu"
    return isinstance(default, torch.device) and default.type == "cpu"


def modules() -> Iterator[ModuleType]:
    yield rl
    for info in pkgutil.walk_packages(rl.__path__, prefix="rl."):
        yield importlib.import_module(info.name)


def callables(module: ModuleType) -> Iterator[tuple[str, Any]]:
    """Each function and class defined in ``module`` and, for a class, its methods."""
    for value in vars(module).values():
        if getattr(value, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(value):
            yield f"{module.__name__}.{value.__qualname__}", value
        elif inspect.isclass(value):
            yield from class_members(value)


def class_members(cls: type) -> Iterator[tuple[str, Any]]:
    prefix = f"{cls.__module__}.{cls.__qualname__}"
    for name, value in vars(cls).items():
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        elif isinstance(value, property):
            continue
        if inspect.isfunction(value):
            yield f"{prefix}.{name}", value
        elif inspect.isclass(value) and value.__module__ == cls.__module__:
            yield from class_members(value)
    if dataclasses.is_dataclass(cls):
        # A settings dataclass read from YAML: its fields (the generated __init__ says the same).
        for field in dataclasses.fields(cls):
            if field.name in NAMES and field.default is not dataclasses.MISSING:
                yield f"{prefix}.{field.name}", field.default


def cpu_defaults() -> list[str]:
    found = []
    for module in modules():
        for qualname, value in callables(module):
            if not callable(value):
                if is_cpu(value):
                    found.append(qualname)
                continue
            try:
                parameters = inspect.signature(value).parameters
            except (TypeError, ValueError):
                continue
            for name in NAMES:
                parameter = parameters.get(name)
                if parameter is not None and is_cpu(parameter.default):
                    found.append(qualname)
    return sorted(set(found))


def test_no_cpu_default_below_the_composition_root() -> None:
    found = cpu_defaults()
    unexpected = [name for name in found if name not in ALLOWED]
    assert not unexpected, (
        "a device defaulted to the CPU below the composition root:\n" + "\n".join(unexpected)
    )


def test_the_allowlist_is_not_stale() -> None:
    found = set(cpu_defaults())
    assert ALLOWED <= found, sorted(ALLOWED - found)

"""Starting a process without ``torch._dynamo``: its import is about 2 CPU-s of every start.

Two things import ``torch._dynamo`` while modules load, long before anything compiles:

- tensordict marks a few of its functions for ``torch.compile`` when it is imported
  (``torch.compiler.allow_in_graph``, ``torch.compiler.assume_constant_result``), and each of
  those calls imports dynamo;
- ``torch.compiler.disable``, which keeps the recurrent cores eager under ``pipeline.compile``.

Both only matter once something compiles, and compiling imports ``torch._dynamo``. So
:func:`install` (run by ``rl/__init__.py``, before any module of ``rl`` imports tensordict)
adds an import hook that imports tensordict with those two marks recorded instead of applied,
and applies them the moment ``torch._dynamo`` has been imported: by ``torch.compile``
(``pipeline.compile``), or by anyone. A compiled run therefore sees exactly the marks it would
have had; a process that never compiles pays for dynamo only if it builds a ``torch.optim``
optimizer (torch imports dynamo then). ``evaluate.py``, the sampler's fork server, process and
Ray collection workers and validation start about 2 CPU-s sooner (``import rl.engine.run``:
5.8 s to 3.1 on the 2-core CI machine, 2026-12; docs/speed.md); ``train.py`` and DDP ranks
still load dynamo with their optimizer.

Where ``torch._dynamo`` is already imported (a user imported it first), nothing is deferred:
the marks go straight through. ``tests/test_startup.py`` checks both halves: no module of
``rl`` imports dynamo, and once it is imported tensordict carries every mark it would have.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any, TypeVar

_DYNAMO = "torch._dynamo"
_DEFERRED_IMPORTS = ("tensordict",)  # imported with the compile marks recorded
_F = TypeVar("_F", bound=Callable[..., Any])

_on_dynamo: list[Callable[[], None]] = []  # run once torch._dynamo has been imported
_finder: _Finder | None = None  # the import hook, until torch._dynamo is imported through it


def dynamo_loaded() -> bool:
    """Whether ``torch._dynamo`` has been imported (and every deferred mark applied)."""
    return _finder is None and _DYNAMO in sys.modules


def when_dynamo_loads(callback: Callable[[], None]) -> None:
    """Run ``callback`` once ``torch._dynamo`` has been imported (now, if it already has)."""
    if dynamo_loaded():
        callback()
    else:
        _on_dynamo.append(callback)


def eager_under_compile(fn: _F) -> _F:
    """``torch.compiler.disable(fn)``, without importing dynamo until something does.

    The returned function calls ``fn``; once ``torch._dynamo`` is imported it calls
    ``torch.compiler.disable(fn)`` instead, which dynamo runs eagerly (a graph break).
    """
    target: list[Callable[..., Any]] = [fn]

    def disable() -> None:
        import torch

        target[0] = torch.compiler.disable(fn)

    when_dynamo_loads(disable)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return target[0](*args, **kwargs)

    return call  # type: ignore[return-value]


def _apply_deferred() -> None:
    global _finder
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    _finder = None  # one dynamo per process: nothing is deferred from here on
    callbacks, _on_dynamo[:] = list(_on_dynamo), []
    for callback in callbacks:
        callback()


@contextmanager
def _compile_marks_recorded() -> Iterator[None]:
    """``torch.compiler``'s two marking functions record their calls for later, inside."""
    import torch.compiler

    if dynamo_loaded():
        yield
        return
    real = {
        name: getattr(torch.compiler, name)
        for name in ("allow_in_graph", "assume_constant_result")
    }

    def recorder(name: str) -> Callable[[Any], Any]:
        def mark(fn: Any) -> Any:
            if dynamo_loaded():
                return real[name](fn)
            when_dynamo_loads(lambda: real[name](fn))
            return fn  # both marks return the function they mark, unchanged

        return mark

    for name in real:
        setattr(torch.compiler, name, recorder(name))
    try:
        yield
    finally:
        for name, function in real.items():
            setattr(torch.compiler, name, function)


class _Loader(importlib.abc.Loader):
    """Another loader's module, executed inside ``around`` (and ``then`` called after)."""

    def __init__(
        self,
        inner: importlib.abc.Loader,
        around: Callable[[], Any] | None = None,
        then: Callable[[], None] | None = None,
    ) -> None:
        self._inner, self._around, self._then = inner, around, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        if self._around is None:
            self._inner.exec_module(module)
        else:
            with self._around():
                self._inner.exec_module(module)
        if self._then is not None:
            self._then()

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loaders of tensordict (marks recorded) and ``torch._dynamo`` (marks applied)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _DYNAMO and fullname not in _DEFERRED_IMPORTS:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None:
            return spec
        if fullname == _DYNAMO:  # the marks, once it has been imported (not if that fails)
            spec.loader = _Loader(spec.loader, then=_apply_deferred)
        else:
            spec.loader = _Loader(spec.loader, around=_compile_marks_recorded)
        return spec


def install() -> None:
    """Defer ``torch._dynamo`` until something imports it (idempotent; see the module doc)."""
    global _finder
    if _finder is not None or _DYNAMO in sys.modules:
        return
    _finder = _Finder()
    sys.meta_path.insert(0, _finder)

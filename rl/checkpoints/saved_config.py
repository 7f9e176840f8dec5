"""A config read from a checkpoint or a run folder: data only, rebuilt on the user's config tree.

Nothing in a saved config is ever turned into code (docs/concepts/checkpoints.md, "Trust"). It
is loaded as bounded data (:func:`config_data`), then laid over the user's ``conf/`` composed
with the run's group choices (:func:`rebuild_config`): each value of the kind the tree has at its
place, never the command's own values (:mod:`.invocation`), and every callable the one the tree
names there or one the user's ``trusted_targets`` allow (:mod:`.trust`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from omegaconf import OmegaConf

from rl.checkpoints.config_tree import ConfigTree
from rl.checkpoints.errors import CheckpointError, UntrustedCheckpointError
from rl.checkpoints.invocation import (
    INVOCATION_GROUPS,
    INVOCATION_KEYS,
    invocation_only,
    withhold,
)
from rl.checkpoints.migrations import migrate
from rl.checkpoints.trust import Refusal, judge_env_id, judge_target, trust_rules

# Bounds of a saved config: far above any real config (the largest experiment has ~600 nodes
# and ~4,000 characters).
MAX_NODES = 100_000
MAX_DEPTH = 48
MAX_STRING = 65_536
MAX_CHARS = 2**20  # characters of every string and key, counted as a tree
# Keys Hydra's ``instantiate`` honours (``_target_``, ``_args_``, ``_partial_``, ...).
_META_RE = re.compile(r"^_[a-z]+_$")
# Keys whose strings name code: wrappers as dotted paths, gymnasium ids (``module:Env``).
_WRAPPER_KEYS = ("wrappers",)
_ENV_ID_KEYS = ("env_id", "id")


def _key(parent: str, child: object) -> str:
    return f"{parent}.{child}" if parent else str(child)


def config_data(node: Any, where: str) -> Any:
    """A plain copy of ``node`` (what file ``where`` holds) if it is config data.

    Data is dicts with string keys, lists (tuples become lists) and scalars; anything else is
    an :class:`UntrustedCheckpointError` (a crafted file, never skipped as damaged). Nodes and
    characters are counted as a tree, so a 1 KB file of shared references ``x = [x, x]`` is
    refused at once, not expanded; no string holds ``${`` (a saved config is never resolved).
    """
    count = chars = 0
    on_path: set[int] = set()

    def text(value: str, key: str) -> str:
        nonlocal chars
        chars += len(value)
        if chars > MAX_CHARS:
            raise UntrustedCheckpointError(
                f"{where}: the saved config's strings and keys add up to more than "
                f"{MAX_CHARS:,} characters (counted as a tree, at {key or '<root>'}); refused"
            )
        return value

    def copy(value: Any, key: str, depth: int) -> Any:
        nonlocal count
        count += 1
        if count > MAX_NODES:
            raise UntrustedCheckpointError(
                f"{where}: the saved config has more than {MAX_NODES:,} nodes (counted as a "
                "tree); refused"
            )
        if depth > MAX_DEPTH:
            raise UntrustedCheckpointError(
                f"{where}: the saved config is nested more than {MAX_DEPTH} levels deep "
                f"(at {key}); refused"
            )
        kind = type(value)
        if value is None or kind in (bool, int, float):
            return value
        if kind is str:
            if len(value) > MAX_STRING:
                raise UntrustedCheckpointError(
                    f"{where}: {key or '<root>'} is a string of {len(value):,} characters"
                )
            if "${" in value:
                raise UntrustedCheckpointError(
                    f"{where}: {key or '<root>'} holds an interpolation ({value[:80]!r}); a "
                    "saved config is data and is never resolved"
                )
            return text(value, key)
        if kind not in (dict, list, tuple):
            raise UntrustedCheckpointError(
                f"{where}: {key or '<root>'} is a {kind.__name__}, not config data"
            )
        if id(value) in on_path:
            raise UntrustedCheckpointError(f"{where}: {key or '<root>'} contains itself; refused")
        on_path.add(id(value))
        try:
            if kind is dict:
                out = {}
                for k, v in value.items():
                    if type(k) is not str:
                        raise UntrustedCheckpointError(
                            f"{where}: a key of {key or '<root>'} is a {type(k).__name__} "
                            f"({k!r}), not a string"
                        )
                    out[text(k, key)] = copy(v, _key(key, k), depth + 1)
                return out
            return [copy(v, _key(key, i), depth + 1) for i, v in enumerate(value)]
        finally:
            on_path.discard(id(value))

    return copy(node, "", 0)


def _kind(value: Any) -> str | None:
    """The kind of a config value, as :func:`_overlay` compares them (None: None)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    kinds: dict[type, str] = {str: "a string", dict: "a mapping", list: "a list"}
    return kinds.get(type(value), "data")


def _check_kind(tree: Any, saved: Any, key: str, where: str) -> None:
    """Refuse a saved value of another kind than the tree's at its place (None fits anywhere).

    The judge and the code that uses a config read each value as the kind the tree gives it: a
    mapping saved where the tree has a list of wrappers would be iterated as one. A list of
    another length holds elements of the kind the tree's elements share, if they share one.
    """
    ours, theirs = _kind(tree), _kind(saved)
    if ours is not None and theirs is not None and ours != theirs:
        raise UntrustedCheckpointError(
            f"{where}: {key or '<root>'} is {theirs} ({json.dumps(saved)[:80]}) where your "
            f"config tree has {ours}; a saved value must be of the kind your tree has at its "
            "place (a run trained with such an override is resumed by typing it again)"
        )
    if isinstance(tree, list) and isinstance(saved, list) and len(tree) != len(saved):
        model = next((v for v in tree if v is not None), None)
        if model is not None and len({_kind(v) for v in tree} - {None}) == 1:
            for i, value in enumerate(saved):
                _check_kind(model, value, _key(key, i), where)


def _overlay(raw: Any, tree: Any, saved: Any, key: str, where: str) -> Any:
    """``raw`` (the user's config there, unresolved; ``tree`` resolved) with ``saved`` laid over.

    A leaf equal to the saved value keeps the user's node (an interpolation stays one); another
    saved value replaces it. Inside a ``_target_`` node, keys the saved config lacks are dropped
    (the run used the callable's default), but for the command's own (withheld from ``saved``);
    settings it lacks keep the tree's value.
    """
    _check_kind(tree, saved, key, where)
    if isinstance(raw, dict) and isinstance(saved, dict) and isinstance(tree, dict):
        out = {}
        for k, v in raw.items():
            if k in saved:
                out[k] = _overlay(v, tree.get(k), saved[k], _key(key, k), where)
            elif "_target_" not in raw or _META_RE.match(k) or invocation_only(_key(key, k)):
                out[k] = v
        out.update({k: v for k, v in saved.items() if k not in raw})
        return out
    if (
        isinstance(raw, list) and isinstance(saved, list) and isinstance(tree, list)
        and len(raw) == len(saved) == len(tree)
    ):  # fmt: skip
        return [
            _overlay(*x, _key(key, i), where)
            for i, x in enumerate(zip(raw, tree, saved, strict=True))
        ]
    if (type(tree) is type(saved) and tree == saved) or (isinstance(raw, str) and "${" in raw):
        return raw  # (an interpolation the saved values do not follow is pinned afterwards)
    return saved


def _pin(merged: Any, resolved: Any, saved: Any) -> Any:
    """``merged`` with each interpolation whose value is not the saved one replaced by it.

    The interpolations that follow the saved values (a stage budget of ``${total_env_steps}``
    once ``total_env_steps`` is the saved one) stay, so a resumed run's new budget moves them.
    """
    if isinstance(merged, dict) and isinstance(resolved, dict) and isinstance(saved, dict):
        return {
            k: _pin(v, resolved.get(k), saved[k]) if k in saved else v for k, v in merged.items()
        }
    if (
        isinstance(merged, list) and isinstance(resolved, list) and isinstance(saved, list)
        and len(merged) == len(resolved) == len(saved)
    ):  # fmt: skip
        return [_pin(*x) for x in zip(merged, resolved, saved, strict=True)]
    if (
        isinstance(merged, str)
        and "${" in merged
        and not (type(resolved) is type(saved) and resolved == saved)
    ):
        return saved
    return merged


def _refusals(node: Any, tree: Any, key: str, rules: Sequence[Any]) -> Iterator[Refusal]:
    """What ``node`` names as code that the user's config (``tree``) does not name there."""
    if isinstance(node, dict):
        mine = tree if isinstance(tree, dict) else {}
        target = node.get("_target_")
        trusted = bool(rules) and isinstance(target, str) and judge_target(target, rules) is None
        for k, v in node.items():
            if _META_RE.match(k) and not trusted and (k not in mine or mine[k] != v):
                why = (
                    f"your config tree names {mine[k]!r} here"
                    if k in mine
                    else "your config tree names nothing here"
                )
                yield Refusal(_key(key, k), json.dumps(v)[:200], why)
        for k in _WRAPPER_KEYS:
            listed = mine.get(k)
            ours = listed if isinstance(listed, list) else []
            wrappers = node.get(k)
            if wrappers is not None and not isinstance(wrappers, list):
                yield Refusal(_key(key, k), json.dumps(wrappers)[:200], "not a list of wrappers")
                continue
            for i, w in enumerate(wrappers or ()):
                if isinstance(w, str) and w not in ours:
                    reason = judge_target(w, rules) if rules else "not in your config tree"
                    if reason is not None:
                        yield Refusal(_key(key, f"{k}.{i}"), w, reason)
        for k in _ENV_ID_KEYS:
            value = node.get(k)
            if isinstance(value, str) and value != mine.get(k):
                reason = judge_env_id(value, rules)
                if reason is not None:
                    yield Refusal(_key(key, k), value, reason)
        for k, v in node.items():
            yield from _refusals(v, mine.get(k), _key(key, k), rules)
    elif isinstance(node, list):
        ours = tree if isinstance(tree, list) else []
        for i, v in enumerate(node):
            yield from _refusals(v, ours[i] if i < len(ours) else None, _key(key, i), rules)


def _resolve(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    try:
        out = OmegaConf.to_container(OmegaConf.create(dict(raw)), resolve=True)
    except Exception as e:  # noqa: BLE001  (an interpolation of the tree that cannot resolve)
        raise CheckpointError(f"{where}: the rebuilt config does not resolve: {e}") from e
    assert isinstance(out, dict)
    return {str(k): v for k, v in out.items()}


@dataclasses.dataclass(frozen=True)
class RebuiltConfig:
    """A saved run's config, rebuilt on the user's config tree.

    Attributes:
        config: Resolved, ready to build from.
        unresolved: The same with the tree's interpolations kept (``${total_env_steps}``).
        choices: The config group choices it was composed with.
        withheld: The saved values that are the command's to give, by dotted path (``config``
            holds the tree's there).
    """

    config: dict[str, Any]
    unresolved: dict[str, Any]
    choices: dict[str, str]
    withheld: dict[str, Any] = dataclasses.field(default_factory=dict)


def rebuild_config(
    saved: Mapping[str, Any],
    choices: Mapping[str, str] | None,
    where: str,
    *,
    trusted_targets: Sequence[str] = (),
    tree: ConfigTree | None = None,
    built: Sequence[str] | None = None,
    overrides: Sequence[str] = (),
    sources: Mapping[str, Any] | None = None,
) -> RebuiltConfig:
    """Rebuild a saved run's config on the user's config tree (see the module's docstring).

    Args:
        saved: The saved resolved config, as data (:func:`config_data`).
        choices: The config group choices saved with it (None: the tree's defaults; an older
            checkpoint's, or a run built without Hydra).
        where: The file, for messages.
        trusted_targets: The user's patterns of callables a saved config may name where their
            config tree names another (``my_package.*``).
        tree: The user's config tree (default: this invocation's, :meth:`ConfigTree.current`).
        built: The sections that will be built (evaluation: ``task`` and ``model``); only
            they are judged (None: every section, as for ``resume=``).
        overrides: Overrides typed by the user now (``task.wrappers=[my.Wrapper]``), composed
            into the tree: what they name is the user's to name.
        sources: Where the run's configs came from, as recorded: only quoted in a message
            when the tree lacks one of its choices, never composed.

    Raises:
        UntrustedCheckpointError: The saved config names code the tree does not name there,
            or holds a value of another kind than the tree's.
        CheckpointError: A choice the tree lacks.
    """
    saved, choices = migrate(saved, choices)
    if choices is not None:
        choices = {
            g: o for g, o in choices.items() if g.partition("@")[0] not in INVOCATION_GROUPS
        }
    raw, used = (tree or ConfigTree.current()).compose(choices, where, overrides, sources)
    # The command's own values (addresses, loggers, paths, sizes) stay the tree's.
    data, withheld = withhold({k: v for k, v in saved.items() if k not in INVOCATION_KEYS})
    # This invocation's keys, not the tree's (``output_dir: ${hydra:runtime.output_dir}``).
    output_dir = saved.get("output_dir")
    raw.update(
        output_dir=output_dir if isinstance(output_dir, str) else None,
        resume=None,
        init_from=None,
        trusted_targets=list(trusted_targets),
    )
    raw = fill_app_interpolations(raw, data)
    resolved_tree = _resolve(raw, where)
    merged = _overlay(raw, resolved_tree, data, "", where)
    merged = _pin(merged, _resolve(merged, where), data)
    config = _resolve(merged, where)
    rules = trust_rules(trusted_targets) if trusted_targets else ()
    judged = config if built is None else {k: config[k] for k in built if k in config}
    for section in built or ():
        if not isinstance(config.get(section), dict):
            raise UntrustedCheckpointError(f"{where}: its saved {section!r} is not a mapping")
    refused = list(_refusals(judged, resolved_tree, "", rules))
    if refused:
        raise UntrustedCheckpointError(
            f"{where}: its saved config names code that your config tree does not name there "
            f"(rebuilt with {', '.join(f'{g}={o}' for g, o in sorted(used.items()))}):\n  "
            + "\n  ".join(map(str, refused))
            + "\nOnly if you know where this checkpoint comes from and that it is your own task "
            "or model, allow your package's callables by a pattern you type yourself, e.g. "
            "trusted_targets='[my_package.*]' (see docs/concepts/checkpoints.md)"
        )
    return RebuiltConfig(config, merged, used, withheld)


def fill_app_interpolations(node: Any, values: Any) -> Any:
    """``node`` with each app-only ``${hydra:...}``/``${now:...}`` replaced by ``values`` there."""
    if isinstance(node, dict):
        olds = values if isinstance(values, dict) else {}
        return {k: fill_app_interpolations(v, olds.get(k)) for k, v in node.items()}
    if isinstance(node, list):
        if not (isinstance(values, list) and len(values) == len(node)):
            values = [None] * len(node)
        return [fill_app_interpolations(v, o) for v, o in zip(node, values, strict=True)]
    if isinstance(node, str) and ("${hydra:" in node or "${now:" in node):
        return values
    return node

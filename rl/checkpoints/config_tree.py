"""Config group choices and the user's config tree a saved config is rebuilt on.

A run records its group choices in the order they were typed (:func:`run_choices`); a
checkpoint's are read back as names only (:func:`saved_choices`); :class:`ConfigTree` composes
the user's ``conf/`` with them.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rl.checkpoints.errors import CheckpointError, UntrustedCheckpointError

# A config group or option name: path segments of letters, digits, ``_``, ``-`` and ``.``.
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$")
# A group chosen in an option's own defaults list, at a package of its own: ``model@model.policy``.
_PACKAGE_RE = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")
_PROJECT_CONF = Path(__file__).resolve().parents[2] / "conf"
# Bounds of a checkpoint's recorded config sources (a search path has a few entries).
_MAX_SOURCES = 32
_MAX_SOURCE_CHARS = 4096
# Trees composed in this process, by everything a composition reads (ConfigTree._cache_key):
# evaluating a run's checkpoints composes the same tree again and again (0.3 s or more each).
# A tree larger than the bounds (a search path entry that is a home folder) is composed anew.
_COMPOSED: collections.OrderedDict[tuple[Any, ...], tuple[Any, ...]] = collections.OrderedDict()
_COMPOSED_LOCK = threading.Lock()
_MAX_COMPOSED = 32
_MAX_TREE_FILES = 2000
_MAX_TREE_BYTES = 16 * 2**20


def saved_choices(value: Any, where: str) -> dict[str, str] | None:
    """Config group choices as saved (``{"task": "nav_small", ...}``), checked as names.

    Raises:
        UntrustedCheckpointError: Not a mapping of group names to option names.
    """
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > 256:
        raise UntrustedCheckpointError(
            f"{where}: its config group choices are not a mapping of names"
        )
    out = {}
    for group, option in value.items():
        if option is None:
            continue
        if not _is_choice(group, option):
            raise UntrustedCheckpointError(
                f"{where}: config group choice {group!r}: {option!r} is not a group and option "
                "name"
            )
        out[group] = option
    return out


def _is_choice(group: Any, option: Any) -> bool:
    """Whether ``group: option`` names a config group (at a package of its own) and an option."""
    if not (isinstance(group, str) and isinstance(option, str)):
        return False
    name, at, package = group.partition("@")
    names = all(_NAME_RE.match(s) and ".." not in s for s in (name, option))
    return names and (not at or _PACKAGE_RE.match(package) is not None)


def ordered_choices(choices: Any, overrides: Any) -> dict[str, str] | None:
    """Hydra's ``runtime.choices``, those typed first and in order, Hydra's own left out.

    Appended groups (``+experiment=ppo_nav +debug=smoke``) apply in the order they were typed.
    """
    if not isinstance(choices, Mapping):
        return None
    typed = []
    for item in overrides if isinstance(overrides, (list, tuple)) else ():
        group = str(item).split("=", 1)[0].lstrip("~+").split("@", 1)[0]
        if group in choices and group not in typed:
            typed.append(group)
    order = [*typed, *(g for g in choices if g not in typed)]
    return {
        str(g): str(choices[g])
        for g in order
        if choices[g] is not None and not (str(g) == "hydra" or str(g).startswith("hydra/"))
    }


def run_choices(cfg: DictConfig | Mapping[str, Any]) -> dict[str, str] | None:
    """The config group choices of the composed config ``cfg`` (None: not composed by Hydra)."""
    hydra = _hydra_node(cfg)
    if hydra is None:
        return None
    return ordered_choices(
        OmegaConf.to_container(hydra.runtime.choices), list(hydra.overrides.task)
    )


def config_sources(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any] | None:
    """Where the composed config ``cfg`` came from (:func:`run_sources`; None: not by Hydra)."""
    hydra = _hydra_node(cfg)
    return None if hydra is None else run_sources(hydra)


def _hydra_node(cfg: DictConfig | Mapping[str, Any]) -> Any:
    """``cfg.hydra`` when the config carries it, else the running Hydra app's (None: none).

    Only while an app runs: a ``HydraConfig`` left by an earlier composition is not this one's.
    """
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    if isinstance(cfg, DictConfig) and "hydra" in cfg:
        return cfg.hydra
    if HydraConfig.initialized() and GlobalHydra.instance().is_initialized():
        return HydraConfig.get()
    return None


@dataclasses.dataclass(frozen=True)
class ConfigTree:
    """The user's config tree: where :func:`rebuild_config` composes a saved run's config.

    A primary folder (``conf/``) and Hydra search path entries. Both come from the invocation,
    never from a checkpoint: a run records where its configs came from (:func:`run_sources`)
    only so that a message can say what to type.

    Attributes:
        config_dir: The primary folder (None: the running Hydra app's, else the project's own
            ``conf/``).
        config_name: The primary config of training runs.
        searchpath: Hydra search path entries composed with it (``file:///home/me/my_conf``,
            ``pkg://my_package.conf``), as ``hydra.searchpath`` takes them.
    """

    config_dir: str | Path | None = None
    config_name: str = "train"
    searchpath: tuple[str, ...] = ()

    @classmethod
    def current(cls) -> ConfigTree:
        """The tree of this invocation: the running (or last composed) Hydra config's.

        Outside a running app its primary folder too; the project's ``conf/`` when nothing was
        composed.
        """
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return cls()
        sources = run_sources(HydraConfig.get())
        if GlobalHydra.instance().is_initialized():  # (its primary folder is the app's own)
            return cls(searchpath=tuple(sources["searchpath"]))
        return cls(sources["config_dir"], searchpath=tuple(sources["searchpath"]))

    @contextlib.contextmanager
    def _hydra(self) -> Iterator[Any]:
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        if self.config_dir is None and GlobalHydra.instance().is_initialized():
            yield GlobalHydra.instance()
            return
        folder = Path(self.config_dir or _PROJECT_CONF).expanduser().resolve()
        if not (folder / f"{self.config_name}.yaml").is_file():
            raise CheckpointError(
                f"no {self.config_name}.yaml in {folder}: a saved config is rebuilt on your "
                "config tree; give its folder (config_dir=...)"
            )
        gh = GlobalHydra.instance()
        outer = gh.hydra if gh.is_initialized() else None  # an app's, restored afterwards
        gh.clear()
        try:
            with initialize_config_dir(version_base="1.3", config_dir=str(folder)):
                yield GlobalHydra.instance()
        finally:
            if outer is not None:
                GlobalHydra.instance().clear()
                GlobalHydra.instance().initialize(outer)

    def _searchpath_override(self) -> list[str]:
        """``hydra.searchpath=[...]`` for :func:`hydra.compose` (none without a search path)."""
        if not self.searchpath:
            return []
        quoted = ",".join(_quoted(entry) for entry in self.searchpath)
        return [f"hydra.searchpath=[{quoted}]"]

    def compose(
        self,
        choices: Mapping[str, str] | None,
        where: str,
        overrides: Sequence[str] = (),
        recorded: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The tree's config (interpolations kept) with ``choices``, and the choices it used.

        ``overrides`` (typed by the user now) are composed after the choices; one the run's
        groups cannot take is left out. ``recorded`` (the run's sources) is only quoted in the
        message of a choice the tree lacks. A composition is cached while the tree's files are
        unchanged; each call gets its own copy.

        Raises:
            CheckpointError: A choice names an option the tree does not have.
        """
        held = _store_nodes()  # (alive while keys name them by identity)
        key = self._cache_key(choices, overrides)
        if key is not None:
            with _COMPOSED_LOCK:
                kept = _COMPOSED.get(key)
                if kept is not None:
                    _COMPOSED.move_to_end(key)
            if kept is not None:
                return copy.deepcopy(kept[0]), dict(kept[1])
        raw, used = self._compose(choices, where, overrides, recorded)
        if key is not None and key == self._cache_key(choices, overrides):  # (files unchanged)
            with _COMPOSED_LOCK:
                _COMPOSED[key] = (copy.deepcopy(raw), dict(used), held)
                while len(_COMPOSED) > _MAX_COMPOSED:
                    _COMPOSED.popitem(last=False)
        return raw, used

    def _cache_key(
        self, choices: Mapping[str, str] | None, overrides: Sequence[str]
    ) -> tuple[Any, ...] | None:
        """Everything :meth:`_compose` reads, as a key of :data:`_COMPOSED` (None: not kept).

        The working folder, the tree's folders and every YAML file's bytes, Hydra's config
        store (its nodes by identity: an entry holds them), the choices and overrides in order.
        Not kept: a running app's tree, a search path entry that is not a folder or a package of
        folders, a search path set in an override or a YAML file (its folders are not read for
        the key), an interpolation in an override or a defaults list (it may read the
        environment: ``${oc.env:...}``). Hydra's own configs and plugins are fixed per process.
        """
        from hydra.core.global_hydra import GlobalHydra

        if self.config_dir is None and GlobalHydra.instance().is_initialized():
            return None
        if any("${" in str(o) or "searchpath" in str(o) for o in overrides):
            return None
        folders = [Path(self.config_dir or _PROJECT_CONF).expanduser().resolve()]
        for entry in self.searchpath:
            folder = _entry_folder(entry)
            if folder is None:
                return None
            folders.append(folder)
        prints = [_folder_print(folder) for folder in folders]
        if None in prints:
            return None
        return (
            os.getcwd(),
            str(folders[0]),
            self.config_name,
            self.searchpath,
            tuple(prints),
            tuple((path, id(node)) for path, node in _store_nodes()),
            None if choices is None else tuple(choices.items()),
            tuple(overrides),
        )

    def _compose(
        self,
        choices: Mapping[str, str] | None,
        where: str,
        overrides: Sequence[str],
        recorded: Mapping[str, Any] | None,
    ) -> tuple[dict[str, Any], dict[str, str]]:
        from hydra import compose

        search = self._searchpath_override()
        with self._hydra() as gh:
            base = compose(self.config_name, search, return_hydra_config=True)
            defaults = run_choices(base) or {}
            appended: list[str] = []
            replaced: list[str] = []
            packaged: dict[str, str] = {}  # groups at a package of their own
            group_options = _group_options(gh, self.config_name, search)
            for group, option in (choices or {}).items():  # (in the order they were typed)
                # Every choice is passed, defaults too: an experiment may override a group
                # that the run then set back to its default.
                options = group_options(group.partition("@")[0])  # (model@model.policy)
                if option not in options:
                    if defaults.get(group) == option:
                        continue  # an optional default the tree lacks (``optional local``)
                    raise CheckpointError(
                        f"{where}: the run used {group}={option}, which your config tree has no "
                        f"option for ({', '.join(options) or 'no such group'})"
                        + self._missing_sources_hint(recorded)
                    )
                if group in defaults:
                    replaced.append(f"{group}={option}")
                elif "@" in group:  # in an option's defaults, or appended (decided below)
                    packaged[group] = option
                else:
                    appended.append(f"+{group}={option}")
            if packaged:  # those the other choices' options choose are replaced, others added
                so_far = [*search, *appended, *replaced]
                options_chose = (
                    run_choices(compose(self.config_name, so_far, return_hydra_config=True)) or {}
                )
                for group, option in packaged.items():
                    if group in options_chose:
                        replaced.append(f"{group}={option}")
                    else:
                        appended.append(f"+{group}={option}")
            chosen = [*search, *appended, *replaced]
            try:
                cfg = compose(self.config_name, [*chosen, *overrides], return_hydra_config=True)
            except Exception:  # noqa: BLE001  (an override the run's groups cannot take)
                fitting = [o for o in overrides if _composes(self.config_name, [*chosen, o])]
                cfg = compose(self.config_name, [*chosen, *fitting], return_hydra_config=True)
            used = run_choices(cfg) or {}
            raw = OmegaConf.to_container(cfg, resolve=False)
        assert isinstance(raw, dict)
        raw.pop("hydra", None)
        return {str(k): v for k, v in raw.items()}, used

    def _missing_sources_hint(self, recorded: Mapping[str, Any] | None) -> str:
        """What to type when the run's configs came from folders this tree lacks ('': none)."""
        if not recorded:
            return ""
        missing = [e for e in recorded.get("searchpath", ()) if e not in self.searchpath]
        hint = ""
        if missing:
            entries = ",".join(_quoted(e) for e in [*self.searchpath, *missing])
            hint += (
                f"; its checkpoint records that the run composed its configs with "
                f"{', '.join(missing)} on Hydra's search path: if that folder is yours, give "
                f'it again: "hydra.searchpath=[{entries}]" (a folder is never taken from a '
                "checkpoint)"
            )
        config_dir = recorded.get("config_dir")
        if config_dir and self.config_dir is None and not _is_project_conf(config_dir):
            hint += (
                f"; its checkpoint records the run's primary config folder as {config_dir} "
                "(if it is yours, give it: config_dir=... from Python, --config-path on the "
                "command line)"
            )
        return hint


def _group_options(gh: Any, config_name: str, search: list[str]) -> Callable[[str], list[str]]:
    """A group's options in the tree, its config repository read once for every group.

    Hydra's public ``get_group_options`` builds the repository anew on each call: most of a
    rebuild's time for a run of ten groups.
    """
    from hydra.core.object_type import ObjectType

    loader = gh.config_loader()
    try:  # (Hydra 1.3's own step of get_group_options, done once)
        _, repo = loader._parse_overrides_and_create_caching_repo(config_name, search)
    except AttributeError:  # another Hydra: its public call for each group
        return lambda group: list(
            loader.get_group_options(group, config_name=config_name, overrides=search)
        )
    return lambda group: list(repo.get_group_options(group, ObjectType.CONFIG))


def _entry_folder(entry: str) -> Path | None:
    """The folder of a search path entry (``file://...``, ``pkg://...``; None: another)."""
    import importlib.util

    scheme, sep, path = entry.partition("://")
    if not sep or not path:
        return None
    if scheme == "file":
        return Path(path).expanduser().resolve()
    if scheme != "pkg":
        return None
    try:  # (Hydra imports the package to read it too)
        spec = importlib.util.find_spec(path.replace("/", "."))
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or ()) if spec else []
    return Path(locations[0]).resolve() if len(locations) == 1 else None


# Whether a YAML file's defaults list holds an interpolation, by the file's digest.
_DEFAULTS_INTERPOLATED: dict[str, bool] = {}


def _folder_print(folder: Path) -> str | None:
    """A digest of every name under ``folder`` and its YAML files' bytes (None: not kept).

    None for a folder larger than the bounds, a link to a folder in it (Hydra follows it), a
    YAML file that sets a search path, or one whose defaults list holds an interpolation.
    """
    digest = hashlib.sha256(str(folder).encode())
    files = size = 0
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        if any(os.path.islink(os.path.join(root, d)) for d in dirs):
            return None
        digest.update(f"\0{os.path.relpath(root, folder)}\0{dirs}\0{sorted(names)}".encode())
        for name in sorted(names):
            if not name.endswith((".yaml", ".yml")):
                continue
            try:
                data = Path(root, name).read_bytes()
            except OSError:
                return None
            files, size = files + 1, size + len(data)
            if files > _MAX_TREE_FILES or size > _MAX_TREE_BYTES:
                return None
            file_digest = hashlib.sha256(data).hexdigest()
            if b"searchpath" in data or _defaults_interpolated(file_digest, data):
                return None
            digest.update(f"\0{name}\0{file_digest}".encode())
    return digest.hexdigest()


def _defaults_interpolated(file_digest: str, data: bytes) -> bool:
    """Whether the YAML ``data``'s defaults list holds an interpolation (or it cannot be read)."""
    if b"${" not in data or b"defaults" not in data:
        return False
    if file_digest not in _DEFAULTS_INTERPOLATED:
        import yaml

        try:
            loaded = yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError:
            loaded = {"defaults": "${"}
        defaults = loaded.get("defaults") if isinstance(loaded, dict) else None
        if len(_DEFAULTS_INTERPOLATED) > 10_000:
            _DEFAULTS_INTERPOLATED.clear()
        _DEFAULTS_INTERPOLATED[file_digest] = "${" in repr(defaults)
    return _DEFAULTS_INTERPOLATED[file_digest]


def _store_nodes() -> tuple[tuple[str, Any], ...]:
    """The nodes of Hydra's config store (structured configs registered in Python), by path."""
    from hydra.core.config_store import ConfigStore

    nodes: list[tuple[str, Any]] = []

    def walk(repo: Mapping[str, Any], prefix: str) -> None:
        for name in sorted(repo):
            if isinstance(repo[name], Mapping):
                walk(repo[name], f"{prefix}{name}/")
            else:
                nodes.append((f"{prefix}{name}", repo[name]))

    walk(ConfigStore.instance().repo, "")
    return tuple(nodes)


def _composes(config_name: str, overrides: list[str]) -> bool:
    from hydra import compose

    try:
        compose(config_name, overrides)
    except Exception:  # noqa: BLE001  (Hydra's errors of every kind: it does not compose)
        return False
    return True


def _quoted(entry: str) -> str:
    """A search path entry as a Hydra override value: as it is, or quoted when it must be."""
    if re.fullmatch(r"[A-Za-z0-9_./:+@%~-]+", entry):
        return entry
    # (Hydra: a backslash escapes only a quote or the backslashes before one)
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", entry)
    return "'" + re.sub(r"(\\+)$", r"\1\1", escaped) + "'"


def _is_project_conf(folder: str) -> bool:
    try:
        return Path(folder).resolve() == _PROJECT_CONF
    except (OSError, RuntimeError, ValueError):
        return False


def run_sources(hydra: Any) -> dict[str, Any]:
    """Where a composed config's configs came from: ``{"config_dir", "searchpath"}``.

    ``config_dir`` is the primary folder (None: the project's own ``conf/``); ``searchpath``
    holds ``hydra.searchpath`` and the folders ``--config-dir`` added.
    """
    searchpath = [str(e) for e in (hydra.searchpath or ())]
    config_dir = None
    for source in hydra.runtime.config_sources or ():
        provider, schema, path = source.provider, source.schema, str(source.path)
        if schema != "file" or not path:
            continue
        if provider == "main":
            config_dir = None if _is_project_conf(path) else path
        elif provider == "command-line" and f"file://{path}" not in searchpath:
            searchpath.append(f"file://{path}")
    return {"config_dir": config_dir, "searchpath": searchpath}


def saved_sources(value: Any, where: str) -> dict[str, Any] | None:
    """A checkpoint's recorded config sources, checked as short printable strings.

    Raises:
        UntrustedCheckpointError: Not what :func:`run_sources` writes.
    """
    if value is None:
        return None
    bad = UntrustedCheckpointError(f"{where}: its recorded config sources are not folder names")
    if not isinstance(value, dict) or set(value) - {"config_dir", "searchpath"}:
        raise bad
    config_dir, searchpath = value.get("config_dir"), value.get("searchpath", [])
    if not isinstance(searchpath, list) or len(searchpath) > _MAX_SOURCES:
        raise bad
    if not all(_is_source(e) for e in searchpath) or not (
        config_dir is None or _is_source(config_dir)
    ):
        raise bad
    return {"config_dir": config_dir, "searchpath": list(searchpath)}


def _is_source(entry: Any) -> bool:
    return isinstance(entry, str) and 0 < len(entry) <= _MAX_SOURCE_CHARS and entry.isprintable()


__all__ = [
    "ConfigTree",
    "config_sources",
    "ordered_choices",
    "run_choices",
    "run_sources",
    "saved_choices",
    "saved_sources",
]

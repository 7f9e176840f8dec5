"""Config group choices and the user's config tree a saved config is rebuilt on.

A run records which option of each config group it used (Hydra's ``runtime.choices``, in the
order they were typed: :func:`run_choices`); a checkpoint's choices are read back as names only
(:func:`saved_choices`); :class:`ConfigTree` composes the user's ``conf/`` with them, which
:func:`~rl.checkpoints.saved_config.rebuild_config` lays the saved values over.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
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
    """Hydra's ``runtime.choices`` in the order they were typed, Hydra's own groups left out.

    Appended groups (``+experiment=ppo_nav +debug=smoke``) apply in the order they were
    typed, so the choices typed on the command line come first, in that order.
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
    """The config group choices of the composed config ``cfg`` (None: not composed by Hydra).

    Taken from ``cfg.hydra`` when the config carries it, else from the running Hydra app
    (:func:`ordered_choices`): only while one runs (a ``HydraConfig`` left behind by an earlier
    composition is not this config's).
    """
    hydra = _hydra_node(cfg)
    if hydra is None:
        return None
    return ordered_choices(
        OmegaConf.to_container(hydra.runtime.choices), list(hydra.overrides.task)
    )


def config_sources(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any] | None:
    """Where the composed config ``cfg`` came from (None: not composed by Hydra).

    :func:`run_sources` of the ``hydra`` node :func:`run_choices` takes its choices from.
    """
    hydra = _hydra_node(cfg)
    return None if hydra is None else run_sources(hydra)


def _hydra_node(cfg: DictConfig | Mapping[str, Any]) -> Any:
    """``cfg.hydra`` when the config carries it, else the running Hydra app's (None: none).

    Only while an app runs: a ``HydraConfig`` left behind by an earlier composition is not
    this config's.
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

    A tree is a primary folder (``conf/``, with ``train.yaml``) and the folders or packages of
    the user's own configs laid beside it (Hydra's ``hydra.searchpath``: an experiment, a task
    or a model of one's own kept in one's own repository). Both come from the invocation, never
    from a checkpoint: a run records where its configs came from (:func:`run_sources`) only so
    that a message can say what to type.

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

        Its search path (``hydra.searchpath``, what ``--config-dir`` added too) and, outside a
        running app (:mod:`rl.api`, a config composed in Python), its primary folder; the
        project's ``conf/`` when nothing was composed.
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

        ``overrides`` (typed by the user now) are composed after the choices; one that does
        not apply to the run's config (a key its groups lack) is left out. ``recorded`` (the
        run's own sources, :func:`saved_sources`) is only quoted in the message of a choice
        the tree lacks.

        Raises:
            CheckpointError: A choice names an option the tree does not have.
        """
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
                # (a group at a package of its own, model@model.policy: the group's options)
                options = group_options(group.partition("@")[0])
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
                options_chose = (
                    run_choices(
                        compose(
                            self.config_name,
                            [*search, *appended, *replaced],
                            return_hydra_config=True,
                        )
                    )
                    or {}
                )
                for group, option in packaged.items():
                    plus = "" if group in options_chose else "+"
                    (replaced if not plus else appended).append(f"{plus}{group}={option}")
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

    Hydra's public ``get_group_options`` builds the repository (the primary config, the search
    path) anew on each call: most of a rebuild's time for a run of ten groups.
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

    ``config_dir`` is the primary folder (None: the project's own ``conf/``, or not a folder);
    ``searchpath`` the user's entries of Hydra's search path: ``hydra.searchpath`` and the
    folders ``--config-dir`` added (as ``file://`` entries).

    Args:
        hydra: A composed config's ``hydra`` node (``HydraConfig.get()``).
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

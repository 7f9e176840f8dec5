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
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rl.checkpoints.errors import CheckpointError, UntrustedCheckpointError

# A config group or option name: path segments of letters, digits, ``_``, ``-`` and ``.``.
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$")
# A group chosen in an option's own defaults list, at a package of its own: ``model@model.policy``.
_PACKAGE_RE = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")
_PROJECT_CONF = Path(__file__).resolve().parents[2] / "conf"


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
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    hydra: Any = None
    if isinstance(cfg, DictConfig) and "hydra" in cfg:
        hydra = cfg.hydra
    elif HydraConfig.initialized() and GlobalHydra.instance().is_initialized():
        hydra = HydraConfig.get()
    if hydra is None:
        return None
    return ordered_choices(
        OmegaConf.to_container(hydra.runtime.choices), list(hydra.overrides.task)
    )


@dataclasses.dataclass(frozen=True)
class ConfigTree:
    """The user's config tree: where :func:`rebuild_config` composes a saved run's config.

    Attributes:
        config_dir: The tree's folder (None: the running Hydra app's search path, else the
            project's own ``conf/``).
        config_name: The primary config of training runs.
    """

    config_dir: str | Path | None = None
    config_name: str = "train"

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

    def compose(
        self, choices: Mapping[str, str] | None, where: str, overrides: Sequence[str] = ()
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The tree's config (interpolations kept) with ``choices``, and the choices it used.

        ``overrides`` (typed by the user now) are composed after the choices; one that does
        not apply to the run's config (a key its groups lack) is left out.

        Raises:
            CheckpointError: A choice names an option the tree does not have.
        """
        from hydra import compose

        with self._hydra() as gh:
            base = compose(self.config_name, [], return_hydra_config=True)
            defaults = run_choices(base) or {}
            appended: list[str] = []
            replaced: list[str] = []
            for group, option in (choices or {}).items():  # (in the order they were typed)
                # Every choice is passed, defaults too: an experiment may override a group
                # that the run then set back to its default.
                # (a group at a package of its own, model@model.policy: the group's options)
                options = gh.config_loader().get_group_options(group.partition("@")[0])
                if option not in options:
                    if defaults.get(group) == option:
                        continue  # an optional default the tree lacks (``optional local``)
                    raise CheckpointError(
                        f"{where}: the run used {group}={option}, which your config tree has no "
                        f"option for ({', '.join(options) or 'no such group'})"
                    )
                if group in defaults or "@" in group:  # (the latter in an option's defaults)
                    replaced.append(f"{group}={option}")
                else:
                    appended.append(f"+{group}={option}")
            chosen = [*appended, *replaced]
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


def _composes(config_name: str, overrides: list[str]) -> bool:
    from hydra import compose

    try:
        compose(config_name, overrides)
    except Exception:  # noqa: BLE001  (Hydra's errors of every kind: it does not compose)
        return False
    return True


__all__ = ["ConfigTree", "ordered_choices", "run_choices", "saved_choices"]

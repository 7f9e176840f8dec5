"""ConfigTree.compose keeps what it composed: the same tree, choices and overrides are composed
once in a process, each call gets a copy of its own, and any change to what a composition reads
(a YAML file's bytes, a new option, the config store, an interpolated defaults list) composes
anew. A checkpoint's config is judged against this result, so no call may see another's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
import pytest
from hydra.core.config_store import ConfigStore

from rl.checkpoints import CheckpointError
from rl.checkpoints.config_tree import ConfigTree


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small tree of one's own: ``train.yaml`` choosing ``g: a`` of options ``a`` and ``b``."""
    folder = tmp_path / "conf"
    (folder / "g").mkdir(parents=True)
    (folder / "train.yaml").write_text("defaults:\n  - g: a\n  - _self_\nx: 1\n")
    (folder / "g" / "a.yaml").write_text("v: A\n")
    (folder / "g" / "b.yaml").write_text("v: B\n")
    return folder


@pytest.fixture
def compositions(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The overrides of every Hydra composition made while the test runs."""
    made: list[Any] = []
    compose = hydra.compose

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(args[1:] or kwargs.get("overrides"))
        return compose(*args, **kwargs)

    # The first composition of a process imports Hydra's plugins, which add their configs to
    # the config store: a change that keeps nothing. Made before the test counts.
    ConfigTree().compose({}, "warm-up")
    monkeypatch.setattr(hydra, "compose", counted)
    yield made


def test_the_same_inputs_are_composed_once_into_independent_copies(
    tree: Path, compositions: list[Any]
) -> None:
    first_raw, first_used = ConfigTree(tree).compose({"g": "a"}, "x")
    made = len(compositions)
    assert made > 0
    second_raw, second_used = ConfigTree(tree).compose({"g": "a"}, "y")
    assert len(compositions) == made  # kept
    assert (second_raw, second_used) == (first_raw, first_used)
    assert first_raw["g"] == {"v": "A"} and first_used == {"g": "a"}
    first_raw["g"]["v"] = "changed"
    first_used["g"] = "changed"
    assert second_raw["g"] == {"v": "A"}
    third_raw, third_used = ConfigTree(tree).compose({"g": "a"}, "z")
    assert third_raw["g"] == {"v": "A"} and third_used == {"g": "a"}
    assert third_raw is not second_raw and third_raw["g"] is not second_raw["g"]
    assert len(compositions) == made


def test_other_choices_overrides_or_trees_are_composed_on_their_own(
    tree: Path, tmp_path: Path, compositions: list[Any]
) -> None:
    assert ConfigTree(tree).compose({"g": "a"}, "x")[0]["g"] == {"v": "A"}
    assert ConfigTree(tree).compose({"g": "b"}, "x")[0]["g"] == {"v": "B"}
    assert ConfigTree(tree).compose(None, "x")[0]["g"] == {"v": "A"}
    assert ConfigTree(tree).compose({"g": "a"}, "x", ["x=2"])[0]["x"] == 2
    assert ConfigTree(tree).compose({"g": "a"}, "x")[0]["x"] == 1
    other = tmp_path / "other"
    (other / "g").mkdir(parents=True)
    (other / "train.yaml").write_text((tree / "train.yaml").read_text())
    (other / "g" / "a.yaml").write_text("v: other\n")
    assert ConfigTree(other).compose({"g": "a"}, "x")[0]["g"] == {"v": "other"}
    extra = tmp_path / "extra"
    (extra / "g").mkdir(parents=True)
    (extra / "g" / "e.yaml").write_text("v: E\n")
    with pytest.raises(CheckpointError, match="g=e"):
        ConfigTree(tree).compose({"g": "e"}, "x")
    searched = ConfigTree(tree, searchpath=(f"file://{extra}",))
    assert searched.compose({"g": "e"}, "x")[0]["g"] == {"v": "E"}


def test_a_changed_file_or_a_new_option_is_composed_anew(
    tree: Path, compositions: list[Any]
) -> None:
    assert ConfigTree(tree).compose({"g": "a"}, "x")[0]["g"] == {"v": "A"}
    (tree / "g" / "a.yaml").write_text("v: C\n")  # (the same size, maybe the same mtime)
    made = len(compositions)
    assert ConfigTree(tree).compose({"g": "a"}, "x")[0]["g"] == {"v": "C"}
    assert len(compositions) > made
    with pytest.raises(CheckpointError, match="g=n"):
        ConfigTree(tree).compose({"g": "n"}, "x")
    (tree / "g" / "n.yaml").write_text("v: N\n")
    assert ConfigTree(tree).compose({"g": "n"}, "x")[0]["g"] == {"v": "N"}
    (tree / "train.yaml").write_text("defaults:\n  - g: b\n  - _self_\nx: 1\n")
    assert ConfigTree(tree).compose(None, "x")[0]["g"] == {"v": "B"}


def test_the_config_store_is_read_as_it_is_now(tree: Path, compositions: list[Any]) -> None:
    with pytest.raises(CheckpointError, match="g=stored"):
        ConfigTree(tree).compose({"g": "stored"}, "x")
    store = ConfigStore.instance()
    store.store(group="g", name="stored", node={"v": "S"})
    try:
        assert ConfigTree(tree).compose({"g": "stored"}, "x")[0]["g"] == {"v": "S"}
        store.store(group="g", name="stored", node={"v": "T"})
        assert ConfigTree(tree).compose({"g": "stored"}, "x")[0]["g"] == {"v": "T"}
    finally:
        del store.repo["g"]


def test_an_interpolated_defaults_list_is_composed_each_time(
    tree: Path, compositions: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tree / "train.yaml").write_text("defaults:\n  - g: ${oc.env:RL_TEST_G,a}\n  - _self_\nx: 1\n")
    monkeypatch.setenv("RL_TEST_G", "b")
    assert ConfigTree(tree).compose(None, "x")[0]["g"] == {"v": "B"}
    monkeypatch.setenv("RL_TEST_G", "a")
    assert ConfigTree(tree).compose(None, "x")[0]["g"] == {"v": "A"}


def test_folders_on_a_search_path_given_in_a_file_or_an_override_are_read_as_they_are_now(
    tree: Path, tmp_path: Path, compositions: list[Any]
) -> None:
    extra = tmp_path / "extra"
    (extra / "g").mkdir(parents=True)
    (extra / "g" / "e.yaml").write_text("v: E\n")
    searched = [f"hydra.searchpath=[file://{extra}]"]
    assert ConfigTree(tree).compose({"g": "a"}, "x", searched)[0]["g"] == {"v": "A"}
    (tree / "train.yaml").write_text(
        f"defaults:\n  - g: a\n  - _self_\nhydra:\n  searchpath: [file://{extra}]\nx: 1\n"
    )
    assert ConfigTree(tree).compose({"g": "e"}, "x")[0]["g"] == {"v": "E"}
    (extra / "g" / "e.yaml").write_text("v: F\n")
    assert ConfigTree(tree).compose({"g": "e"}, "x")[0]["g"] == {"v": "F"}

"""requirements.lock pins what pyproject.toml asks for, and tools/lock.py tells differences apart.

``make venv`` installs with the lock as pip's constraints and then runs ``tools/lock.py check``
(``pip freeze`` equals the lock); these tests catch a pyproject.toml changed without ``make lock``
before any install does.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("lock_tool", ROOT / "tools" / "lock.py")
assert _spec is not None and _spec.loader is not None
lock = importlib.util.module_from_spec(_spec)
sys.modules["lock_tool"] = lock
_spec.loader.exec_module(lock)


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements() -> list[tuple[str, Requirement]]:
    project = _project()
    found = [("dependencies", Requirement(r)) for r in project["dependencies"]]
    for extra, requirements in project.get("optional-dependencies", {}).items():
        found += [(f"optional-dependencies.{extra}", Requirement(r)) for r in requirements]
    return found


def test_every_requirement_of_pyproject_is_locked_at_a_version_it_allows() -> None:
    pins = lock.parse_pins(lock.LOCK.read_text(), "requirements.lock")
    wrong = []
    for where, requirement in _requirements():
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        key = lock.canonical(requirement.name)
        if key not in pins:
            wrong.append(f"{where}: {requirement} is not in requirements.lock")
        elif not requirement.specifier.contains(Version(pins[key][1]), prereleases=True):
            wrong.append(f"{where}: {requirement} does not allow the locked {pins[key][1]}")
    assert not wrong, "run `make lock`:\n" + "\n".join(wrong)


def test_the_lock_names_its_platform_and_the_extras_make_venv_installs() -> None:
    text = lock.LOCK.read_text()
    match = lock.PLATFORM_RE.search(text)
    assert match and match["platform"].startswith("CPython 3.11 Linux"), text[:600]
    installed = re.search(r'-e "\.\[([\w,-]+)\]"', (ROOT / "Makefile").read_text())
    assert installed, "make venv installs the project in place with its extras"
    assert set(installed[1].split(",")) == set(_project()["optional-dependencies"]), (
        "make venv must install exactly the extras the lock was made with"
    )
    # torch is the CPU build on disk: the lock must not send pip to a CUDA wheel.
    pins = lock.parse_pins(text, "requirements.lock")
    assert pins["torch"][1].endswith("+cpu"), pins["torch"]
    assert not any(key.startswith("nvidia-") for key in pins), "a CUDA package is locked"


def test_parse_pins_reads_names_and_versions_and_refuses_anything_else() -> None:
    text = "# header\nJinja2==3.1.6\n\nzope.interface==7.0  # a comment\n"
    assert lock.parse_pins(text, "x") == {
        "jinja2": ("Jinja2", "3.1.6"),
        "zope-interface": ("zope.interface", "7.0"),
    }
    for bad in ("numpy>=1.26", "-e /work/main", "torch=="):
        with pytest.raises(SystemExit, match=r"x:1: not a `name==version` pin"):
            lock.parse_pins(bad, "x")


def test_diff_names_every_added_removed_and_changed_package() -> None:
    old = lock.parse_pins("a==1\nb==2\nC_d==3\n", "old")
    new = lock.parse_pins("b==2\nc-d==4\ne==5\n", "new")
    assert lock.diff(old, new) == [
        "  removed  a==1",
        "  changed  c-d 3 -> 4",
        "  added    e==5",
    ]
    assert lock.diff(new, new) == []


def test_render_sorts_by_name_and_round_trips() -> None:
    pins = lock.parse_pins("b==2\nA==1\n", "x")
    text = lock.render(pins)
    assert text.splitlines()[-2:] == ["A==1", "b==2"]
    assert lock.parse_pins(text, "x") == pins
    assert lock.PLATFORM_RE.search(text)["platform"] == lock.this_platform()

"""Checkpoints and run folders are untrusted input: nothing in them runs code, loading is bounded.

A checkpoint's saved config is data, rebuilt on the user's own config tree before ``evaluate.py``,
``resume=`` or ``InferenceAgent`` build anything from it (:mod:`rl.checkpoints.saved_config`): a
crafted one must not reach the file system (issue 19, point 1; issue 34, critical points 1 to 3).
A sparse multi-GB file or a zip bomb under a checkpoint name is refused in bounded memory
(issue 19, point 2), and so is a config of shared references (issue 34). Every crafted file is
re-signed with the project's digest, so it passes the archive and ``weights_only`` checks.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from rl.checkpoints import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from rl.checkpoints.files import UntrustedCheckpointError, parse_checkpoint_name, with_digest
from rl.checkpoints.lock import LOCK_NAME
from rl.checkpoints.trust import judge_target, trust_rules
from rl.engine import run
from rl.evaluation import InferenceAgent
from rl_envs.pointnav import PointNavEnv

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ["+experiment=ppo_nav", "+debug=smoke", "task=nav_small", "eval.num_episodes=0"]


class CustomNav(PointNavEnv):
    """A user's own task class: trusted only when the user says so."""


def _write_text_payload(target: Path) -> dict[str, Any]:
    return {
        "_target_": "pathlib.Path.write_text",
        "self": {"_target_": "pathlib.Path", "_args_": [str(target)]},
        "data": "x",
    }


def _open_payload(victim: Path) -> dict[str, Any]:
    return {"_target_": "builtins.open", "_args_": [str(victim), "w"]}


def _resign(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` over the checkpoint ``path`` with a valid digest (as an attacker can)."""
    stage, step = parse_checkpoint_name(path)  # type: ignore[misc]
    save_checkpoint(path.parent.parent, state, stage, step)


def _recraft(path: Path, task: Any) -> None:
    """Rewrite a checkpoint's saved task with a valid digest."""
    state = load_checkpoint(path)
    state["config"]["task"] = task
    _resign(path, state)


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file of a folder with its size and time; not the lock file, which ``resume=``
    takes (and writes its own pid to) before it reads a checkpoint."""
    files = [p for p in folder.rglob("*") if p.name != LOCK_NAME]
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in files}


@pytest.fixture
def trained_run(smoke_run: Path) -> Path:
    """The shared smoke run (conftest; its overrides are ``SMOKE``): copy it to change it."""
    return smoke_run


@pytest.fixture(params=["write_text", "open"])
def crafted(
    request: pytest.FixtureRequest, trained_run: Path, tmp_path: Path
) -> tuple[Path, Path, Path]:
    """A copy of the run whose newest checkpoint's task writes or truncates a file.

    Returns:
        ``(run folder, file the payload would create, file it would truncate)``.
    """
    import shutil

    folder = tmp_path / "crafted"
    shutil.copytree(trained_run, folder)
    created, victim = tmp_path / "created-by-checkpoint", tmp_path / "victim.txt"
    victim.write_text("precious")
    payload = _write_text_payload(created) if request.param == "write_text" else None
    _recraft(latest_checkpoint(folder), payload or _open_payload(victim))
    return folder, created, victim


def _assert_untouched(
    created: Path, victim: Path, before: dict[str, tuple[int, int]], folder: Path
) -> None:
    assert not created.exists()
    assert victim.read_text() == "precious"
    assert _snapshot(folder) == before  # nothing written in the run folder either


def test_evaluate_refuses_a_crafted_checkpoint(
    crafted: tuple[Path, Path, Path], compose_cfg: Any
) -> None:
    folder, created, victim = crafted
    before = _snapshot(folder)
    for key in ("run_dir", "ckpt"):
        value = folder if key == "run_dir" else latest_checkpoint(folder)
        out = f"output_dir={folder.parent / 'eval'}"
        cfg = compose_cfg([f"{key}={value}", "num_episodes=2", out], config_name="evaluate")
        with pytest.raises(UntrustedCheckpointError) as info:
            run.evaluate(cfg)
        message = str(info.value)
        assert str(latest_checkpoint(folder)) in message and "task._target_" in message
        assert "pathlib.Path.write_text" in message or "builtins.open" in message
        _assert_untouched(created, victim, before, folder)
    with pytest.raises(UntrustedCheckpointError):
        InferenceAgent.from_checkpoint(latest_checkpoint(folder))
    _assert_untouched(created, victim, before, folder)


def test_resume_refuses_a_crafted_checkpoint(
    crafted: tuple[Path, Path, Path], compose_cfg: Any
) -> None:
    folder, created, victim = crafted
    before = _snapshot(folder)
    for resume in (folder, latest_checkpoint(folder)):  # a run folder, or the file itself
        cfg = compose_cfg([*SMOKE, f"resume={resume}"])
        with pytest.raises(UntrustedCheckpointError, match="task._target_"):
            run.train(cfg)
        _assert_untouched(created, victim, before, folder)
    # init_from takes the weights only: the saved config is never built from.
    run.train(compose_cfg([*SMOKE, f"init_from={latest_checkpoint(folder)}"]))
    assert not created.exists() and victim.read_text() == "precious"


def test_evaluate_py_cli_refuses_and_writes_nothing(crafted: tuple[Path, Path, Path]) -> None:
    folder, created, victim = crafted
    before = _snapshot(folder)
    proc = subprocess.run(
        [
            sys.executable,
            "evaluate.py",
            f"run_dir={folder}",
            "num_episodes=2",
            f"hydra.run.dir={folder.parent / 'eval'}",
        ],  # fmt: skip
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "WANDB_MODE": "disabled"},
    )
    assert proc.returncode == 1
    assert "does not name there" in proc.stderr and "task._target_" in proc.stderr
    _assert_untouched(created, victim, before, folder)


def test_trusted_targets_let_a_users_own_task_through(
    trained_run: Path, tmp_path: Path, compose_cfg: Any
) -> None:
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(trained_run, folder)
    path = latest_checkpoint(folder)
    task = dict(load_checkpoint(path)["config"]["task"])
    _recraft(path, {**task, "_target_": f"{__name__}.CustomNav"})
    evaluate = [f"ckpt={path}", "num_episodes=2", "num_envs=2", f"output_dir={tmp_path / 'e'}"]
    with pytest.raises(UntrustedCheckpointError, match=f"{__name__}.CustomNav"):
        run.evaluate(compose_cfg(evaluate, config_name="evaluate"))
    trusted = f"trusted_targets=[{__name__}.*]"
    metrics = run.evaluate(compose_cfg([*evaluate, trusted], config_name="evaluate"))
    assert "eval/success" in metrics


@pytest.mark.parametrize(
    "old", ["rl.tasks.nav.os.system", "rl.tasks.PointNavEnv.__init__.__globals__", "rl.tasks.nav"]
)
def test_an_old_environment_path_in_a_crafted_checkpoint_is_judged_after_its_rename(
    trained_run: Path, tmp_path: Path, compose_cfg: Any, old: str
) -> None:
    # The migration renames rl.tasks.* to rl_envs.* before the saved config is judged: a
    # crafted path through a moved module is judged under its new name, and refused even
    # by a user who trusts every example environment (os.system is defined elsewhere).
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(trained_run, folder)
    path = latest_checkpoint(folder)
    task = dict(load_checkpoint(path)["config"]["task"])
    _recraft(path, {**task, "_target_": old})
    before = _snapshot(folder)
    evaluate = [f"ckpt={path}", "num_episodes=2", "num_envs=2", f"output_dir={tmp_path / 'e'}",
                "trusted_targets=[rl_envs.*]"]  # fmt: skip
    with pytest.raises(UntrustedCheckpointError, match=r"task\._target_: '\"rl_envs\.pointnav"):
        run.evaluate(compose_cfg(evaluate, config_name="evaluate"))
    assert _snapshot(folder) == before


@pytest.mark.parametrize(
    "target",
    [
        "builtins.open",
        "os.system",
        f"{__name__}.os.system",  # through a module the pattern allows, defined elsewhere
        f"{__name__}.subprocess.run",
        "rl.storage.generate_expert_trajectories",  # writes where it is told: never trusted
        "gymnasium.wrappers.RecordVideo",
        "",
    ],
)
def test_trusted_targets_patterns_allow_what_is_defined_there_only(target: str) -> None:
    rules = trust_rules([f"{__name__}.*", "rl.*", "gymnasium.*"])
    assert judge_target(target, rules) is not None
    assert judge_target(f"{__name__}.CustomNav", rules) is None
    assert judge_target(f"{__name__}.CustomNav", trust_rules()) is not None  # nothing by default


# ------------------------------------------------------------------------ bounded loading
_RSS_PROBE = """
import resource, sys
from rl.checkpoints import CheckpointError, load_checkpoint
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    load_checkpoint(sys.argv[1])
except CheckpointError as e:
    print("refused:", e)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(f"rss_kib {before} {after}")
"""


def _load_in_subprocess(path: Path) -> tuple[str, float, float]:
    """``(output, peak RSS before loading, peak RSS after)`` of a fresh process, in MiB.

    Linux carries a process's peak RSS over ``fork`` + ``exec`` into ``getrusage``, so a probe
    started straight from this (large) test process would report this process's peak; started
    by a small shell that forks it, it reports its own.
    """
    proc = subprocess.run(
        ["sh", "-c", '"$0" -c "$1" "$2"; exit $?', sys.executable, _RSS_PROBE, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    before, after = proc.stdout.split("rss_kib ")[1].split()
    return proc.stdout, int(before) / 1024, int(after) / 1024


def _zip_bomb(path: Path, inflated: int) -> None:
    """A real checkpoint whose one tensor inflates to ``inflated`` bytes from about 1 MB.

    ``torch.save`` of a 70,000-float tensor, its storage entry replaced by ``inflated`` zero
    bytes, deflated, and the pickled sizes patched to match (``torch.load`` inflates the whole
    entry into memory before anything checks it), with a valid digest (anyone can compute one).
    """
    n = 70_000  # pickled as 4-byte integers, so the patch keeps the pickle's length
    buffer = io.BytesIO()
    torch.save({"model": {"w": torch.zeros(n)}, "config": {}}, buffer)
    source = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith("/data.pkl"):
                numel = (inflated // 4).to_bytes(4, "little")
                archive.writestr(info.filename, data.replace(n.to_bytes(4, "little"), numel))
            elif info.filename.endswith("/data/0"):
                entry = zipfile.ZipInfo(info.filename)
                entry.compress_type = zipfile.ZIP_DEFLATED
                with archive.open(entry, "w", force_zip64=True) as f:
                    zeros = bytes(1 << 24)
                    for _ in range(inflated // len(zeros)):
                        f.write(zeros)
            else:
                archive.writestr(info.filename, data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(with_digest(out.getvalue()))


@pytest.mark.timeout(300)
def test_huge_and_bomb_files_are_refused_in_bounded_memory(tmp_path: Path) -> None:
    sparse = tmp_path / "checkpoints" / "ckpt_stage00_step000000000001.pt"
    sparse.parent.mkdir(parents=True)
    with sparse.open("wb") as f:
        f.truncate(3 << 30)  # 3 GiB of holes: no disk used
    bomb = tmp_path / "checkpoints" / "ckpt_stage00_step000000000002.pt"
    _zip_bomb(bomb, 1 << 30)  # 1 GiB of zeros in about 1 MB
    assert bomb.stat().st_size < 4 << 20
    # Before these checks: 3,351 MiB and 56 s for the sparse file, and the bomb loaded (1,308 MiB).
    for path, reason in ((sparse, "not a complete archive"), (bomb, "is compressed")):
        out, before, after = _load_in_subprocess(path)
        assert f"refused: cannot read checkpoint {path}: " in out and reason in out
        # The loader's own peak: what importing torch took, plus what loading added.
        assert after < 300, f"peak RSS {after:.0f} MiB loading {path.name}"
        assert after - before < 32, f"loading {path.name} added {after - before:.0f} MiB"


def test_entries_larger_than_the_file_are_refused(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, {"model": {}, "config": {}}, 0, 1)
    data = bytearray(path.read_bytes())
    # Declare a stored entry 1 GiB large in the central directory (size fields of a header).
    central = data.rfind(b"PK\x01\x02")
    data[central + 20 : central + 28] = ((1 << 30).to_bytes(4, "little")) * 2
    eocd = data.rfind(b"PK\x05\x06")
    path.write_bytes(with_digest(bytes(data[: eocd + 22 - 2]) + b"\x00\x00"))
    with pytest.raises(CheckpointError, match="declare|directory"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    ("sink", "key", "name"),
    [
        ({"_target_": "rl.loggers.JsonlSink", "_partial_": True}, "filename", "victim.jsonl"),
        ({"_target_": "rl.loggers.TensorBoardSink", "_partial_": True}, "subdir", "elsewhere"),
    ],
)
@pytest.mark.parametrize("escape", ["absolute", "dotdot"])
def test_resume_never_writes_where_a_saved_logger_points_outside_the_run(
    trained_run: Path, tmp_path: Path, compose_cfg: Any, sink: dict, key: str, name: str,
    escape: str,
) -> None:  # fmt: skip
    """A checkpoint whose saved logger names an absolute path, or one that climbs out with
    '..': a resume never takes its loggers from the file (issue 52), so the run goes on with
    the command's loggers and nothing is written there (issue 34, critical point 4)."""
    import shutil

    folder = tmp_path / "crafted"
    shutil.copytree(trained_run, folder)
    target = tmp_path / name
    if name.endswith(".jsonl"):
        target.write_text("precious\n")
    value = str(target) if escape == "absolute" else f"../{name}"
    path = latest_checkpoint(folder)
    state = load_checkpoint(path)
    sink_name = sink["_target_"].rpartition("Sink")[0].rpartition(".")[2].lower()
    state["config"]["logger"]["sinks"][sink_name] = {**sink, key: value}
    state["choices"]["logger"] = "tensorboard"  # (its tree has both sinks: jsonl, tensorboard)
    _resign(path, state)
    run.train(compose_cfg([*SMOKE, f"resume={folder}", "total_env_steps=320"]))
    resumed = load_checkpoint(latest_checkpoint(folder))
    assert resumed["pipeline"]["total_steps"] == 320
    assert resumed["choices"]["logger"] == "default"  # the command's, not the file's
    assert set(resumed["config"]["logger"]["sinks"]) == {"console", "jsonl", "episodes"}
    if name.endswith(".jsonl"):
        assert target.read_text() == "precious\n"
    else:
        assert not target.exists()


def test_latest_names_a_sibling_checkpoint_only(trained_run: Path, tmp_path: Path) -> None:
    """A copied run whose ``latest`` climbs out of the run, links out, or is no pointer at all
    falls back to its own newest checkpoint (issue 34: a foreign file was evaluated)."""
    import shutil

    folder = tmp_path / "crafted"
    shutil.copytree(trained_run, folder)
    own = list_checkpoints(folder)[-1]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    foreign = elsewhere / own.name
    shutil.copy(own, foreign)
    pointer = folder / "checkpoints" / "latest"
    assert latest_checkpoint(folder) == own  # as written by the run
    for content in (f"../../elsewhere/{own.name}", str(foreign), "x" * 10_000, ""):
        pointer.write_text(content)
        assert latest_checkpoint(folder) == own, content
    pointer.unlink()
    pointer.symlink_to(foreign)  # a link out, with a plausible name in it too
    assert latest_checkpoint(folder) == own
    pointer.unlink()
    (folder / "checkpoints" / "ckpt_stage09_step999999999999.pt").symlink_to(foreign)
    pointer.write_text("ckpt_stage09_step999999999999.pt")
    assert latest_checkpoint(folder) == own  # the name is a sibling, but a link out

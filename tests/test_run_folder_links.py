"""Links to folders, fixed temporary names and non-files in a copied run folder (attack review).

A run folder someone copied to you is untrusted input: ``evaluate.py``, ``resume=``,
``InferenceAgent`` and export write only inside it, and never through a link it holds. Each
test crafts a real run folder from the smoke run (links to a sentinel folder, to another run's
``checkpoints/``, folders and FIFOs where files belong), goes in through the real entry points,
and checks that the sentinel (or the other run) is byte-for-byte unchanged and that every
refusal names the path. Links to *files* are covered by ``test_untrusted_runs.py``; these are
the links to *folders*, the files written by name (videos, exports), a full disk, and glob
characters in a ``ckpt=`` path.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from crafted import SMOKE, copy_run, file_hashes, make_sentinel

from rl.checkpoints import CheckpointError, latest_checkpoint, list_checkpoints, load_checkpoint
from rl.checkpoints.files import checkpoint_file, remove_stale_temp_files
from rl.checkpoints.lock import RunLock
from rl.engine import run
from rl.evaluation import InferenceAgent
from rl.evaluation.export import export_checkpoint
from rl.evaluation.runs import find_checkpoints, is_glob
from rl.evaluation.video import ProbeVideo
from rl.loggers.base import RunContext
from rl.loggers.files import JsonlSink
from rl.loggers.tensorboard import TensorBoardSink
from rl.utils.config import to_plain
from rl.utils.files import UnsafePathError, write_atomic

EVALUATE = ["num_episodes=1", "num_envs=1", "plot=false", "progress_bar=false"]
FIRST, NEWEST = "ckpt_stage00_step000000000128.pt", "ckpt_stage00_step000000000256.pt"


def _copy(run_dir: Path, tmp_path: Path, name: str = "copied") -> Path:
    return copy_run(run_dir, tmp_path, name)


def _sentinel(tmp_path: Path) -> Path:
    names = ("victim.txt", "victim.png", "victim.mp4", "victim.onnx", "victim.json")
    return make_sentinel(tmp_path, names)


def _temporary_files(folder: Path) -> list[str]:
    """Hidden temporary files the writers left (``.<name>.<random>.tmp[.suffix]``)."""
    return sorted(p.name for p in folder.rglob(".*") if ".tmp" in p.name and not p.is_symlink())


def _refused(e: BaseException, path: Path) -> None:
    assert isinstance(e, UnsafePathError), repr(e)
    assert str(path) in str(e), e


def _context(folder: Path) -> RunContext:
    return RunContext(
        output_dir=folder,
        config={"exp_name": "x"},
        exp_name="x",
        task_id="T",
        seed=1,
        total_steps=256,
        run_name="T__x__1__0",
    )


def _probe_video(folder: Path, compose_cfg: Any) -> ProbeVideo:
    """A probe-video callback on the smoke run's task, writing into ``folder``."""
    task = to_plain(compose_cfg(SMOKE))["task"]
    return ProbeVideo(task=task, output_dir=folder, interval=128, seed=0, device="cpu")


# ------------------------------------------------------------- critical 1: probe videos
@pytest.mark.parametrize("kind", ["mp4", "gif"])
def test_a_probe_video_replaces_a_link_under_its_name_never_writes_through_it(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """``videos/step_*.mp4`` (or the GIF fallback's name) linked out of a copied run."""
    sentinel = _sentinel(tmp_path)
    before = file_hashes(sentinel)
    folder = _copy(smoke_run, tmp_path)
    (folder / "videos").mkdir()
    name = f"step_{256:012d}.{kind}"
    (folder / "videos" / name).symlink_to(sentinel / f"victim.{'png' if kind == 'gif' else kind}")
    if kind == "gif":  # no ffmpeg: the GIF fallback (Pillow)
        monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    video = _probe_video(folder, compose_cfg)
    try:
        written = video.record(InferenceAgent.from_checkpoint(folder).model, 256)
    finally:
        video.close()
    assert written == folder / "videos" / name
    assert written.is_file() and not written.is_symlink() and written.stat().st_size > 100
    assert file_hashes(sentinel) == before
    assert _temporary_files(folder) == []


# --------------------------------------------------------------------- critical 2: export
def test_export_replaces_links_never_writes_through_them(smoke_run: Path, tmp_path: Path) -> None:
    """The old fixed temporary name, the ``.onnx``/``.pt2`` and their ``.json``: all links."""
    sentinel = _sentinel(tmp_path)
    before = file_hashes(sentinel)
    folder = _copy(smoke_run, tmp_path)
    checkpoints = folder / "checkpoints"
    stem = Path(NEWEST).stem
    links = {
        f".{stem}.onnx.tmp": "victim.onnx",  # (the name export used to write through)
        f"{stem}.onnx": "victim.onnx",
        f"{stem}.onnx.json": "victim.json",
        f"{stem}.pt2": "victim.txt",
        f"{stem}.pt2.json": "victim.json",
    }
    for name, victim in links.items():
        (checkpoints / name).symlink_to(sentinel / victim)
    for fmt in ("onnx", "pt2"):
        info = export_checkpoint(checkpoints / "latest", fmt)  # type: ignore[arg-type]
        assert info.path == checkpoints / f"{stem}.{fmt}"
        for written in (info.path, info.description):
            assert written.is_file() and not written.is_symlink()
    assert file_hashes(sentinel) == before
    assert (checkpoints / f".{stem}.onnx.tmp").is_symlink()  # (not ours: left as it was)
    assert _temporary_files(folder) == []


def _full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fsync of a file says the disk is full (as a real full disk does at the latest)."""
    fsync = os.fsync

    def full(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            return fsync(fd)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)


def test_a_full_disk_during_export_or_evaluation_is_named_and_leaves_no_temporary_file(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _copy(smoke_run, tmp_path)
    checkpoints = folder / "checkpoints"
    before = file_hashes(folder)
    evaluate = compose_cfg([f"run_dir={folder}", *EVALUATE, f"output_dir={tmp_path}"], "evaluate")
    _full_disk(monkeypatch)
    with pytest.raises(OSError, match="the disk is full") as info:
        export_checkpoint(checkpoints / NEWEST, "onnx")
    assert str(checkpoints / Path(NEWEST).with_suffix(".onnx")) in str(info.value)
    with pytest.raises(OSError, match="the disk is full") as info:
        run.evaluate(evaluate)
    assert str(checkpoints / Path(FIRST).stem) in str(info.value)  # its evaluation result
    monkeypatch.undo()
    assert _temporary_files(folder) == []
    assert {k: v for k, v in file_hashes(folder).items() if k != ".lock"} == {
        k: v for k, v in before.items() if k != ".lock"
    }


# ----------------------------------------------------------- major 3: links to folders
def test_a_checkpoints_folder_linked_to_another_run_is_refused_everywhere(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any
) -> None:
    """A copied run's ``checkpoints`` linked to a live run's: refused by name everywhere.

    The other run holds its lock and has a save in flight: nothing reads, writes or cleans
    (its temporary file) through the link.
    """
    other = _copy(smoke_run, tmp_path, "other")
    in_flight = other / "checkpoints" / ".ckpt_stage00_step000000000384.pt.k3j9wq1a.tmp"
    in_flight.write_bytes(b"half a checkpoint")
    copied = _copy(smoke_run, tmp_path)
    shutil.rmtree(copied / "checkpoints")
    (copied / "checkpoints").symlink_to(other / "checkpoints")
    linked = copied / "checkpoints"
    out = f"output_dir={tmp_path / 'e'}"
    entries = {
        "resume": lambda: run.train(compose_cfg([*SMOKE, f"resume={copied}"])),
        "resume a file": lambda: run.train(compose_cfg([*SMOKE, f"resume={linked / NEWEST}"])),
        "evaluate run_dir": lambda: run.evaluate(
            compose_cfg([f"run_dir={copied}", *EVALUATE, out], "evaluate")
        ),
        "evaluate ckpt": lambda: run.evaluate(
            compose_cfg([f"ckpt={linked / NEWEST}", *EVALUATE, out], "evaluate")
        ),
        "evaluate ckpt=latest": lambda: run.evaluate(
            compose_cfg([f"ckpt={linked / 'latest'}", *EVALUATE, out], "evaluate")
        ),
        "export": lambda: export_checkpoint(linked / NEWEST, "pt2"),
        "InferenceAgent": lambda: InferenceAgent.from_checkpoint(copied),
        "list_checkpoints": lambda: list_checkpoints(copied),
        "latest_checkpoint": lambda: latest_checkpoint(copied),
        "find_checkpoints": lambda: find_checkpoints(run_dir=str(copied)),
        "remove_stale_temp_files": lambda: remove_stale_temp_files(copied),
    }
    with RunLock(other):  # the other run trains meanwhile
        before = file_hashes(other)
        for name, enter in entries.items():
            with pytest.raises(UnsafePathError) as info:
                enter()
            _refused(info.value, linked)
            assert "linked folder" in str(info.value), name
            assert file_hashes(other) == before, name
    assert in_flight.read_bytes() == b"half a checkpoint"


def test_a_glob_never_goes_through_a_link_below_its_folder(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``evaluate.py 'ckpt=FOLDER/**/*.pt'`` on a copied folder: a link to another run of the
    user's is not evaluated (nor its files written), a link loop does not hang, a linked
    ``checkpoints`` matches nothing, and each skipped link is named."""
    other = _copy(smoke_run, tmp_path, "other")
    shared = tmp_path / "shared"
    copied = _copy(smoke_run, shared, "run")
    (shared / "more").symlink_to(other, target_is_directory=True)
    for name in ("a", "b"):  # 2**depth paths through a loop, to the length limit
        (copied / name).symlink_to(".", target_is_directory=True)
    (shared / "alias.pt").symlink_to(other / "checkpoints" / NEWEST)
    before = file_hashes(other)
    refs = find_checkpoints(ckpt=f"{shared}/**/*.pt")
    assert [r.path for r in refs] == [
        copied / "checkpoints" / FIRST,
        copied / "checkpoints" / NEWEST,
    ]
    skipped = [copied / "a", copied / "b", shared / "alias.pt", shared / "more"]
    warned = [r.getMessage() for r in caplog.records if "never followed" in r.getMessage()]
    assert len(warned) == 1 and all(str(p) in warned[0] for p in skipped), warned
    caplog.clear()
    run.evaluate(
        compose_cfg(
            [f"ckpt={shared}/**/*.pt", *EVALUATE, f"output_dir={tmp_path / 'e'}"], "evaluate"
        )
    )
    assert file_hashes(other) == before
    (copied / "checkpoints").rename(tmp_path / "moved")
    (copied / "checkpoints").symlink_to(other / "checkpoints", target_is_directory=True)
    with pytest.raises(CheckpointError, match="no checkpoint file"):
        find_checkpoints(ckpt=f"{copied}/*/ckpt_*.pt")
    assert file_hashes(other) == before


def test_the_run_folder_typed_may_be_a_link_and_is_locked_as_itself(
    smoke_run: Path, tmp_path: Path
) -> None:
    """Only the components below the typed folder are checked (macOS's ``/var`` is a link)."""
    from rl.checkpoints.lock import RunFolderLockedError

    folder = _copy(smoke_run, tmp_path)
    typed = tmp_path / "typed"
    typed.symlink_to(folder)
    assert list_checkpoints(typed) == [
        folder / "checkpoints" / FIRST,
        folder / "checkpoints" / NEWEST,
    ]
    assert find_checkpoints(run_dir=str(typed))[-1].run_dir == folder
    with RunLock(folder):
        lock = RunLock(typed, "evaluation")
        assert lock.run_dir == folder
        with pytest.raises(RunFolderLockedError, match=str(folder)):
            lock.acquire()


def test_linked_videos_wandb_tensorboard_and_superseded_folders_are_refused(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any
) -> None:
    """Each folder the run writes into or moves files into, linked out of (or across) the run."""
    from rl.loggers.wandb import WandbSink

    sentinel = _sentinel(tmp_path)
    before = file_hashes(sentinel)
    folder = _copy(smoke_run, tmp_path)
    for name in ("videos", "wandb"):
        (folder / name).symlink_to(sentinel)
    (folder / "tensorboard").symlink_to(folder / "checkpoints")  # (inside the run: no better)
    # Resuming from the older checkpoint moves the newer one to checkpoints/superseded_<time>:
    # planted for the next two minutes, each a link out of the run.
    now = time.time()
    for t in range(-2, 120):
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now + t))
        (folder / "checkpoints" / f"superseded_{stamp}").symlink_to(sentinel)
    checkpoints = file_hashes(folder / "checkpoints")

    video = _probe_video(folder, compose_cfg)
    with pytest.raises(UnsafePathError) as info:
        video.record(InferenceAgent.from_checkpoint(folder).model, 256)
    video.close()
    _refused(info.value, folder / "videos")
    with pytest.raises(UnsafePathError) as info:
        WandbSink(context=_context(folder), mode="offline")
    _refused(info.value, folder / "wandb")
    with pytest.raises(UnsafePathError) as info:
        TensorBoardSink(context=_context(folder))
    _refused(info.value, folder / "tensorboard")
    with pytest.raises(UnsafePathError) as info:
        run.train(compose_cfg([*SMOKE, f"resume={folder / 'checkpoints' / FIRST}"]))
    assert "superseded_" in str(info.value) and "linked folder" in str(info.value)
    assert file_hashes(sentinel) == before
    assert file_hashes(folder / "checkpoints") == checkpoints  # the newer checkpoint stayed


def test_a_dot_wandb_link_is_never_written_through(smoke_run: Path, tmp_path: Path) -> None:
    """wandb writes into ``<dir>/.wandb`` instead of ``<dir>/wandb`` wherever the former exists:
    a copied run's ``.wandb`` link out of the run is ignored, its files stay in ``wandb/``."""
    from rl.loggers.wandb import WandbSink

    sentinel = _sentinel(tmp_path)
    before = file_hashes(sentinel)
    folder = _copy(smoke_run, tmp_path)
    (folder / ".wandb").symlink_to(sentinel, target_is_directory=True)
    sink = WandbSink(context=_context(folder), mode="offline")
    sink.log(1, {"x": 1.0})
    sink.close()
    assert file_hashes(sentinel) == before
    assert list((folder / "wandb").glob("offline-run-*"))


def test_write_atomic_refuses_a_linked_folder_and_a_folder_under_its_name(
    tmp_path: Path,
) -> None:
    sentinel = _sentinel(tmp_path)
    before = file_hashes(sentinel)
    run_dir = tmp_path / "run"
    (run_dir / "a").mkdir(parents=True)
    (run_dir / "a" / "linked").symlink_to(sentinel)
    with pytest.raises(UnsafePathError, match="linked folder") as info:
        write_atomic(run_dir / "a" / "linked" / "victim.txt", "written")
    _refused(info.value, run_dir / "a" / "linked")
    (run_dir / "summary.csv").mkdir()
    with pytest.raises(UnsafePathError, match="is a folder") as info:
        write_atomic(run_dir / "summary.csv", "written")
    _refused(info.value, run_dir / "summary.csv")
    assert file_hashes(sentinel) == before and _temporary_files(run_dir) == []
    # run_subdir: made where missing, refused where a link or a file, checked below the run
    from rl.utils.files import run_subdir

    assert run_subdir(run_dir, "x/y") == run_dir / "x" / "y" and (run_dir / "x" / "y").is_dir()
    assert run_subdir(run_dir, "missing", create=False) == run_dir / "missing"
    assert not (run_dir / "missing").exists()
    with pytest.raises(UnsafePathError, match="linked folder"):
        run_subdir(run_dir, "a", "linked", "deeper")
    assert not (sentinel / "deeper").exists()
    (run_dir / "file").write_text("")
    with pytest.raises(UnsafePathError, match="not a folder"):
        run_subdir(run_dir, "file", create=False)


# ------------------------------------------------ minor 4: folders and FIFOs for files
@pytest.mark.timeout(60)  # (a FIFO opened to read or write would block: never)
def test_folders_and_fifos_where_files_belong_are_named_errors(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any
) -> None:
    folder = _copy(smoke_run, tmp_path)
    checkpoints = folder / "checkpoints"
    # `latest` that is a folder: ignored, as a `latest` that is not a regular file always is
    (checkpoints / "latest").unlink()
    (checkpoints / "latest").mkdir()
    assert checkpoint_file(checkpoints / "latest") == checkpoints / NEWEST
    assert latest_checkpoint(folder) == checkpoints / NEWEST
    # a checkpoint name that is a FIFO: not listed, and refused by name (never opened)
    fifo = checkpoints / "ckpt_stage00_step000000000384.pt"
    os.mkfifo(fifo)
    assert list_checkpoints(folder) == [checkpoints / FIRST, checkpoints / NEWEST]
    with pytest.raises(CheckpointError, match="not a regular file"):
        load_checkpoint(fifo)
    out = f"output_dir={tmp_path / 'e'}"
    with pytest.raises(CheckpointError, match=f"{fifo} is not a regular file"):
        run.evaluate(compose_cfg([f"ckpt={fifo}", *EVALUATE, out], "evaluate"))
    # eval_summary.csv a folder: evaluation names it
    (folder / "eval_summary.csv").mkdir()
    with pytest.raises(UnsafePathError) as info:
        run.evaluate(compose_cfg([f"run_dir={folder}", *EVALUATE, out], "evaluate"))
    _refused(info.value, folder / "eval_summary.csv")
    # train.log a folder: resume names it (the run wrote its own: a file, replaced here)
    (folder / "train.log").unlink(missing_ok=True)
    (folder / "train.log").mkdir()
    with pytest.raises(UnsafePathError) as info:
        run.train(compose_cfg([*SMOKE, f"resume={folder}"]))
    _refused(info.value, folder / "train.log")
    # metrics.jsonl a folder, then a FIFO (no reader: opening it to write would fail or block)
    (folder / "metrics.jsonl").unlink()
    (folder / "metrics.jsonl").mkdir()
    with pytest.raises(UnsafePathError) as info:
        JsonlSink(context=_context(folder))
    _refused(info.value, folder / "metrics.jsonl")
    (folder / "metrics.jsonl").rmdir()
    os.mkfifo(folder / "metrics.jsonl")
    with pytest.raises(UnsafePathError) as info:
        JsonlSink(context=_context(folder))
    _refused(info.value, folder / "metrics.jsonl")
    # the lock file a folder
    (folder / ".lock").unlink()
    (folder / ".lock").mkdir()
    with pytest.raises(UnsafePathError) as info:
        RunLock(folder).acquire()
    _refused(info.value, folder / ".lock")


# ----------------------------------------------------- minor 5: glob characters in ckpt=
def test_a_checkpoint_path_with_glob_characters_is_taken_literally(
    smoke_run: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "runs[1]"
    folder.mkdir()
    literal = folder / "ckpt[1].pt"
    shutil.copy(smoke_run / "checkpoints" / NEWEST, literal)
    (tmp_path / "runs1").mkdir()  # what the glob would match instead
    shutil.copy(smoke_run / "checkpoints" / FIRST, tmp_path / "runs1" / "ckpt1.pt")
    assert not is_glob(str(literal))
    refs = find_checkpoints(ckpt=str(literal))
    assert [r.path for r in refs] == [literal] and refs[0].step == 256
    assert is_glob(str(tmp_path / "runs*" / "ckpt*.pt"))  # a real glob still is one


def test_fifos_and_devices_are_judged_before_they_are_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a device (a tar extracted by root keeps device nodes) or a FIFO can have effects
    of its own: a run folder's ``.lock``, appended logs, capped reads and checkpoints are refused
    on what they are, before ``os.open`` sees them."""
    from rl.utils.files import open_append, read_regular_file

    planted = [tmp_path / "fifo"]
    os.mkfifo(planted[0])
    try:  # a character device (/dev/null's numbers): root only
        os.mknod(tmp_path / "device", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        planted.append(tmp_path / "device")
    except PermissionError:
        pass
    opened: list[str] = []
    real_open = os.open

    def recording_open(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    for path in planted:
        with pytest.raises(UnsafePathError, match="not a regular file"):
            open_append(path)
        assert read_regular_file(path, 10) is None
        with pytest.raises(CheckpointError, match="not a regular file"):
            load_checkpoint(path)
    folder = tmp_path / "run"
    folder.mkdir()
    os.mkfifo(folder / ".lock")
    with pytest.raises(UnsafePathError, match="not a regular file"):
        RunLock(folder).acquire()
    assert not set(opened) & {*map(str, planted), str(folder / ".lock")}, opened


@pytest.mark.parametrize(
    "pattern",
    ["**/*.pt", "*/checkpoints/*.pt", "**", "r?/**/*.pt", "**/checkpoints/*", ".*/*.pt",
     "r1/.*.pt", "*.pt", "[r]1/*/*", "r2/sub/**/c.pt", "**/deep"],
)  # fmt: skip
def test_a_glob_without_links_matches_what_glob_matches(
    tmp_path: Path, pattern: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no link is in the way, the link-free walk finds exactly ``glob.glob``'s matches,
    relative or absolute, hidden names and ``**`` alike."""
    import glob

    from rl.utils.files import glob_without_links

    for folder in ("r1/checkpoints", "r2/checkpoints", "r2/sub/deep", ".hidden"):
        (tmp_path / folder).mkdir(parents=True)
    for file in ("r1/checkpoints/a.pt", "r2/checkpoints/b.pt", "r2/sub/deep/c.pt", "x.pt",
                 ".hidden/h.pt", "r1/.y.pt", "r1/checkpoints/n.txt"):  # fmt: skip
        (tmp_path / file).write_text("")
    expected = sorted({Path(p) for p in glob.glob(str(tmp_path / pattern), recursive=True)})
    assert expected  # (each pattern matches something here)
    assert glob_without_links(str(tmp_path / pattern)) == (expected, [])
    monkeypatch.chdir(tmp_path)
    relative = sorted({Path(p) for p in glob.glob(pattern, recursive=True)})
    assert glob_without_links(pattern) == (relative, [])

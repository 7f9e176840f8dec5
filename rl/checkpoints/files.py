"""Checkpoint files: sortable names, atomic writes, safe loading (:func:`load_checkpoint`).

A ``latest`` file beside the checkpoints names the newest (``best``: :mod:`.retention`). Each
archive carries its SHA-256 in the zip comment: ``torch.load`` checks no CRCs, so without it a
flipped bit would load silently. Every function that reads a run's ``checkpoints/`` raises
:class:`~rl.utils.files.UnsafePathError` where it is a link (a copied run pointing at another
run's files) or not a folder.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import torch

from rl.checkpoints.config_tree import saved_choices, saved_sources
from rl.checkpoints.errors import CheckpointError, UntrustedCheckpointError
from rl.checkpoints.saved_config import config_data
from rl.utils.files import TMP_SUFFIX, read_regular_file, run_subdir, write_atomic
from rl.utils.finite import NonFiniteError, nonfinite_tensors
from rl.utils.saved import MAX_DEPTH, MAX_VALUES, odd_values

CHECKPOINT_DIR = "checkpoints"
# Layout version (written by rl.training.state.TrainerState.state_dict); 2 to 5 load.
# 3: recurrent state as a dict (``rollout.state``) and the collector's ``normalizer``;
# 4: ``losses``; 5: ``choices`` replaces ``config_unresolved`` (never read), ``config_sources``
# and ``finished_episodes`` (both optional: absent, they read as None).
CHECKPOINT_FORMAT = 5
LATEST = "latest"
BEST = "best"  # (written by rl.checkpoints.retention, with its record best.json)
# (ASCII digits, as many as a stage index and an int64 step take: a longer name is no checkpoint's)
_NAME_RE = re.compile(r"^ckpt_stage([0-9]{1,9})_step([0-9]{1,19})\.pt$")


def checkpoint_name(stage: int, env_steps: int) -> str:
    """File name of a checkpoint at ``stage`` and global ``env_steps`` (zero-padded: sortable)."""
    return f"ckpt_stage{stage:02d}_step{env_steps:012d}.pt"


def parse_checkpoint_name(path: str | Path) -> tuple[int, int] | None:
    """``(stage, env_steps)`` from a checkpoint file name, or None."""
    m = _NAME_RE.match(Path(path).name)
    return (int(m.group(1)), int(m.group(2))) if m else None


# Zip's end-of-central-directory record: its signature, and its size without the comment.
_EOCD, _EOCD_SIZE = b"PK\x05\x06", 22
_DIGEST_TAG = b"rl-sha256:"
# More archive entries than any checkpoint has (one per tensor storage): refused unread.
MAX_ENTRIES = 100_000


def with_digest(data: bytes) -> bytes:
    """A ``torch.save`` archive with the SHA-256 of its bytes as the zip archive comment."""
    eocd = data.rfind(_EOCD)
    if eocd < 0 or len(data) != eocd + _EOCD_SIZE:
        raise ValueError("not a zip archive without a comment (as torch.save writes them)")
    body = data[: eocd + _EOCD_SIZE - 2]  # all but the comment length
    comment = _DIGEST_TAG + hashlib.sha256(body).hexdigest().encode()
    return body + len(comment).to_bytes(2, "little") + comment


def _archive_end(f: BinaryIO, size: int) -> tuple[int, bytes] | str:
    """``(offset of the end record, its comment)`` read from the last 64 KiB, or why not."""
    tail_start = max(0, size - _EOCD_SIZE - 65_535)
    f.seek(tail_start)
    tail = f.read(size - tail_start)
    eocd = len(tail)
    while True:
        eocd = tail.rfind(_EOCD, 0, eocd)
        if eocd < 0:
            return "it is not a complete archive (truncated, extended or not a checkpoint)"
        length = int.from_bytes(tail[eocd + 20 : eocd + 22], "little")
        if eocd + _EOCD_SIZE + length == len(tail):
            return tail_start + eocd, tail[eocd + _EOCD_SIZE :]


def _digest_problem(f: BinaryIO, eocd: int, comment: bytes) -> str | None:
    """Why the bytes before the comment length do not match the digest in ``comment``."""
    if not comment:
        return None  # written before checkpoints carried a digest
    expected = comment[len(_DIGEST_TAG) :].decode("ascii", "replace")
    if not comment.startswith(_DIGEST_TAG) or len(expected) != 64:
        return "its digest is damaged"
    digest, left = hashlib.sha256(), eocd + _EOCD_SIZE - 2
    f.seek(0)
    while left > 0:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            return "it is shorter than its archive directory says (damaged)"
        digest.update(chunk)
        left -= len(chunk)
    if digest.hexdigest() != expected:
        return "its SHA-256 does not match the one it was written with (damaged)"
    return None


def _entries_problem(f: BinaryIO, size: int) -> str | None:
    """Why the archive's entries cannot be loaded within the file's own size (None: they can)."""
    f.seek(0)
    try:
        with zipfile.ZipFile(f) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        return f"its archive directory is unreadable ({e})"
    if len(entries) > MAX_ENTRIES:
        return f"it has {len(entries):,} archive entries (more than {MAX_ENTRIES:,})"
    total = 0
    for entry in entries:
        if entry.compress_type != zipfile.ZIP_STORED:
            return (
                f"its entry {entry.filename!r} is compressed (torch.save stores entries; "
                "a compressed one may inflate without bound)"
            )
        if entry.file_size != entry.compress_size:
            return f"its entry {entry.filename!r} declares two different sizes"
        total += entry.file_size
    if total > size:
        return f"its entries declare {total:,} bytes, more than the file's {size:,}"
    return None


def archive_problem(f: BinaryIO) -> str | None:
    """Why an open checkpoint file cannot be loaded safely (None: it can), in bounded memory.

    The end record must close the file and the digest match (no digest: an older file, loaded
    unverified). Entries must be stored (``torch.save`` compresses none) and fit in the file, so
    a sparse multi-GB file or a zip bomb is refused before anything is inflated.
    """
    size = f.seek(0, os.SEEK_END)
    end = _archive_end(f, size)
    if isinstance(end, str):
        return end
    return _digest_problem(f, *end) or _entries_problem(f, size)


def save_checkpoint(run_dir: Path, state: dict[str, Any], stage: int, env_steps: int) -> Path:
    """Atomically write ``state`` to ``run_dir/checkpoints/<name>`` and update ``latest``.

    Raises:
        NonFiniteError: The weights, the optimizer state or the normalisation statistics hold
            NaN or infinity (nothing is written: it would load as valid and be resumed from).
        CheckpointError: ``state`` holds what no checkpoint may
            (:func:`~rl.utils.saved.odd_values`: a meta, sparse or nested tensor, nesting or
            values beyond its limits; nothing is written: it would not load), or the file
            cannot be written; the message says which earlier checkpoint is intact.
    """
    run_dir = Path(run_dir)
    path = run_dir / CHECKPOINT_DIR / checkpoint_name(stage, env_steps)
    odd = _odd_entries(state)
    if odd:  # it would not load (a policy of yours with such a buffer learns it here)
        raise CheckpointError(
            f"checkpoint {path} not written: it would hold {odd}, which a checkpoint cannot "
            f"(dense tensors only, nested at most {MAX_DEPTH} deep, at most {MAX_VALUES} "
            "values); " + _intact(run_dir)
        )
    bad = _nonfinite_entries(state)
    if bad:
        raise NonFiniteError(
            f"checkpoint {path} not written: non-finite values in {bad}; " + _intact(run_dir)
        )
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path = run_subdir(run_dir, CHECKPOINT_DIR) / path.name  # (a linked checkpoints/: refused)
    try:
        write_atomic(path, lambda f: f.write(with_digest(buffer.getvalue())))
    except OSError as e:
        raise CheckpointError(
            f"cannot write checkpoint {path} (run folder {run_dir}): "
            f"{e.strerror or e}; " + _intact(run_dir)
        ) from e
    pointer = path.parent / LATEST
    try:
        write_atomic(pointer, lambda f: f.write(path.name.encode()))
    except OSError as e:
        raise CheckpointError(
            f"wrote checkpoint {path} completely, but cannot update {pointer} "
            f"({e.strerror or e}); resume=RUN_DIR picks the newest complete checkpoint "
            "without it"
        ) from e
    return path


# The entries whose tensors must be finite, when saved and when loaded.
_FINITE_ENTRIES = ("model", "losses", "optimizer", "normalizer")


def _odd_entries(state: dict[str, Any]) -> str:
    """Where ``state`` holds what no checkpoint may (:func:`odd_values`; "": nowhere).

    The saved config aside: it is plain data, checked by ``config_data``.
    """
    odd = odd_values({k: v for k, v in state.items() if k != "config"})
    more = f" and {len(odd) - 5} more" if len(odd) > 5 else ""
    return f"{', '.join(odd[:5])}{more}"


def _nonfinite_entries(state: dict[str, Any]) -> str:
    """The tensors of ``state``'s weights and statistics holding NaN or infinity ("": none)."""
    bad = [name for key in _FINITE_ENTRIES for name in nonfinite_tensors(state.get(key), key)]
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    return f"{', '.join(bad[:5])}{more}"


def _intact(run_dir: Path) -> str:
    """Which earlier checkpoint of the run is intact (for a failed save's message)."""
    found = list_checkpoints(run_dir)
    if not found:
        return "the run has no earlier checkpoint"
    return f"the previous checkpoint {found[-1]} is intact (resume={run_dir} continues from it)"


def remove_stale_temp_files(run_dir: str | Path) -> list[Path]:
    """Delete temporary files left by writes that were killed (call only when nothing writes)."""
    folder = run_subdir(run_dir, CHECKPOINT_DIR, create=False)
    if not folder.is_dir():
        return []
    stale = [p for p in folder.glob(".*" + TMP_SUFFIX) if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoints of a run in step order: regular files under checkpoint names (not links)."""
    folder = run_subdir(run_dir, CHECKPOINT_DIR, create=False)
    if not folder.is_dir():
        return []
    found = [
        p
        for p in folder.iterdir()
        if parse_checkpoint_name(p) is not None and not p.is_symlink() and p.is_file()
    ]

    def order(path: Path) -> tuple[int, ...]:
        name = parse_checkpoint_name(path)
        assert name is not None  # (found: checkpoint names only)
        return name[::-1]

    return sorted(found, key=order)


# ``latest``/``best`` hold one file name; anything longer is not a pointer this code wrote.
_MAX_POINTER_BYTES = 256


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The newest checkpoint of a run: the one ``latest`` names, else the last in step order.

    Raises:
        CheckpointError: The run has no checkpoint.
    """
    folder = run_subdir(run_dir, CHECKPOINT_DIR, create=False)
    pointed = pointed_checkpoint(folder, LATEST)
    if pointed is not None:
        return pointed
    found = list_checkpoints(run_dir)
    if not found:
        raise CheckpointError(f"no checkpoint in {folder}")
    return found[-1]


def pointed_checkpoint(folder: Path, pointer: str) -> Path | None:
    """The checkpoint that ``folder/pointer`` (``latest``, ``best``) names, or None.

    Only a small regular file holding a checkpoint name of a regular file in ``folder`` counts
    (no links): a copied run whose pointer names ``../../elsewhere/foreign.pt`` never sends
    evaluation or resume out of the run.
    """
    raw = read_regular_file(folder / pointer, _MAX_POINTER_BYTES + 1)
    if raw is None or len(raw) > _MAX_POINTER_BYTES:
        return None
    name = raw.decode("utf-8", errors="replace").strip()
    candidate = folder / name
    if Path(name).name != name or parse_checkpoint_name(name) is None or candidate.is_symlink():
        return None
    return candidate if candidate.is_file() else None


def best_checkpoint(run_dir: str | Path) -> Path:
    """The best checkpoint of a run by its ``pipeline.best_metric`` (``checkpoints/best``).

    Raises:
        CheckpointError: No ``best`` pointer names a checkpoint beside it (tracking off,
            nothing better yet, or a pointer this code never wrote).
    """
    folder = run_subdir(run_dir, CHECKPOINT_DIR, create=False)
    found = pointed_checkpoint(folder, BEST)
    if found is None:
        raise CheckpointError(
            f"no best checkpoint in {folder}: {folder / BEST} is missing or does not name a "
            "checkpoint file beside it (pipeline.best_metric tracks one; null: off)"
        )
    return found


def checkpoint_file(path: str | Path) -> Path:
    """The checkpoint file ``path`` names (``evaluate.py ckpt=``).

    A file is itself (:func:`checked_file_path`); a run folder or its ``checkpoints/latest``
    names the run's newest checkpoint, ``checkpoints/best`` its best.
    """
    path = Path(path).expanduser()
    in_run = path.parent.name == CHECKPOINT_DIR
    if path.name == LATEST and (path.is_file() or (in_run and os.path.lexists(path))):
        return latest_checkpoint(path.parent.parent)
    if path.name == BEST and in_run:
        return best_checkpoint(path.parent.parent)
    if path.is_dir() and (path / CHECKPOINT_DIR).is_dir():
        return latest_checkpoint(path)
    return checked_file_path(path)


def checked_file_path(path: str | Path) -> Path:
    """``path``, a file a user named (``ckpt=``, ``export_path=``), with its folders checked.

    A file in ``checkpoints/`` lies in a run, whose ``checkpoints`` must be a real folder (a
    copied run linking to another run's is refused); any other file's folder is resolved. The
    file's own name is kept: a link the user names is theirs to follow.
    """
    path = Path(path).expanduser()
    if path.parent.name == CHECKPOINT_DIR:
        return run_subdir(path.parent.parent, CHECKPOINT_DIR, create=False) / path.name
    return path.parent.resolve() / path.name


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened to read if it is a regular file (never blocking on a FIFO)."""
    not_regular = CheckpointError(
        f"checkpoint {path} is not a regular file (a folder, a FIFO or a device)"
    )
    # Judged before opening too: opening a device can have effects of its own.
    try:
        kind: int | None = os.stat(path).st_mode
    except OSError:  # missing or unreadable: the open says which
        kind = None
    if kind is not None and not stat.S_ISREG(kind):
        raise not_regular
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except OSError as e:
        raise CheckpointError(f"cannot open checkpoint {path}: {e.strerror or e}") from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise not_regular
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint as untrusted input; a :class:`CheckpointError` names the file.

    The archive is checked before anything is unpickled, then loaded ``weights_only``. The saved
    config must be plain data (never built from here: it is rebuilt on the user's config tree)
    and ``choices`` names. A meta, sparse or nested tensor, containers nested too deep or too
    many values (never written: :func:`save_checkpoint` refuses them), and non-finite weights or
    statistics, are an
    :class:`UntrustedCheckpointError`, so ``resume=RUN`` never falls back to an older checkpoint.
    """
    path = Path(path)
    with _open_regular(path) as f:
        problem = archive_problem(f)
        if problem is not None:
            raise CheckpointError(f"cannot read checkpoint {path}: {problem}")
        f.seek(0)
        try:
            state = torch.load(f, map_location=map_location, weights_only=True)
        except Exception as e:
            first_line = next(iter(str(e).splitlines()), "")  # some errors have no message
            raise CheckpointError(
                f"cannot read checkpoint {path}: {type(e).__name__}: {first_line}\n"
                "(checkpoints are loaded with weights_only=True; a file that needs arbitrary "
                "unpickling is refused)"
            ) from e
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise CheckpointError(f"{path} is not a checkpoint of this project (no model/config)")
    version = state.get("format_version", 2)
    if type(version) is not int or not 2 <= version <= CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path}: checkpoint format {version!r}; this code reads formats 2 to "
            f"{CHECKPOINT_FORMAT} (a newer file needs newer code)"
        )
    if not isinstance(state.get("config"), dict):
        raise CheckpointError(f"{path}: its saved config is not a mapping")
    state.pop("config_unresolved", None)  # (older checkpoints) never read: it would be resolved
    state["config"] = config_data(state["config"], str(path))
    state["choices"] = saved_choices(state.get("choices"), str(path))
    state["config_sources"] = saved_sources(state.get("config_sources"), str(path))
    odd = _odd_entries(state)
    if odd:  # before any other walk of it: each would fail in its own raw way
        raise UntrustedCheckpointError(
            f"{path}: {odd}, which no checkpoint holds (save_checkpoint refuses them): "
            "a crafted or damaged file, refused"
        )
    bad = _nonfinite_entries(state)
    if bad:  # never written by this code (save_checkpoint refuses them): damaged or crafted
        raise UntrustedCheckpointError(
            f"{path}: non-finite values (NaN or infinity) in {bad}; this code never writes "
            "such a checkpoint (a crafted or damaged file): refused"
        )
    return state

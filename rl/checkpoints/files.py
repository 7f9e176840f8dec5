"""Checkpoint files: sortable names, atomic writes, safe loading.

Names are ``ckpt_stage{SS}_step{NNNNNNNNNNNN}.pt`` so that a plain sort is step order; a
``latest`` file beside them names the newest. Files are written to a temporary name, fsynced
and renamed, so a crash mid-write never leaves a corrupt file under a checkpoint name. Loading
uses ``torch.load(weights_only=True)``: a checkpoint that needs arbitrary unpickling is refused.

Files carry their own SHA-256 in the zip archive comment (``torch.load`` ignores it), because
``torch.load`` does not check the archive's CRCs: without it a flipped bit in a tensor would
load silently. :func:`load_checkpoint` verifies it, so a truncated, bit-flipped or otherwise
damaged file is a :class:`CheckpointError` naming the file. Files written before the digest
existed load unverified.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_DIR = "checkpoints"
LATEST = "latest"
_NAME_RE = re.compile(r"^ckpt_stage(\d+)_step(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be found or read."""


def checkpoint_name(stage: int, env_steps: int) -> str:
    """Sortable file name for a checkpoint at ``stage`` and global ``env_steps``."""
    return f"ckpt_stage{stage:02d}_step{env_steps:012d}.pt"


def parse_checkpoint_name(path: str | Path) -> tuple[int, int] | None:
    """``(stage, env_steps)`` from a checkpoint file name, or None."""
    m = _NAME_RE.match(Path(path).name)
    return (int(m.group(1)), int(m.group(2))) if m else None


# Mode of checkpoint files and of ``latest`` (mkstemp creates 0600 files).
FILE_MODE = 0o644
TMP_SUFFIX = ".tmp"


def _atomic_write(path: Path, write: Any) -> None:
    """Write ``path`` via a temporary file in the same folder: write, fsync, rename, fsync dir.

    A crash (even ``kill -9``) at any moment leaves either the old file or the complete new
    one under ``path``, plus at worst a stray hidden ``.<name>.*.tmp`` file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# Zip's end-of-central-directory record: its signature, and its size without the comment.
_EOCD, _EOCD_SIZE = b"PK\x05\x06", 22
_DIGEST_TAG = b"rl-sha256:"


def with_digest(data: bytes) -> bytes:
    """A ``torch.save`` archive with the SHA-256 of its bytes as the zip archive comment."""
    eocd = data.rfind(_EOCD)
    if eocd < 0 or len(data) != eocd + _EOCD_SIZE:
        raise ValueError("not a zip archive without a comment (as torch.save writes them)")
    body = data[: eocd + _EOCD_SIZE - 2]  # all but the comment length
    comment = _DIGEST_TAG + hashlib.sha256(body).hexdigest().encode()
    return body + len(comment).to_bytes(2, "little") + comment


def digest_problem(data: bytes) -> str | None:
    """Why ``data`` is not a complete archive matching its digest (None: it is).

    The archive's end record must close the file exactly (its comment running to the last
    byte); an empty comment is a file from before digests, loaded unverified; any other comment
    must be the digest, and the digest must match.
    """
    eocd = len(data)
    while True:
        eocd = data.rfind(_EOCD, max(0, len(data) - _EOCD_SIZE - 65_535), eocd)
        if eocd < 0:
            return "it is not a complete archive (truncated, extended or not a checkpoint)"
        length = int.from_bytes(data[eocd + 20 : eocd + 22], "little")
        if eocd + _EOCD_SIZE + length == len(data):
            break
    comment = data[eocd + _EOCD_SIZE :]
    if not comment:
        return None  # written before checkpoints carried a digest
    expected = comment[len(_DIGEST_TAG) :].decode("ascii", "replace")
    if not comment.startswith(_DIGEST_TAG) or len(expected) != 64:
        return "its digest is damaged"
    if hashlib.sha256(data[: eocd + _EOCD_SIZE - 2]).hexdigest() != expected:
        return "its SHA-256 does not match the one it was written with (damaged)"
    return None


def save_checkpoint(run_dir: Path, state: dict[str, Any], stage: int, env_steps: int) -> Path:
    """Atomically write ``state`` to ``run_dir/checkpoints/<name>`` and update ``latest``."""
    path = Path(run_dir) / CHECKPOINT_DIR / checkpoint_name(stage, env_steps)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    _atomic_write(path, lambda f: f.write(with_digest(buffer.getvalue())))
    _atomic_write(path.parent / LATEST, lambda f: f.write(path.name.encode()))
    return path


def remove_stale_temp_files(run_dir: str | Path) -> list[Path]:
    """Delete temporary files left by writes that were killed (call only when nothing writes)."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    stale = [p for p in folder.glob(".*" + TMP_SUFFIX) if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoints of a run in step order."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if parse_checkpoint_name(p) is not None]
    return sorted(found, key=lambda p: parse_checkpoint_name(p)[::-1])  # type: ignore[index]


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The newest checkpoint of a run (via ``latest``, else the last in step order)."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    pointer = folder / LATEST
    if pointer.is_file():
        candidate = folder / pointer.read_text().strip()
        if candidate.is_file():
            return candidate
    found = list_checkpoints(run_dir)
    if not found:
        raise CheckpointError(f"no checkpoint in {folder}")
    return found[-1]


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint safely (``weights_only=True``), with a clear error if that fails."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    data = path.read_bytes()
    problem = digest_problem(data)
    if problem is not None:
        raise CheckpointError(f"cannot read checkpoint {path}: {problem}")
    try:
        state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as e:
        first_line = next(iter(str(e).splitlines()), "")  # some errors have no message
        raise CheckpointError(
            f"cannot read checkpoint {path}: {type(e).__name__}: {first_line}\n"
            "(checkpoints are loaded with weights_only=True; a file that needs arbitrary "
            "unpickling is refused)"
        ) from e
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise CheckpointError(f"{path} is not a checkpoint of this project (no model/config)")
    return state

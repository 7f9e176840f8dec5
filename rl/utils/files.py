"""Files a run reads and writes in its folder, which may have been copied from anywhere.

A run folder is untrusted input: a copied one may hold links where the run writes
(``config.yaml -> ~/.bashrc``) or a FIFO where it reads. Every file a run writes goes through
this module:

- :func:`write_atomic`: a temporary file in the same folder, fsynced and renamed over the name;
  the rename replaces a link, never what it points to, and a crash leaves the old file or the
  new one, never half of one;
- :func:`open_append` / :class:`NoFollowFileHandler`: appends (logs, ``metrics.jsonl``) opened
  with ``O_NOFOLLOW``: a link under the name is refused (:class:`UnsafePathError`);
- :func:`read_regular_file`: reads a bounded regular file, not a link, without blocking.

A full disk is an :class:`OSError` whose message names the file and says the disk is full
(:func:`describe_write_error`).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

# Mode of the files a run writes (mkstemp creates 0600 files).
FILE_MODE = 0o644
TMP_SUFFIX = ".tmp"


class UnsafePathError(OSError):
    """A path of the run folder is a link (or not a regular file) where the run writes."""


def describe_write_error(path: str | Path, e: OSError, what: str = "") -> str:
    """A one-line message for a failed write of ``path`` (a full disk said as such)."""
    label = f"{what} {path}" if what else str(path)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"cannot write {label}: the disk is full ({e.strerror}); free space and resume"
    return f"cannot write {label}: {e.strerror or e}"


def is_run_folder_write_error(e: BaseException) -> bool:
    """A full disk (or quota), or a link where the run writes: an error a user acts on."""
    return isinstance(e, UnsafePathError) or (
        isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
    )


def write_atomic(path: str | Path, write: Callable[[IO[bytes]], Any] | bytes | str) -> None:
    """Write ``path`` via a temporary file in the same folder: write, fsync, rename, fsync dir.

    ``write`` is the content (bytes or text) or a function writing to the binary file. A crash
    (even ``kill -9``) at any moment leaves either the old file or the complete new one under
    ``path``, plus at worst a stray hidden ``.<name>.*.tmp`` file. A link under ``path`` is
    replaced by the file, never followed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(write, str):
        write = write.encode("utf-8")
    data = write
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                data(f)
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


def open_nofollow(path: str | Path, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open`` that refuses a link (or a FIFO, a device) under ``path``; a file descriptor.

    Raises:
        UnsafePathError: ``path`` is a link or not a regular file.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePathError(
                errno.ELOOP, f"{path} is a symbolic link; a run never writes through one"
            ) from e
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(errno.EINVAL, f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def open_append(path: str | Path) -> IO[str]:
    """``path`` opened to append text (created if missing), refusing a link under the name."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "a", encoding="utf-8")


def read_regular_file(path: str | Path, limit: int) -> bytes | None:
    """At most ``limit`` bytes of ``path`` if it is a regular file and not a link, else None.

    A link to ``/dev/zero`` or a FIFO is skipped at once instead of filling memory or blocking.
    """
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


class NoFollowFileHandler(logging.FileHandler):
    """A :class:`logging.FileHandler` (append) that refuses a link under its file's name."""

    def _open(self) -> Any:  # (logging's hook: called when the stream is first needed)
        return open_append(self.baseFilename)


__all__ = [
    "FILE_MODE",
    "NoFollowFileHandler",
    "TMP_SUFFIX",
    "UnsafePathError",
    "describe_write_error",
    "is_run_folder_write_error",
    "open_append",
    "open_nofollow",
    "read_regular_file",
    "write_atomic",
]

"""One writer per run folder: an exclusive ``flock`` on ``<run>/.lock`` for the whole run.

Two trainers in one folder (two ``resume=`` of one run, two jobs whose timestamped folders
collide) would interleave ``metrics.jsonl`` and checkpoint histories, and one could delete the
other's temporary checkpoint mid-write. The trainer and ``evaluate.py`` hold :class:`RunLock`
from before they touch the folder until they end; their child processes run under it.

The kernel's lock goes with the process, so ``kill -9`` leaves nothing that blocks the next
taker. The file stays (deleting lock files races with the next taker) and only says who held it
last. On some network file systems (old NFS) ``flock`` does not keep two machines apart.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
import time
from pathlib import Path
from types import TracebackType

from rl.utils.files import open_nofollow, read_regular_file

LOCK_NAME = ".lock"


class RunFolderLockedError(RuntimeError):
    """Another process holds the run folder's lock; the message names it and its pid."""


class RunLock:
    """The exclusive lock of a run folder (resolved: the same whichever link reaches it).

    ``purpose`` (``training``, ``evaluation``) is what a later taker's refusal says.
    """

    def __init__(self, run_dir: str | Path, purpose: str = "training") -> None:
        self.run_dir = Path(run_dir).resolve()
        self.path = self.run_dir / LOCK_NAME
        self.purpose = purpose
        self._fd: int | None = None
        self.created_folder = False  # this lock made the run folder (it did not exist)

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Take the lock now, or a :class:`RunFolderLockedError` naming the holder's pid."""
        if self._fd is not None:
            return self
        self.created_folder = not self.run_dir.exists()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # never through a link
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunFolderLockedError(
                f"run folder {self.run_dir} is in use by another process "
                f"({self.holder() or 'holder unknown'}); only one trainer or evaluation may "
                "write to a run folder at a time. Wait for it to end (or stop it: it saves a "
                "checkpoint on SIGTERM), or resume from a copy of the folder"
            ) from None
        os.ftruncate(fd, 0)
        record = (
            f"pid {os.getpid()} on {socket.gethostname()}, {self.purpose} since "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(sys.argv)[:500]}\n"
        )
        os.write(fd, record.encode())
        self._fd = fd
        return self

    def holder(self) -> str:
        """Who holds (or last held) the lock, as written in the lock file."""
        record = read_regular_file(self.path, 4096)  # (never a link or a FIFO)
        return "" if record is None else record.decode(errors="replace").strip()

    def release(self) -> None:
        """Release the lock (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the open file drops the flock

    def discard_unused_folder(self) -> bool:
        """Remove the run folder this lock made if nothing but the lock is in it; whether it did.

        For a run refused after it took its folder (a task that cannot be built).
        """
        if not (self.held and self.created_folder):
            return False
        try:
            if [p.name for p in self.run_dir.iterdir()] == [LOCK_NAME]:
                self.path.unlink()
                self.run_dir.rmdir()
                return True
        except OSError:
            pass  # something appeared meanwhile: leave the folder
        return False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

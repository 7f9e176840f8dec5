"""Files a run reads and writes in its folder, which may have been copied from anywhere.

A run folder is untrusted input: a copied one may hold links where the run writes
(``config.yaml -> ~/.bashrc``, ``checkpoints -> ../other_run/checkpoints``) or a FIFO where it
reads. So every file a run writes goes through here: folders are checked component by
component, writes are atomic renames that replace a link rather than follow it, and appends and
reads refuse links (``O_NOFOLLOW``) and never block on a FIFO.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

FILE_MODE = 0o644  # (mkstemp creates 0600 files)
TMP_SUFFIX = ".tmp"


class UnsafePathError(OSError):
    """A path of a run folder is a link, or not a regular file or folder, where the run works."""


_LINKED_FOLDER = "a run never reads or writes through a linked folder"


def _link_error(path: str | Path) -> UnsafePathError:
    return UnsafePathError(
        errno.ELOOP, f"{path} is a symbolic link; a run never writes through one"
    )


def run_subdir(run_dir: str | Path, *parts: str, create: bool = True) -> Path:
    """The folder ``run_dir/parts...`` of a run, checked component by component.

    ``run_dir`` itself is resolved (it may legitimately be reached through a link:
    ``/var -> /private/var``); below it a link or a non-folder is refused, and a missing
    component is created (``create``) or left missing (for reading).

    Raises:
        UnsafePathError: A component is a link or not a folder (the message names it).
        ValueError: A part is absolute or climbs out with ``..``.
    """
    path = Path(run_dir).resolve()
    names = [name for part in parts for name in Path(part).parts]
    if any(name in ("..", "/") or Path(name).is_absolute() for name in names):
        raise ValueError(f"run_subdir: {'/'.join(parts)!r} is not a folder inside the run")
    if create:
        path.mkdir(parents=True, exist_ok=True)  # (the run folder: the caller's, unchecked)
    for i, name in enumerate(names):
        path = path / name
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            if not create:
                return path.joinpath(*names[i + 1 :])
            try:
                os.mkdir(path)
                continue
            except FileExistsError:  # made meanwhile: judged below like any other
                mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            raise UnsafePathError(
                errno.ELOOP, f"{path} is a symbolic link; {_LINKED_FOLDER} (a copied run folder?)"
            )
        if not stat.S_ISDIR(mode):
            raise UnsafePathError(
                errno.ENOTDIR, f"{path} is not a folder; the run keeps a folder under that name"
            )
    return path


GLOB_CHARS = frozenset("*?[")


def glob_without_links(pattern: str) -> tuple[list[Path], list[Path]]:
    """``glob.glob(pattern, recursive=True)``, never going through a link below its fixed part.

    The folders before the first component with a wildcard are the user's own (links allowed);
    below them, a link (to a file or a folder) is skipped, not followed: a link in a copied
    folder could lead into another run, and a link loop would never end. Hidden names match only
    a component that starts with a dot, as in ``glob``. Returns ``(matches, skipped links)``,
    each sorted and without duplicates; the skipped links are those that could have led to a
    match (a link the last component matches, or a link to a folder).
    """
    parts = Path(os.path.expanduser(pattern)).parts
    fixed = next((i for i, part in enumerate(parts) if GLOB_CHARS & set(part)), len(parts))
    matches: set[Path] = set()
    skipped: set[Path] = set()

    def walk(folder: Path, rest: Sequence[str]) -> None:
        part, below = rest[0], rest[1:]
        if part == "**" and not below:  # everything below: as "**/*"
            below = ["*"]
        if part == "**":
            walk_entries(folder, "*", ["**", *below], recurse_only=True)
            walk(folder, below)
            return
        walk_entries(folder, part, below)

    def walk_entries(
        folder: Path, part: str, below: Sequence[str], recurse_only: bool = False
    ) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:  # not a folder, gone, unreadable: nothing matches there (as in glob)
            return
        for entry in entries:
            hidden = entry.name.startswith(".") and not part.startswith(".")
            if hidden or not fnmatch.fnmatchcase(entry.name, part):
                continue
            path = folder / entry.name
            if entry.is_symlink():
                # Said where it could have led to a match: as the last component, or to a folder.
                if not (recurse_only or below) or _links_to_folder(entry):
                    skipped.add(path)
            elif not (recurse_only or below):
                matches.add(path)
            elif entry.is_dir(follow_symlinks=False):
                walk(path, below)  # (under "**", below starts with it again)

    if fixed == len(parts):  # no wildcard: the path itself
        return ([Path(*parts)] if os.path.lexists(Path(*parts)) else []), []
    root = Path(*parts[:fixed]) if fixed else Path(".")
    if fixed and parts[fixed:] == ("**",) and root.is_dir():
        matches.add(root)  # (as glob: "folder/**" is the folder too)
    walk(root, parts[fixed:])
    return sorted(matches), sorted(skipped)


def _links_to_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # (follows the link: a stat, nothing read)
    except OSError:
        return False


def describe_write_error(path: str | Path, e: OSError, what: str = "") -> str:
    """A one-line message for a failed write of ``path`` (a full disk said as such)."""
    label = f"{what} {path}" if what else str(path)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"cannot write {label}: the disk is full ({e.strerror}); free space and resume"
    return f"cannot write {label}: {e.strerror or e}"


def is_run_folder_write_error(e: BaseException) -> bool:
    """An error a user acts on: a full disk (or quota), or a link where the run writes.

    Or a file or folder of the run it may not read or write (permissions, a read-only disk).
    """
    return isinstance(e, UnsafePathError) or (
        isinstance(e, OSError)
        and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS)
    )


def _check_target(path: Path) -> None:
    """Refuse to write ``path`` when its folder is a link or ``path`` is a folder; make its folder.

    The folders above are the caller's to check (:func:`run_subdir`).
    """
    try:
        folder_is_link = stat.S_ISLNK(os.lstat(path.parent).st_mode)
    except FileNotFoundError:
        folder_is_link = False
    if folder_is_link:
        raise UnsafePathError(
            errno.ELOOP, f"{path.parent} is a symbolic link; {_LINKED_FOLDER} ({path.name})"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        is_folder = stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return
    if is_folder:
        raise UnsafePathError(
            errno.EISDIR, f"{path} is a folder where the run writes a file; refused"
        )


@contextlib.contextmanager
def _replacing(path: Path, what: str | None, suffix: str = "") -> Iterator[tuple[int, str]]:
    """A fresh temporary file beside ``path`` (descriptor, name), renamed over it after the block.

    Created with ``O_EXCL | O_NOFOLLOW`` under a random hidden name; removed on any error. An
    :class:`OSError` (a full disk) is raised again naming the file when ``what`` is given.
    """
    try:
        _check_target(path)
        fd, tmp = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX + suffix
        )
        try:
            os.fchmod(fd, FILE_MODE)
            yield fd, tmp
            os.replace(tmp, path)
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        if what is None or isinstance(e, UnsafePathError):
            raise
        raise OSError(e.errno, describe_write_error(path, e, what)) from e


def write_atomic(
    path: str | Path,
    write: Callable[[IO[bytes]], Any] | bytes | str,
    *,
    what: str | None = None,
) -> None:
    """Write ``path`` via a temporary file in the same folder: write, fsync, rename, fsync dir.

    A crash (even ``kill -9``) leaves either the old file or the complete new one under
    ``path``, plus at worst a stray hidden ``.<name>.*.tmp`` file. A link under ``path`` is
    replaced by the file, never followed. ``write`` is the content (bytes or text) or a function
    writing it to the open binary file; ``what`` (``"evaluation summary"``) names the file in
    the message of an :class:`OSError` such as a full disk.

    Raises:
        UnsafePathError: ``path``'s folder is a symbolic link, or ``path`` is a folder.
    """
    path = Path(path)
    data = write.encode("utf-8") if isinstance(write, str) else write
    with _replacing(path, what) as (fd, _), os.fdopen(fd, "wb") as f:
        if isinstance(data, bytes):
            f.write(data)
        else:
            data(f)
        f.flush()
        os.fsync(f.fileno())


def write_atomic_by_name(
    path: str | Path, write: Callable[[Path], Any], *, what: str | None = None
) -> None:
    """:func:`write_atomic` for a writer that opens its file by name (ffmpeg, an exporter).

    ``write(tmp)`` fills a temporary file beside ``path`` that keeps ``path``'s suffix (a writer
    may pick its format by it); it must still be a regular file afterwards.
    """
    path = Path(path)
    with _replacing(path, what, path.suffix) as (fd, tmp):
        os.close(fd)
        write(Path(tmp))
        fd = open_nofollow(tmp, os.O_RDONLY)  # still a regular file, not a link
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def check_file_target(path: str | Path) -> None:
    """Raise an :class:`UnsafePathError` unless ``path`` is missing or a regular file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise _link_error(path)
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise UnsafePathError(errno.EINVAL, f"{path} is {kind} where the run writes a file")


def _kind_error(path: str | Path, kind: int) -> UnsafePathError | None:
    """What is wrong with a file of mode ``kind`` where the run keeps a regular file (or None)."""
    if stat.S_ISLNK(kind):
        return _link_error(path)
    if stat.S_ISDIR(kind):
        return UnsafePathError(errno.EISDIR, f"{path} is a folder where the run keeps a file")
    if not stat.S_ISREG(kind):
        return UnsafePathError(errno.EINVAL, f"{path} is not a regular file")
    return None


def open_nofollow(path: str | Path, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open`` of a regular file, never blocking on a FIFO; a descriptor.

    Raises:
        UnsafePathError: ``path`` is a link or not a regular file.
    """
    # Judged before opening too: opening a device or a FIFO can have effects of its own (the
    # check after opening stays, for a name swapped in between).
    with contextlib.suppress(FileNotFoundError):  # (created by the open, with O_CREAT)
        error = _kind_error(path, os.lstat(path).st_mode)
        if error is not None:
            raise error
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        kind = {errno.ELOOP: stat.S_IFLNK, errno.EISDIR: stat.S_IFDIR}.get(e.errno or 0)
        error = None if kind is None else _kind_error(path, kind)
        if error is not None:  # (a name swapped for a link or a folder since the lstat)
            raise error from e
        if e.errno == errno.ENXIO:  # (a FIFO without a reader, opened to write)
            raise UnsafePathError(errno.ENXIO, f"{path} is not a regular file") from e
        raise
    error = _kind_error(path, os.fstat(fd).st_mode)
    if error is not None:
        os.close(fd)
        raise error
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


def load_yaml_data(raw: bytes | str) -> Any:
    """YAML from a run folder (untrusted) as plain data: aliases refused, nesting bounded.

    ``yaml.safe_load`` expands merge keys (``<<: [*a, *a, ...]``) by copying: a file of a few
    hundred kilobytes costs hours. Hydra never writes an alias, so one is refused at once.

    Raises:
        yaml.YAMLError: Not YAML, an alias, or nested too deeply (as a ``yaml.YAMLError``).
    """
    import yaml

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(
                    f"an alias (*name) at {mark.line + 1}:{mark.column + 1}; "
                    "a run folder's files hold none, so it is refused"
                )
            return super().compose_node(parent, index)

    try:
        return yaml.load(raw, Loader=NoAliases)  # noqa: S506  (a SafeLoader)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply to be a run folder's file") from None


class NoFollowFileHandler(logging.FileHandler):
    """A :class:`logging.FileHandler` (append) that refuses a link under its file's name."""

    def _open(self) -> Any:  # (logging's hook: called when the stream is first needed)
        return open_append(self.baseFilename)

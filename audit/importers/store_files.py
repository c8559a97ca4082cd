"""Reading a source folder (an MLflow file store, a W&B or trainer run folder) safely:
regular files only, no link followed anywhere below the root, every read bounded.

A file store or run folder is data other people wrote. A param file that is a link to ``/etc/hostname``
would import a file of this machine as a value, a FIFO would block the import forever, a
link to ``/dev/zero`` would read until memory runs out. So every folder below the root is
opened relative to its parent with ``O_NOFOLLOW`` (a link anywhere on the way is refused,
however the path was built), a file must be a regular file before and after it is opened
(non-blocking, so a FIFO never blocks), and no more than a stated number of bytes is read.
Every refusal is an ``InputError`` naming the path. The root itself may be a link: the
user named it.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from audit.errors import InputError, utf8_problem

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Entry:
    """A folder or regular file in a folder (links and special files are refused)."""

    name: str
    kind: str  # dir | file
    size: int
    mtime_ns: int


class StoreFolder:
    """The folder tree below ``root``, read without following links."""

    def __init__(self, root: Path):
        self.root = root

    def entries(self, folder: Path) -> list[Entry]:
        """What ``folder`` (below the root) holds, sorted by name. A link or a special file
        in it is an error: the store is walked only where MLflow writes, and MLflow writes
        neither. Names must be UTF-8."""
        fd = self._open_dir(folder)
        try:
            with os.scandir(fd) as scan:
                found = [_entry(folder, item) for item in scan]
        except OSError as exc:
            raise InputError(f"{folder}: cannot list ({exc.strerror})") from None
        finally:
            os.close(fd)
        return sorted(found, key=lambda e: e.name)

    def kind(self, path: Path) -> str | None:
        """``dir`` or ``file``, None when nothing is there; a link or special file is an
        error."""
        parent = self._open_dir(path.parent)
        try:
            st = os.stat(path.name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise InputError(f"{path}: cannot read ({exc.strerror})") from None
        finally:
            os.close(parent)
        return _kind(path, st.st_mode)

    def open(self, path: Path) -> int:
        """A descriptor of the regular file ``path`` (below the root), opened without
        following a link anywhere on the way and without blocking."""
        parent = self._open_dir(path.parent)
        try:
            # judged before opening too: opening some devices has effects of its own
            _require_regular(path, parent)
            try:
                fd = os.open(path.name, _FILE_FLAGS, dir_fd=parent)
            except OSError as exc:
                raise InputError(f"{path}: {_refusal(parent, path.name, exc)}") from None
        finally:
            os.close(parent)
        try:
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            raise InputError(f"{path}: cannot read ({exc.strerror})") from None
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise InputError(_not_regular(path, st.st_mode))
        os.set_blocking(fd, True)
        return fd

    def read(self, path: Path, limit: int, what: str) -> bytes:
        """The bytes of the regular file ``path``; more than ``limit`` bytes is an error."""
        fd = self.open(path)
        try:
            st = os.fstat(fd)
            if st.st_size > limit:
                raise InputError(_too_big(path, st.st_size, limit, what))
            chunks, total = [], 0
            while True:
                chunk = os.read(fd, min(1 << 20, limit + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
                if total > limit:  # the file grew while it was read
                    raise InputError(_too_big(path, total, limit, what))
            return b"".join(chunks)
        except OSError as exc:
            raise InputError(f"{path}: cannot read ({exc.strerror})") from None
        finally:
            os.close(fd)

    def read_text(self, path: Path, limit: int, what: str) -> str:
        data = self.read(path, limit, what)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(utf8_problem(path, data, exc)) from None

    def _open_dir(self, folder: Path) -> int:
        """A descriptor of ``folder``, reached from the root one name at a time."""
        try:
            parts = folder.relative_to(self.root).parts
        except ValueError:
            raise InputError(f"{folder}: outside the store {self.root}") from None
        if ".." in parts:
            raise InputError(f"{folder}: leads out of the store {self.root}")
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise InputError(f"{self.root}: cannot open ({exc.strerror})") from None
        where = self.root
        for part in parts:
            where = where / part
            try:
                inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                problem = _refusal(fd, part, exc)
                os.close(fd)
                raise InputError(f"{where}: {problem}") from None
            os.close(fd)
            fd = inner
        return fd


def read_named_file(path: Path, limit: int, what: str) -> bytes:
    """A file the user named (a link to one is fine: they chose it), read the same careful
    way: a regular file, opened without blocking, at most ``limit`` bytes."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        raise InputError(f"{path}: is a {_describe(mode)}, not a regular file; pass {what}")
    return StoreFolder(path.parent).read(path, limit, what)


def read_found_file(path: Path, limit: int, what: str, root: Path | None = None) -> bytes:
    """A file found in a folder someone else wrote (a W&B or trainer run folder), read the
    same careful way: not a link, a regular file opened without blocking, at most
    ``limit`` bytes. ``root`` (default: the file's folder) is the run folder: no folder
    between it and the file may be a link either (a ``files/`` or ``checkpoint-N/``
    pointing elsewhere)."""
    return StoreFolder(root or path.parent).read(path, limit, what)


def read_found_text(path: Path, limit: int, what: str, root: Path | None = None) -> str:
    return StoreFolder(root or path.parent).read_text(path, limit, what)


def open_found_file(path: Path, root: Path | None = None) -> BinaryIO:
    """A log found in a run folder, opened for streaming the same careful way as
    ``read_found_file`` (no link on the way from ``root``, a regular file)."""
    return os.fdopen(StoreFolder(root or path.parent).open(path), "rb")


def require_found_file(path: Path) -> None:
    """Before a log found in such a folder is streamed: a regular file, not a link (a FIFO
    would block the import, a link would read what is outside the folder)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        raise InputError(_not_regular(path, mode))


def _entry(folder: Path, item: os.DirEntry) -> Entry:
    try:
        item.name.encode("utf-8")
    except UnicodeEncodeError:
        raw = os.fsencode(item.name)
        raise InputError(
            f"{folder}/{raw.decode('utf-8', 'backslashreplace')}: the file name is not valid "
            "UTF-8; MLflow writes UTF-8 names (rename it)"
        ) from None
    st = item.stat(follow_symlinks=False)
    return Entry(item.name, _kind(folder / item.name, st.st_mode), st.st_size, st.st_mtime_ns)


def _kind(path: Path, mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    raise InputError(_not_regular(path, mode))


def _describe(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISDIR, "folder"),
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"


_LINK_REFUSED = (
    "is a symbolic link; links in a file store or run folder are not followed, so nothing "
    "outside it is read"
)


def _require_regular(path: Path, parent: int) -> None:
    try:
        mode = os.stat(path.name, dir_fd=parent, follow_symlinks=False).st_mode
    except OSError as exc:
        raise InputError(f"{path}: {_refusal(parent, path.name, exc)}") from None
    if not stat.S_ISREG(mode):
        raise InputError(_not_regular(path, mode))


def _not_regular(path: Path, mode: int) -> str:
    if stat.S_ISLNK(mode):
        return f"{path}: {_LINK_REFUSED}"
    return (
        f"{path}: is a {_describe(mode)}, not a regular file; a file store or run folder "
        "holds only folders and regular files"
    )


def _refusal(parent: int, name: str, exc: OSError) -> str:
    """Why ``name`` in the folder ``parent`` could not be opened, in the user's terms."""
    if exc.errno == errno.ENOENT:
        return "no such file or folder (was the store changed during the import?)"
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        try:
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        except OSError:
            mode = stat.S_IFLNK
        if stat.S_ISLNK(mode):
            return _LINK_REFUSED
        return f"is a {_describe(mode)} where a folder was expected"
    return f"cannot read ({exc.strerror})"


def _too_big(path: Path, size: int, limit: int, what: str) -> str:
    return (
        f"{path}: {size:,} bytes, more than the {limit:,} bytes {what} can hold; "
        "is this really such a file?"
    )

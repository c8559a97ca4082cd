"""Every file the tool writes goes through here: whole or not at all.

A report, scan output, prune plan or README is written to a temporary file in the same
folder, flushed to disk, and renamed over the target; a Parquet export is built in a
temporary folder and renamed into place. A full disk, a file-size limit (``ulimit -f``),
Ctrl-C or ``kill -9`` therefore leaves the previous file (or no file) intact, never a
truncated one; the temporary file is removed on any failure the process survives.

The prune manifest is the one file that grows instead: :class:`AppendOnlyLog` appends one
JSON record per line, each with a single ``write`` followed by ``fsync``, so a record is
on disk before the action it describes goes on. A kill can leave at most the last line
torn; readers skip a torn last line, and the next append first ends it with a newline.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from audit.errors import InputError


def write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically."""
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically; a symlink is followed to its target."""
    target = _target(path)
    with _temporary_file(target) as (handle, temporary):
        try:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        except OSError as exc:
            raise _write_error(path, exc) from None
        handle.close()
        _set_mode(temporary, target)
        os.replace(temporary, target)
    _sync_folder(target.parent)


def build_folder(path: Path, build: Callable[[Path], None]) -> None:
    """Create folder ``path`` by letting ``build`` fill a temporary folder next to it.

    ``path`` must be missing or an empty folder; on any failure it stays as it was.
    """
    path = Path(os.path.abspath(path))
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise InputError(f"{path} is not an empty folder; export into a new or empty folder")
    if not path.parent.is_dir():
        raise InputError(f"cannot write {path}: folder {path.parent} does not exist")
    temporary = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        build(temporary)
        os.chmod(temporary, 0o777 & ~_umask())
        os.replace(temporary, path)  # rename(2) replaces an empty folder
    except OSError as exc:
        raise _write_error(path, exc) from None
    finally:
        if temporary.exists():
            _remove_tree(temporary)
    _sync_folder(path.parent)


class AppendOnlyLog:
    """A JSON-lines file that only grows; each record reaches the disk before ``append`` returns."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self._handle = open(path, "ab")  # noqa: SIM115 - closed in close()
            size = self._handle.seek(0, os.SEEK_END)
            if size and _last_byte(path) != b"\n":
                self._write(b"\n")  # a record torn by a kill ends here; the next starts clean
        except OSError as exc:
            raise _write_error(path, exc, appending=True) from None

    def append(self, record: dict) -> None:
        self._write((json.dumps(record, ensure_ascii=True) + "\n").encode("ascii"))

    def _write(self, data: bytes) -> None:
        try:
            self._handle.write(data)
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as exc:
            raise _write_error(self.path, exc, appending=True) from None

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> AppendOnlyLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_log(path: Path) -> list[dict]:
    """The records of an :class:`AppendOnlyLog`; a torn last line is skipped, a damaged
    line elsewhere is an error (the log cannot be trusted)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    lines = data.split(b"\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError:
            torn = number == len(lines) or all(not rest.strip() for rest in lines[number:])
            if torn:
                continue
            raise InputError(
                f"{path}:{number}: not a manifest record; the manifest was edited or damaged "
                "(move it aside to start a new one)"
            ) from None
        records.append(record)
    return records


def _target(path: Path) -> Path:
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    if path.is_dir():
        raise InputError(f"cannot write {path}: it is a folder")
    if not path.parent.is_dir():
        raise InputError(f"cannot write {path}: folder {path.parent} does not exist")
    return path


@contextlib.contextmanager
def _temporary_file(target: Path) -> Iterator[tuple]:
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise _write_error(target, exc) from None
    temporary = Path(name)
    handle = os.fdopen(fd, "wb")
    try:
        yield handle, temporary
    finally:
        handle.close()
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def _set_mode(temporary: Path, target: Path) -> None:
    """The replaced file keeps its permissions; a new one gets the usual 0666 & ~umask."""
    try:
        mode = os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    os.chmod(temporary, mode)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (best effort: some file systems refuse)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove_tree(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1)


def _write_error(path: Path, exc: OSError, appending: bool = False) -> InputError:
    why = exc.strerror or str(exc)
    if appending:
        return InputError(f"cannot append to {path}: {why}; the records before are intact")
    return InputError(f"cannot write {path}: {why}; the previous file, if any, is unchanged")

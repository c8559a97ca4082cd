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
import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from audit.errors import InputError


def write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically."""
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically; a symlink is followed to its target."""
    _replace(path, lambda fd: _write_all(fd, data))


def write_text_chunks(path: Path, chunks: Iterable[str]) -> None:
    """Replace ``path`` with the text of ``chunks`` (UTF-8) atomically, a megabyte at a
    time: the JSON of 100,000s of findings is never held whole (nor its encoded copy)."""

    def write(fd: int) -> None:
        pending: list[str] = []
        size = 0
        for chunk in chunks:
            pending.append(chunk)
            size += len(chunk)
            if size >= 1 << 20:
                _write_all(fd, "".join(pending).encode("utf-8"))
                pending, size = [], 0
        _write_all(fd, "".join(pending).encode("utf-8"))

    _replace(path, write)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # unbuffered: nothing is left to fail at close
        view = view[os.write(fd, view) :]


def _replace(path: Path, write: Callable[[int], None]) -> None:
    target = _target(path)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise _write_error(path, exc) from None
    temporary = Path(name)
    try:
        try:
            write(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        _set_mode(temporary, target)
        os.replace(temporary, target)
    except OSError as exc:
        raise _write_error(path, exc) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
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


TORN_MARK = {"status": "torn", "note": "the line above was cut short by a kill; it is ignored"}


class AppendOnlyLog:
    """A JSON-lines file that only grows; each record reaches the disk before ``append`` returns."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self._handle = open(path, "ab")  # noqa: SIM115 - closed in close()
            size = self._handle.seek(0, os.SEEK_END)
            if size and _last_byte(path) != b"\n":
                # a record torn by a kill ends here, marked as such; the next starts clean
                self._write(b"\n")
                self.append(TORN_MARK)
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
    """The records of an :class:`AppendOnlyLog`. A torn line (the last one, or one the
    next append marked as torn) is skipped; a damaged line elsewhere is an error: the log
    cannot be trusted."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    lines = [line for line in data.split(b"\n") if line.strip()]
    records = []
    for number, line in enumerate(lines):
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except (ValueError, RecursionError):
            following = lines[number + 1] if number + 1 < len(lines) else None
            if following is None or _is_torn_mark(following):
                continue
            raise InputError(
                f"{path}:{_line_number(data, line)}: not a manifest record; the manifest was "
                "edited or damaged (move it aside to start a new one)"
            ) from None
        if record != TORN_MARK:
            records.append(record)
    return records


def _is_torn_mark(line: bytes) -> bool:
    try:
        return json.loads(line) == TORN_MARK
    except (ValueError, RecursionError):
        return False


def _line_number(data: bytes, line: bytes) -> int:
    return data[: data.index(line)].count(b"\n") + 1


def _target(path: Path) -> Path:
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    if path.is_dir():
        raise InputError(f"cannot write {path}: it is a folder")
    if not path.parent.is_dir():
        raise InputError(f"cannot write {path}: folder {path.parent} does not exist")
    return path


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


@contextlib.contextmanager
def warehouse_lock(db: Path, name: str, busy: str):
    """An exclusive lock on ``<warehouse>.<name>-lock`` while the block runs, holding this
    process's id; when another process holds it, InputError ``busy`` (a format string with
    ``{holder}``, that process's id, and ``{lock}``, the lock file)."""
    lock_path = Path(f"{db}.{name}-lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise InputError(f"{lock_path}: cannot open the {name} lock ({exc.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise InputError(busy.format(holder=holder, lock=lock_path)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock

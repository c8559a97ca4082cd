"""Walking folder trees the same way everywhere: never through a symlink, never recursive.

``os.walk`` on Python 3.11 recurses once per level, so a tree 1,000 folders deep raises
``RecursionError`` (a hostile or broken checkpoint tree, a run folder nested by a loop in
a script). This walker keeps its own stack, visits folders in name order (results do not
depend on the file system's order), and does not descend into symlinked folders.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator


def _reraise(exc: OSError) -> None:
    raise exc


def walk(
    top: str | os.PathLike, onerror: Callable[[OSError], None] | None = _reraise
) -> Iterator[tuple[str, list[str], list[str]]]:
    """``(folder, subfolders, files)`` top-down, as ``os.walk(top, followlinks=False)``
    gives, in name order. Symlinks are listed among ``files`` (never followed). A caller
    may prune ``subfolders`` in place. ``onerror`` receives an unreadable folder's error
    (default: raise it); None skips such folders silently."""
    stack = [os.fspath(top)]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as entries:
                listed = sorted(entries, key=lambda e: e.name)
        except OSError as exc:
            if onerror is not None:
                onerror(exc)
            continue
        folders, files = [], []
        for entry in listed:
            try:
                is_folder = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_folder = False
            (folders if is_folder else files).append(entry.name)
        yield folder, folders, files
        # reversed: the stack pops the first name first
        stack.extend(os.path.join(folder, name) for name in reversed(folders))

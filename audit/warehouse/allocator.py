"""Handing the memory DuckDB's queries freed back to the operating system.

DuckDB's Linux wheels allocate through their own jemalloc. A query's hash tables and
intermediate strings are freed to jemalloc when it ends, but jemalloc keeps those pages
(its "dirty" pages decay only while the same arena keeps allocating, and no background
thread runs). A scan's rules spend most of their time in Python between queries, so the
pages stay resident: at 100,000 runs DUP001's signature query left 360 MB in the process
that DuckDB itself counted as 12 MB in ``duckdb_memory()``. Purging every arena, which
DuckDB does itself after bulk deallocations, returns them.

DuckDB has no SQL statement for it, so this calls the ``mallctl`` its extension module
exports (``duckdb_je_mallctl``). Builds without jemalloc (macOS, Windows, some Linux
architectures) do not export it; there, as after any failure, nothing happens: the purge
only lowers the resident size and never changes a result.
"""

from __future__ import annotations

import ctypes
import sys
from functools import cache

_PURGE_ALL_ARENAS = b"arena.4096.purge"  # 4096 is jemalloc's MALLCTL_ARENAS_ALL


@cache
def _mallctl():
    import duckdb  # noqa: F401  (loads the extension module that carries jemalloc)

    module = sys.modules.get("_duckdb") or sys.modules.get("duckdb.duckdb")
    path = getattr(module, "__file__", None)
    if not path:
        return None
    try:
        function = ctypes.CDLL(path).duckdb_je_mallctl
    except (OSError, AttributeError):
        return None
    function.argtypes = [
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
    ]
    function.restype = ctypes.c_int
    return function


def return_freed_memory() -> bool:
    """Give the pages DuckDB freed back to the OS; whether this build could (jemalloc).

    Call it between queries, not during one: it takes every arena's lock in turn.
    """
    mallctl = _mallctl()
    if mallctl is None:
        return False
    return mallctl(_PURGE_ALL_ARENAS, None, None, None, 0) == 0

"""Handing the memory DuckDB's queries freed back to the operating system.

DuckDB's Linux wheels allocate through their own jemalloc. A query's hash tables and
intermediate strings are freed to jemalloc when it ends, but jemalloc keeps those pages
(its "dirty" pages decay only while the same arena keeps allocating, and no background
thread runs). A scan's rules spend most of their time in Python between queries, so the
pages stay resident: at 100,000 runs DUP001's signature query left 346 MiB in the process
that DuckDB itself counted as 12.5 MiB in ``duckdb_memory()``. Purging every arena, which
DuckDB does itself after bulk deallocations, returns them.

DuckDB has no SQL statement for it, so this calls the ``mallctl`` its extension module
exports (``duckdb_je_mallctl``). Builds without jemalloc (macOS, Windows, some Linux
architectures) do not export it; there, as after any failure, nothing happens: the purge
only lowers the resident size and never changes a result.

DuckDB also keeps the table blocks a query read in its buffer pool until the pool reaches
``memory_limit`` (80 % of the machine's memory by default): 100-200 MB at 100,000 runs by
the end of a scan, each block read by one rule. Lowering the limit for a moment evicts the
unpinned ones, as DuckDB does whenever the limit is lowered; a later query reads its
blocks again from the file (from the OS page cache, in a scan). Not while blocks that live
only in memory exist (an in-memory database, temporary tables): those would be spilled.

Both steps cost about 2 ms (three queries and a purge of every arena). Between the rules of
a week with no data, as in a report's earlier trend weeks, that was 0.3 s of 7 weeks'
2.5 s: ``return_freed_memory_if_grown`` does them only once the process has grown by
``WORTH_RETURNING`` since they last ran, since pages freed but kept and blocks cached since
then are all part of that growth.
"""

from __future__ import annotations

import ctypes
import os
import sys
from functools import cache

import duckdb

from audit.warehouse.alongside import busy

_PURGE_ALL_ARENAS = b"arena.4096.purge"  # 4096 is jemalloc's MALLCTL_ARENAS_ALL
_EVICTION_LIMIT = "32MB"  # the pool's size for a moment: blocks pinned by nobody leave it
WORTH_RETURNING = 32 * 2**20  # bytes of growth since the last return before another one
_resident_after_return: list[int | None] = [None]  # the process's, after the last return


@cache
def _mallctl():
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


def return_freed_memory(con: duckdb.DuckDBPyConnection | None = None) -> bool:
    """Give the pages DuckDB freed back to the OS, and with ``con`` evict the table blocks
    its buffer pool cached; whether the pages could be given back (jemalloc).

    Call it between queries, not during one: it takes every arena's lock in turn, and the
    pool's limit lowered for a moment would fail a query. So nothing happens while a query
    may run on a second connection (``alongside.busy()``); the next call returns the pages.
    """
    if busy():
        return False
    if con is not None:
        _evict_cached_blocks(con)
    mallctl = _mallctl()
    if mallctl is None:
        return False
    return mallctl(_PURGE_ALL_ARENAS, None, None, None, 0) == 0


def return_freed_memory_if_grown(con: duckdb.DuckDBPyConnection) -> bool:
    """``return_freed_memory(con)`` when the process's resident size grew by
    ``WORTH_RETURNING`` since the last time this returned memory (always where the size
    cannot be read); whether it ran."""
    if busy():
        return False
    before = _resident_bytes()
    last = _resident_after_return[0]
    if before is not None and last is not None and before - last < WORTH_RETURNING:
        return False
    return_freed_memory(con)
    _resident_after_return[0] = _resident_bytes()
    return True


def _resident_bytes() -> int | None:
    """The process's resident size (Linux), else None."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _evict_cached_blocks(con: duckdb.DuckDBPyConnection) -> None:
    # Only blocks of a database file leave without being written anywhere: the blocks of an
    # in-memory database or of temporary tables would be spilled to temporary files.
    (path,) = con.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchone()
    (in_memory,) = con.execute(
        "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory() "
        "WHERE tag = 'IN_MEMORY_TABLE'"
    ).fetchone()
    if path is None or in_memory:
        return
    # The warehouse runs with DuckDB's default limit, which RESET restores exactly (setting
    # back the printed "18.8 GiB" would lower it by up to 0.1 GiB each time).
    try:
        con.execute(f"SET memory_limit = '{_EVICTION_LIMIT}'")
    except duckdb.Error:
        pass  # more is pinned than the moment's limit: what could be evicted was
    finally:
        con.execute("RESET memory_limit")

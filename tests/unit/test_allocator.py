"""Pages a DuckDB query freed go back to the OS (``audit.warehouse.allocator``)."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import duckdb
import pytest

from audit.warehouse import allocator
from audit.warehouse.allocator import return_freed_memory

# In a fresh process: a query whose hash table of 4 M distinct strings DuckDB frees when it
# ends, the resident size after it, then after the purge (MiB).
_PROBE = """
import duckdb
from audit.warehouse.allocator import return_freed_memory

def rss():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20

con = duckdb.connect()
con.execute("SET enable_progress_bar = false")  # no "45%" on stdout on a slow machine
before = rss()
con.execute("SELECT count(DISTINCT 'key-' || (i * 7919 % 100000007)) FROM range(4000000) t(i)").fetchall()
after_query = rss()
purged = return_freed_memory()
print(before, after_query, rss(), purged)
"""


def _probe(code: str) -> str:
    """What ``code`` prints in a fresh process (a resident size starts from nothing)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    ).stdout


def test_a_duckdb_without_jemalloc_purges_nothing_and_raises_nothing(monkeypatch):
    """Builds without jemalloc export no ``duckdb_je_mallctl``: stand in another real
    extension module for DuckDB's and the purge is skipped."""
    import _ctypes

    allocator._mallctl.cache_clear()
    monkeypatch.setitem(sys.modules, "_duckdb", types.SimpleNamespace(__file__=_ctypes.__file__))
    try:
        assert return_freed_memory() is False
    finally:
        allocator._mallctl.cache_clear()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_the_pages_of_a_finished_query_leave_the_process():
    out = _probe(_PROBE).split()
    before, after_query, after_purge = map(float, out[:3])
    if out[3] != "True":
        pytest.skip("this DuckDB build has no jemalloc to purge")
    held = after_query - before
    assert held > 100, f"the query left only {held:.0f} MiB: the probe measures nothing"
    assert after_purge - before < held / 2, (before, after_query, after_purge)


def _cached_table_mib(con) -> float:
    (mib,) = con.execute(
        "SELECT coalesce(sum(memory_usage_bytes), 0) / 2**20 FROM duckdb_memory() "
        "WHERE tag = 'BASE_TABLE'"
    ).fetchone()
    return mib


def test_the_table_blocks_a_query_read_leave_the_pool_and_the_limit_stays(tmp_path):
    path = tmp_path / "blocks.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE t AS SELECT i, md5(i::VARCHAR) AS text FROM range(6000000) r(i)")
    con = duckdb.connect(str(path), read_only=True)
    try:
        limit = con.execute("SELECT current_setting('memory_limit')").fetchone()
        con.execute("SELECT count(DISTINCT text), sum(i) FROM t").fetchall()
        cached = _cached_table_mib(con)
        assert cached > 64, f"the query cached {cached:.1f} MiB: the test measures nothing"
        return_freed_memory(con)
        assert _cached_table_mib(con) < cached / 2
        assert con.execute("SELECT current_setting('memory_limit')").fetchone() == limit
        assert con.execute("SELECT count(*) FROM t").fetchone() == (6_000_000,)
    finally:
        con.close()


@pytest.mark.parametrize("where", ["an in-memory database", "a temporary table"])
def test_blocks_that_live_only_in_memory_are_not_spilled(tmp_path, where):
    spill = tmp_path / "spill"
    if where == "an in-memory database":
        con, create = duckdb.connect(), "CREATE TABLE"
    else:
        con, create = duckdb.connect(str(tmp_path / "file.duckdb")), "CREATE TEMP TABLE"
    try:
        con.execute(f"SET temp_directory = '{spill}'")
        con.execute(f"{create} t AS SELECT i, md5(i::VARCHAR) AS text FROM range(6000000) r(i)")
        return_freed_memory(con)
        assert not spill.exists() or not any(spill.iterdir()), sorted(spill.iterdir())
        assert con.execute("SELECT count(*) FROM t").fetchone() == (6_000_000,)
    finally:
        con.close()


# In a fresh process: whether each call returned memory, with the process grown by 0, then
# by 1 MiB, then by 96 MiB of touched pages since the return before.
_GROWTH_PROBE = """
import duckdb
from audit.warehouse.allocator import return_freed_memory_if_grown

con = duckdb.connect()
ran = [return_freed_memory_if_grown(con), return_freed_memory_if_grown(con)]
small = b"x" * 2**20
ran.append(return_freed_memory_if_grown(con))
large = b"x" * (96 * 2**20)
ran.append(return_freed_memory_if_grown(con))
ran.append(return_freed_memory_if_grown(con))
print(ran)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_memory_is_returned_again_only_after_the_process_grew_by_what_is_worth_it():
    out = _probe(_GROWTH_PROBE).strip()
    # the first always (nothing measured yet); after 96 MiB once more, then not again
    assert out == "[True, False, False, True, False]"


def test_memory_is_returned_every_time_where_the_resident_size_cannot_be_read(monkeypatch):
    monkeypatch.setattr(allocator, "_resident_bytes", lambda: None)
    con = duckdb.connect()
    assert [allocator.return_freed_memory_if_grown(con) for _ in range(3)] == [True] * 3

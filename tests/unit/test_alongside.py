"""Work on a second connection alongside the caller (``audit.warehouse.alongside``): the
same results as in line, failures kept to their own work, Ctrl-C ending its query, and no
memory returned while it runs."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import datetime

import duckdb
import pytest

from audit import interrupts
from audit.config import load_config
from audit.rule_api import Rule, Severity
from audit.rule_registry import all_rules, get_rule, select_rules
from audit.scans import run_rules
from audit.warehouse import alongside as alongside_module
from audit.warehouse.allocator import return_freed_memory, return_freed_memory_if_grown
from audit.warehouse.alongside import alongside, busy
from audit.warehouse.store import open_warehouse
from audit.windows import ALL_HISTORY, Window

IdleHost = get_rule("IDL003")  # the registry's class: the one a scan runs

# a query that runs for minutes unless interrupted
ENDLESS = "SELECT sum(hash(i)) FROM range(10000000000000) t(i)"


def _endless(started: threading.Event):
    """Work that sets ``started`` and runs ``ENDLESS``."""

    def work(connection):
        started.set()
        return connection.execute(ENDLESS).fetchall()

    return work


def _scan(db, config, window: Window) -> list[tuple]:
    with open_warehouse(db, read_only=True) as wh:
        results = run_rules(wh.con, config, select_rules(), window)
    return [
        (r.rule, r.status, r.reason, [f.as_json() for f in r.findings], r.notes) for r in results
    ]


# the whole history, and a day that cuts gpu-h04's 12 h idle stretch to 10 h
WINDOWS = [ALL_HISTORY, Window(datetime(2026, 11, 18), datetime(2026, 11, 19))]


@pytest.mark.parametrize("window", WINDOWS, ids=["all history", "one day"])
def test_a_scan_gives_what_it_gives_with_every_rule_in_line(fresh_demo_db, monkeypatch, window):
    config = load_config(fresh_demo_db["config"])
    alongside_results = _scan(fresh_demo_db["db"], config, window)
    monkeypatch.setattr(IdleHost, "alone", False)
    in_line = _scan(fresh_demo_db["db"], config, window)
    assert alongside_results == in_line
    idle_hosts = next(r for r in in_line if r[0] == "IDL003")
    assert idle_hosts[1] == "ok" and idle_hosts[3], "IDL003 found nothing: nothing compared"
    assert not busy()


def test_every_rule_that_runs_alone_reads_no_shared_computation():
    alone = [rule for rule in all_rules().values() if rule.alone]
    assert alone, "no rule runs alongside: the test checks nothing"
    for rule in alone:
        assert rule.reads_shared == frozenset(), rule.code


class _Broken(Rule):
    """A rule whose check fails, alongside."""

    code = "XXX901"
    name = "broken"
    severity = Severity.LOW
    family_label = "test"
    alone = True

    def check(self, ctx):
        ctx.con.execute("SELECT * FROM no_such_table").fetchall()
        yield from ()


def test_a_rule_failing_alongside_is_an_error_result_and_the_others_run(fresh_demo_db):
    config = load_config(fresh_demo_db["config"])
    rules = [*select_rules("CKP001"), _Broken, IdleHost]
    with open_warehouse(fresh_demo_db["db"], read_only=True) as wh:
        results = run_rules(wh.con, config, rules, ALL_HISTORY)
    assert [r.rule for r in results] == ["CKP001", "XXX901", "IDL003"]
    assert results[1].status == "error"
    assert "no_such_table" in results[1].reason
    assert results[0].status == results[2].status == "ok"
    assert results[2].findings


def test_ctrl_c_in_the_caller_ends_the_query_alongside_at_once():
    con = duckdb.connect()
    started = threading.Event()
    endless = _endless(started)

    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt), alongside(con) as second:
        future = second.submit(endless)
        assert started.wait(10)
        time.sleep(0.2)  # inside the query
        raise KeyboardInterrupt
    assert time.monotonic() - began < 10
    assert isinstance(future.exception(), duckdb.InterruptException)
    assert not busy()


def test_ctrl_c_while_the_caller_waits_for_the_work_ends_its_query():
    con = duckdb.connect()
    started = threading.Event()
    endless = _endless(started)

    def ctrl_c():
        started.wait(10)
        time.sleep(0.3)  # the caller is waiting at the block's end by now
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c).start()
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt), alongside(con) as second:
        future = second.submit(endless)
        # were the wait deaf to the Ctrl-C, this ends it: a failure, not a hung test
        watchdog = threading.Timer(20, second.close, kwargs={"interrupt": True})
        watchdog.start()
    watchdog.cancel()
    assert time.monotonic() - began < 10
    assert isinstance(future.exception(), duckdb.InterruptException)
    assert not busy()


def test_work_not_started_when_the_caller_fails_never_starts():
    con = duckdb.connect()
    release = threading.Event()
    ran = []
    threading.Timer(0.5, release.set).start()  # after the failure: the first is running
    with pytest.raises(RuntimeError), alongside(con) as second:
        first = second.submit(lambda connection: release.wait(10))
        later = second.submit(lambda connection: ran.append(True))
        raise RuntimeError("the caller failed")
    assert first.done() and later.cancelled() and not ran
    assert not busy()


def test_memory_is_not_returned_while_work_is_alongside(tmp_path):
    """Lowering the pool's limit to evict cached blocks, as returning memory does, fails a
    query running then on another connection (DuckDB: Out of Memory Error). The return
    waits for the next call after the work."""
    path = tmp_path / "blocks.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE t AS SELECT i, md5(i::VARCHAR) AS text FROM range(3000000) r(i)")
    con = duckdb.connect(str(path), read_only=True)
    returns = []
    try:
        with alongside(con) as second:
            work = second.submit(
                lambda c: c.execute(
                    "SELECT count(DISTINCT text || i::VARCHAR), sum(i) FROM t"
                ).fetchall()
            )
            while not work.done():
                returns.append(return_freed_memory(con) or return_freed_memory_if_grown(con))
                time.sleep(0.005)
        assert work.result() == [(3_000_000, 3_000_000 * 2_999_999 // 2)]
        assert returns and not any(returns)
        assert not busy()
        return_freed_memory(con)  # runs again, and the limit is the default again
        assert con.execute("SELECT count(*) FROM t").fetchone() == (3_000_000,)
    finally:
        con.close()


def test_all_work_of_the_process_runs_on_one_thread_in_order():
    con = duckdb.connect()
    names = []
    with alongside(con) as outer:
        outer.submit(lambda c: names.append(threading.current_thread().name))
        with alongside(con) as inner:
            inner.submit(lambda c: names.append(threading.current_thread().name))
    assert len(names) == 2 and names[0] == names[1] != threading.current_thread().name
    assert alongside_module._running == 0


class _InterruptedInLibrary(Rule):
    """A rule whose query gets Ctrl-C, which the library wraps in its own error (as DuckDB
    and polars do)."""

    code = "XXX902"
    name = "interrupted"
    severity = Severity.LOW
    family_label = "test"

    def check(self, ctx):
        try:
            interrupts._on_sigint(signal.SIGINT, None)
        except KeyboardInterrupt:
            raise RuntimeError("INTERRUPT Error: Interrupted!") from None
        yield from ()


@pytest.mark.parametrize("alone", [False, True], ids=["in line", "alongside"])
def test_ctrl_c_wrapped_by_a_library_ends_the_scan_rather_than_failing_the_rule(
    fresh_demo_db, monkeypatch, alone
):
    """An interrupted scan is not stored with an error result in place of the rule's
    findings (a later report would reuse it as complete)."""
    monkeypatch.setattr(interrupts, "_requested", False)
    monkeypatch.setattr(_InterruptedInLibrary, "alone", alone)
    config = load_config(fresh_demo_db["config"])
    rules = [*select_rules("CKP001"), _InterruptedInLibrary]
    with (
        open_warehouse(fresh_demo_db["db"], read_only=True) as wh,
        pytest.raises(KeyboardInterrupt),
    ):
        run_rules(wh.con, config, rules, ALL_HISTORY)
    assert not busy()

"""A query that can be stopped: by Ctrl-C at any moment, and by a time limit.

DuckDB runs a query in C++ without returning to Python, so a signal handler waits until the
query ends, and an endless recursive CTE never does (it ran on 60 s after Ctrl-C). The query
runs in a worker thread; the main thread waits on it, where Ctrl-C is delivered at once and
the time limit is kept, and either ends it with ``con.interrupt()``, DuckDB's way to stop a
running query from another thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import duckdb

from audit.errors import InputError

T = TypeVar("T")
STOP_WAIT_S = 10.0  # for the interrupted query to give up its thread


def run_with_deadline(
    con: duckdb.DuckDBPyConnection, work: Callable[[], T], timeout: float | None, what: str
) -> T:
    """``work()`` (queries on ``con``) in a thread, interrupted after ``timeout`` seconds
    (an input error naming ``what`` and the limit) or at Ctrl-C (re-raised here)."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = work()
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="audit-query", daemon=True)
    worker.start()
    try:
        worker.join(timeout)  # a lock wait: Ctrl-C interrupts it at once
    except KeyboardInterrupt:
        _stop(con, worker)
        raise
    if worker.is_alive():
        _stop(con, worker)
        raise InputError(
            f"{what} ran longer than {timeout:g} s and was stopped; raise --timeout (or "
            "[sql] timeout_seconds) if it needs more"
        )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _stop(con: duckdb.DuckDBPyConnection, worker: threading.Thread) -> None:
    con.interrupt()
    worker.join(STOP_WAIT_S)

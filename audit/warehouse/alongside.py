"""Work on a second connection to the warehouse, on a thread, alongside the caller's Python.

A weekly report or a scan at 100,000 runs spends about 40 % of its time in DuckDB queries,
which release the GIL, and the rest in Python, which holds it and uses one core. Work
that is only queries and reads nothing the caller builds (IDL003's idle stretches, the
report's coverage figures) can run meanwhile on the core the Python leaves idle.

All of it runs in order on one thread. Each piece of work gets its own connection
(``DuckDBPyConnection.cursor()``: the same database, its own temporary tables and
registered frames) and sees what is committed.
While any is running, ``busy()`` is true: the buffer pool's limit, which the allocator
lowers for a moment to evict cached blocks, is the whole database's, and a query running
then could fail for lack of memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager, suppress
from typing import TypeVar

import duckdb

T = TypeVar("T")

_lock = threading.Lock()
_running = 0  # pieces of work submitted and not finished
_thread: list[ThreadPoolExecutor] = []  # the one thread, made at the first submit
WAKE_SECONDS = 0.1  # how soon the caller, waiting for the work, sees a Ctrl-C


def busy() -> bool:
    """Whether a query may be running on a second connection now."""
    return _running > 0


class Alongside:
    """Work submitted by one block of the caller. All work of the process runs in order on
    one thread: two more lanes would compete for the same two cores and hold two work's
    intermediate results at once."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self._con = con
        self._work: list[tuple[Future, duckdb.DuckDBPyConnection]] = []

    def submit(self, work: Callable[[duckdb.DuckDBPyConnection], T]) -> Future[T]:
        """Run ``work(connection)`` on the thread; its result or exception is the future's."""
        global _running
        connection = self._con.cursor()
        with _lock:  # busy from now: the limit must not be lowered before the work starts
            _running += 1
            if not _thread:
                _thread.append(
                    ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-alongside")
                )

        def run() -> T:
            try:
                return work(connection)
            finally:
                _finished(connection)

        future = _thread[0].submit(run)
        self._work.append((future, connection))
        return future

    def close(self, interrupt: bool = False) -> None:
        """Wait for this block's work; with ``interrupt``, cancel what has not started and
        end the running query first (Ctrl-C, or a failure that makes the results useless)."""
        if interrupt:
            # the last first: a cancelled piece is skipped, and the thread would start the
            # next before it was cancelled
            for future, connection in reversed(self._work):
                if future.cancel():
                    _finished(connection)
                else:
                    with suppress(duckdb.Error):  # closed: its work is done
                        connection.interrupt()
        pending = {future for future, _ in self._work}
        while pending:
            # in steps: Ctrl-C taken by another thread (the kernel picks any) runs its
            # handler in the main thread only when that thread runs Python again
            pending = wait(pending, timeout=WAKE_SECONDS).not_done


def _finished(connection: duckdb.DuckDBPyConnection) -> None:
    global _running
    connection.close()
    with _lock:
        _running -= 1


@contextmanager
def alongside(con: duckdb.DuckDBPyConnection) -> Iterator[Alongside]:
    """An ``Alongside`` for the block; leaving it waits for the work, and a block that
    raises (Ctrl-C included) interrupts the work's queries first."""
    second = Alongside(con)
    try:
        yield second
        second.close()  # Ctrl-C while waiting here interrupts the work too
    except BaseException:
        second.close(interrupt=True)
        raise

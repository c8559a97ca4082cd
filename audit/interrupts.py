"""Ctrl-C handling shared by the entry point, the CLI and the warehouse.

Kept free of heavy imports: the entry point installs the handler before anything else loads.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_INTERRUPTED = 130

_requested = False
_deferred = False
_saved_transactions = 0


def install() -> None:
    signal.signal(signal.SIGINT, _on_sigint)


def ignore_from_now_on() -> None:
    """For the process's last moments, when the outcome is already decided."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def requested() -> bool:
    """True once SIGINT arrived, even if a library wrapped the KeyboardInterrupt."""
    return _requested


def message() -> str:
    if _saved_transactions:
        return "audit: interrupted; what was saved before the interrupt is complete"
    return "audit: interrupted; nothing was written"


@contextmanager
def uninterruptible_commit() -> Iterator[None]:
    """Hold Ctrl-C while a transaction commits, so the message can say whether it did."""
    global _deferred, _saved_transactions
    _deferred = True
    try:
        yield
        _saved_transactions += 1
    finally:
        _deferred = False
    if _requested:
        raise KeyboardInterrupt


def _on_sigint(_signum, _frame) -> None:
    # DuckDB, pyarrow and polars re-raise a KeyboardInterrupt from their own code as
    # their own errors (RuntimeError, InvalidInputException, ...); the flag survives that.
    global _requested
    _requested = True
    if not _deferred:
        raise KeyboardInterrupt

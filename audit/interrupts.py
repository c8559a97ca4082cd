"""Ctrl-C handling shared by the entry point, the CLI and the warehouse.

Kept free of heavy imports: the entry point installs the handler before anything else loads.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM: `audit watch` stopped by its service manager

_requested = False
_held = 0
_saved_transactions = 0
# A second Ctrl-C this soon after the first lands in the clean-up the first started (a
# library's generator closing its view), which then fails as "Exception ignored in ...";
# a later one interrupts again, in case a library swallowed the first.
REPEAT_IGNORED_SECONDS = 1.0
_raised_at: float | None = None
_terminated = False


def install() -> None:
    signal.signal(signal.SIGINT, _on_sigint)


def install_terminate() -> None:
    """SIGTERM as Ctrl-C, for a long-running command (``audit watch``) that a service
    manager stops: it ends between steps the same way, with exit code 143."""
    signal.signal(signal.SIGTERM, _on_sigint)


def exit_code() -> int:
    return EXIT_TERMINATED if _terminated else EXIT_INTERRUPTED


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
def held() -> Iterator[None]:
    """Ctrl-C waits until the block ends; the caller checks ``requested()`` after it."""
    global _held
    _held += 1
    try:
        yield
    finally:
        _held -= 1


@contextmanager
def uninterruptible_commit() -> Iterator[None]:
    """Hold Ctrl-C while a transaction commits, so the message can say whether it did."""
    global _saved_transactions
    with held():
        yield
        _saved_transactions += 1
    if _requested and not _held:
        raise KeyboardInterrupt


def _on_sigint(signum, _frame) -> None:
    # DuckDB, pyarrow and polars re-raise a KeyboardInterrupt from their own code as
    # their own errors (RuntimeError, InvalidInputException, ...); the flag survives that.
    global _requested, _raised_at, _terminated
    _terminated = _terminated or signum == signal.SIGTERM
    repeated = (
        _requested
        and _raised_at is not None
        and time.monotonic() - _raised_at < REPEAT_IGNORED_SECONDS
    )
    _requested = True
    if _held or repeated:
        return
    _raised_at = time.monotonic()
    raise KeyboardInterrupt

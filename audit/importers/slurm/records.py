"""A job's records as ``sacct -P`` prints them, with where each came from: what both the
``-P`` text reader and the ``--json`` reader yield, so one row builder serves both."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Where:
    label: str  # file:line, or file: jobs[i] (job N)
    unterminated: bool = False  # the last line of a file that does not end with a newline


# (where, a function building that place's records: a JSON job's are its job and steps)
Records = Iterator[tuple[Where, Callable[[], list[dict]]]]

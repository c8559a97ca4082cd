"""The file-import loop's read-ahead (``audit.importers.files.parse_ahead``): results in
order, and a caller that stops (an error, Ctrl-C) neither waits for the files being parsed
nor gets files parsed that had not started."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from audit.errors import InputError
from audit.importers.files import parse_ahead


def test_results_come_in_order_with_input_errors_as_values():
    def parse(unit: Path):
        if unit.name == "bad":
            raise InputError("bad file")
        time.sleep(0.01 * (5 - int(unit.name)) if unit.name.isdigit() else 0)
        return unit.name.upper()

    units = [Path(n) for n in ("1", "2", "bad", "3", "4")]
    got = [(u.name, r if isinstance(r, str) else str(r)) for u, r in parse_ahead(parse, units, 2)]
    assert got == [("1", "1"), ("2", "2"), ("bad", "bad file"), ("3", "3"), ("4", "4")]


def test_a_caller_that_stops_does_not_wait_and_nothing_more_starts():
    release = threading.Event()
    started: list[str] = []

    def parse(unit: Path):
        started.append(unit.name)
        if unit.name != "0":
            release.wait(30)  # a big file, still being parsed when the caller stops
        return unit.name

    units = [Path(str(n)) for n in range(20)]
    ahead = parse_ahead(parse, units, 2)
    assert next(ahead)[1] == "0"
    before = time.monotonic()
    ahead.close()
    waited = time.monotonic() - before
    release.set()
    time.sleep(0.2)
    assert waited < 5  # it waited for the 30 s parse before
    # the two workers had started at most the files queued ahead (2 x 2 + the next one);
    # the rest were cancelled, not parsed after the caller left
    assert len(started) <= 5

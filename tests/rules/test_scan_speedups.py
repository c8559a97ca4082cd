"""The scan's faster parts give what the plain forms give: week labels, the scan JSON, and
the collector paused while shared facts are built."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from audit import windows
from audit.heap import long_lived
from audit.reports.scan import json_chunks

# zones with DST, half- and quarter-hour offsets, a skipped day (Apia, 2011-12-30), and
# midnight transitions (Sao Paulo before 2019)
ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/Sao_Paulo",
    "Asia/Kolkata",
    "Asia/Kathmandu",
    "Australia/Lord_Howe",
    "Pacific/Apia",
    "Pacific/Chatham",
    "America/St_Johns",
    "Antarctica/Troll",
]


def plain_iso_week(moment: datetime, tz: ZoneInfo) -> str:
    year, week, _ = moment.replace(tzinfo=UTC).astimezone(tz).isocalendar()
    return f"{year}-W{week:02d}"


@given(
    zone=st.sampled_from(ZONES),
    moments=st.lists(
        st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2100, 1, 1)),
        min_size=1,
        max_size=40,
    ),
    start_sorted=st.booleans(),
)
def test_iso_week_labels_every_moment_as_the_conversion_does(zone, moments, start_sorted):
    """The remembered week is only a shortcut: in start order (as rules ask) and in any
    order, every label equals the moment's own conversion."""
    tz = ZoneInfo(zone)
    windows._last_week.clear()
    if start_sorted:
        moments = sorted(moments)
    for moment in moments:
        assert windows.iso_week(moment, tz) == plain_iso_week(moment, tz), moment


@pytest.mark.parametrize("zone", ZONES)
def test_iso_week_at_every_quarter_hour_around_week_boundaries(zone):
    """Every 15 minutes for two days around each Monday of two years with clock changes."""
    tz = ZoneInfo(zone)
    windows._last_week.clear()
    monday = datetime(2011, 1, 2)
    while monday < datetime(2013, 1, 1):
        moment = monday
        while moment < monday + timedelta(days=2):
            assert windows.iso_week(moment, tz) == plain_iso_week(moment, tz), moment
            moment += timedelta(minutes=15)
        monday += timedelta(days=7)


@pytest.mark.parametrize("zone", ["Pacific/Kiritimati", "Etc/GMT+12"])  # UTC+14, UTC-12
def test_iso_week_at_the_ends_of_the_calendar(zone):
    """Weeks whose window reaches beyond the years 1-9999 are labelled, not remembered."""
    tz = ZoneInfo(zone)
    windows._last_week.clear()
    for moment in (datetime(1, 1, 1, 12), datetime(1, 1, 3), datetime(9999, 12, 30, 9)):
        assert windows.iso_week(moment, tz) == plain_iso_week(moment, tz)


DOCUMENTS = st.fixed_dictionaries(
    {
        "scan": st.dictionaries(st.text(max_size=5), st.text(max_size=8), max_size=3),
        "summary": st.recursive(
            st.none() | st.integers() | st.text(max_size=6),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=4), inner, max_size=3)
            ),
            max_leaves=8,
        ),
        "findings": st.lists(
            st.dictionaries(
                st.text(max_size=6),
                st.text(max_size=10) | st.floats(allow_nan=False) | st.none(),
                max_size=4,
            ),
            max_size=5,
        ),
    }
)


@given(DOCUMENTS)
def test_scan_json_is_the_document_with_one_finding_per_line(document):
    text = "".join(json_chunks(document))
    assert json.loads(text) == document
    assert text.endswith("}\n")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('  "findings": ['))
    for offset, finding in enumerate(document["findings"], start=1):
        line = lines[start + offset]
        assert json.loads(line.strip().removesuffix(",")) == finding


def test_scan_json_keeps_datetimes_as_text():
    document = {"scan": {}, "summary": {}, "findings": [{"at": datetime(2026, 11, 23, 1, 2)}]}
    assert json.loads("".join(json_chunks(document)))["findings"] == [{"at": "2026-11-23 01:02:00"}]


def test_long_lived_pauses_the_collector_and_freezes_what_it_built():
    assert gc.isenabled()
    frozen_before = gc.get_freeze_count()
    try:
        with long_lived():
            assert not gc.isenabled()
            with long_lived():  # a shared fact built while building another
                assert not gc.isenabled()
                inner = [[i] for i in range(1000)]
            assert not gc.isenabled()  # still building the outer one
            outer = [[i] for i in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen_before + len(inner) + len(outer)
    finally:
        gc.unfreeze()


def test_long_lived_collects_earlier_cycles_rather_than_freezing_them():
    """A garbage cycle made before the block is collected, not kept frozen forever."""
    probe = """
import gc, weakref
from audit.heap import long_lived

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a
alive = weakref.ref(a)
del a, b
gc.disable()  # the cycle stays garbage until someone collects it
gc.enable()
with long_lived():
    kept = [object() for _ in range(10)]
print(alive() is None)
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_long_lived_restores_the_collector_after_an_error():
    try:
        with pytest.raises(ZeroDivisionError), long_lived():
            1 / 0  # noqa: B018
        assert gc.isenabled()
    finally:
        gc.unfreeze()


def test_long_lived_leaves_a_disabled_collector_disabled():
    gc.disable()
    try:
        with long_lived():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


def test_usage_judged_once_per_window_and_length_gives_each_rule_its_own(tmp_path):
    """The utilisation rules share one judging per (window, minimum length): a rule with
    another minimum gets its own, and every caller gets the notes."""
    from audit.costs import Facts
    from audit.testing import build_warehouse
    from audit.usage import UsageIndex
    from audit.windows import Window

    wh, config = build_warehouse(
        tmp_path / "w.duckdb",
        {
            "jobs": [
                {"job_id": 1, "gpus": 8, "start": 0, "end": 5, "host": "n1"},
                {"job_id": 2, "gpus": 8, "start": 0, "end": 0.5, "host": "n2"},
                {"job_id": 3, "gpus": 8, "start": 0, "end": 5, "host": "n3"},
            ],
            "telemetry": [
                {"host": "n1", "start": 0, "end": 5, "util": {"default": 50}},
                {"host": "n2", "start": 0, "end": 0.5, "util": {"default": 50}},
            ],
        },
    )
    usage = UsageIndex(wh.con, Facts.load(wh.con, config))
    window = Window()

    def judged(min_hours: float) -> tuple[list[str], list[str]]:
        notes: list[str] = []
        return sorted(alloc.label for alloc, _ in usage.judged(window, min_hours, notes)), notes

    no_data = "job 3: no GPU usage evidence"
    long_only, long_notes = judged(1.0)
    assert long_only == ["job 1"] and [n[: len(no_data)] for n in long_notes] == [no_data]
    assert judged(0.25) == (["job 1", "job 2"], long_notes)
    assert judged(1.0) == (long_only, long_notes)  # asked again: the same, notes included
    short_pairs = usage.judged(window, 0.25, [])
    short_pairs.clear()  # a caller's list is its own
    assert judged(0.25)[0] == ["job 1", "job 2"]

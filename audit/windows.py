"""Time windows: the one type that rules, summaries and reports use to ask "in this period?".

A window is half-open, ``[since, until)``, in naive UTC; either end may be open (None).
Rules judge an event by one moment (a run's start, a job's start) with ``contains``, or
something that lasts (a checkpoint that existed, an idle stretch) with ``overlaps``. SQL
gets the same test from ``condition``, with bound parameters, and a polars frame from
``holds``.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import polars as pl

from audit.errors import InputError

NOW_ENV = "AUDIT_NOW"  # pins "now" (ISO time, UTC) for reproducible reports and tests


@dataclass(frozen=True)
class Window:
    since: datetime | None = None  # naive UTC, inclusive
    until: datetime | None = None  # naive UTC, exclusive
    label: str = ""

    @property
    def bounded(self) -> bool:
        return self.since is not None and self.until is not None

    def contains(self, moment: datetime | None) -> bool:
        """Whether ``moment`` lies in the window; an unknown moment lies in no bounded one."""
        if moment is None:
            return self.since is None and self.until is None
        return (self.since is None or moment >= self.since) and (
            self.until is None or moment < self.until
        )

    def overlaps(self, start: datetime | None, end: datetime | None) -> bool:
        """Whether ``[start, end]`` meets the window (an open end lasts for ever)."""
        if start is not None and self.until is not None and start >= self.until:
            return False
        return not (end is not None and self.since is not None and end < self.since)

    def condition(self, column: str) -> tuple[str, list]:
        """SQL condition (and its parameters) keeping rows whose ``column`` is in the window."""
        parts, params = [], []
        if self.since is not None:
            parts.append(f"{column} >= ?")
            params.append(self.since)
        if self.until is not None:
            parts.append(f"{column} < ?")
            params.append(self.until)
        return (" AND ".join(parts) or "TRUE"), params

    def holds(self, column: str) -> pl.Expr:
        """``contains`` as a polars expression over a datetime ``column``."""
        if self.since is None and self.until is None:
            return pl.lit(True)
        moment = pl.col(column)
        held = moment.is_not_null()
        if self.since is not None:
            held &= moment >= self.since
        if self.until is not None:
            held &= moment < self.until
        return held

    def describe(self) -> str:
        if self.label:
            return self.label
        if self.since is None and self.until is None:
            return "all history"
        since = f"{self.since:%Y-%m-%d %H:%M}" if self.since else "the start"
        until = f"{self.until:%Y-%m-%d %H:%M}" if self.until else "now"
        return f"{since} to {until} UTC"

    def previous_week(self, tz: ZoneInfo) -> Window:
        if self.since is None:
            raise ValueError("an open window has no previous week")
        try:
            start_local = self.since.replace(tzinfo=UTC).astimezone(tz).date() - timedelta(days=7)
        except OverflowError:
            raise InputError(
                f"{self.describe()} has no previous week to compare with (it starts in year 1)"
            ) from None
        year, week, _ = start_local.isocalendar()
        return week_window(year, week, tz)


def started_in(items: list, starts: list[datetime], window: Window) -> list:
    """The items that ``window.contains`` by start, found by bisection: ``items`` are
    ordered by start with unknown starts last, ``starts`` are their known starts."""
    if window.since is None and window.until is None:
        return items  # the unbounded window holds unknown starts too (Window.contains)
    lo = 0 if window.since is None else bisect_left(starts, window.since)
    hi = len(starts) if window.until is None else bisect_left(starts, window.until)
    return items[lo:hi]


ALL_HISTORY = Window()


def now_utc() -> datetime:
    """The clock, naive UTC: when something is written or done (imported_at, a scan's
    start, an action). ``now()`` is the time judged, which ``AUDIT_NOW`` may pin."""
    return datetime.now(UTC).replace(tzinfo=None)


def now() -> datetime:
    """The current time in naive UTC, or ``AUDIT_NOW`` when it is set."""
    pinned = os.environ.get(NOW_ENV)
    if pinned:
        try:
            return datetime.fromisoformat(pinned).replace(tzinfo=None)
        except ValueError:
            raise InputError(
                f"{NOW_ENV}={pinned!r} is not an ISO time like 2026-11-23T08:00:00"
            ) from None
    return datetime.now(UTC).replace(tzinfo=None)


def week_window(year: int, week: int, tz: ZoneInfo) -> Window:
    """ISO week ``year-Wweek`` in time zone ``tz``, as a UTC window."""
    try:
        monday = date.fromisocalendar(year, week, 1)
    except ValueError:
        raise InputError(f"{year}-W{week:02d} is not an ISO week") from None
    start = datetime.combine(monday, datetime.min.time(), tzinfo=tz)
    try:
        return Window(
            since=start.astimezone(UTC).replace(tzinfo=None),
            until=(start + timedelta(days=7)).astimezone(UTC).replace(tzinfo=None),
            label=f"{year}-W{week:02d}",
        )
    except OverflowError:  # the week ends (or starts, in UTC) beyond the years 1-9999
        raise InputError(f"{year}-W{week:02d} reaches beyond the years 1 to 9999") from None


def parse_week(text: str, tz: ZoneInfo) -> Window:
    try:
        year, week = text.upper().split("-W")
        return week_window(int(year), int(week), tz)
    except ValueError:
        raise InputError(f"--week takes an ISO week like 2026-W47, got {text!r}") from None


def last_complete_week(tz: ZoneInfo) -> Window:
    local_today = now().replace(tzinfo=UTC).astimezone(tz).date()
    year, week, _ = (local_today - timedelta(days=7)).isocalendar()
    return week_window(year, week, tz)


# Per time zone, the UTC span in which the last week asked for certainly holds (its
# window less a margin wider than any clock change): rules label 100,000s of runs by week,
# in start order, and converting each moment cost 0.7 s of a scan at size L.
_WEEK_MARGIN = timedelta(hours=3)
_last_week: dict[ZoneInfo, tuple[datetime, datetime, str]] = {}


def iso_week(moment: datetime, tz: ZoneInfo) -> str:
    """The ISO week label (``2026-W47``) of a naive UTC moment, in ``tz``."""
    known = _last_week.get(tz)
    if known is not None and known[0] <= moment < known[1]:
        return known[2]
    year, week, _ = moment.replace(tzinfo=UTC).astimezone(tz).isocalendar()
    label = f"{year}-W{week:02d}"
    try:
        window = week_window(year, week, tz)
    except InputError:  # a week at the end of the calendar: not remembered
        return label
    _last_week[tz] = (window.since + _WEEK_MARGIN, window.until - _WEEK_MARGIN, label)
    return label

"""What a GPU sample is and may hold: the ``gpu_samples`` row every telemetry format
becomes, and one rule for its values and times (nvidia-smi, DCGM, Prometheus and the
trackers' system metrics alike)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

import polars as pl

SAMPLE_SCHEMA = {
    "host": pl.String,
    "gpu": pl.String,
    "ts": pl.Datetime("us"),
    "util_pct": pl.Float32,
    "mem_used_mib": pl.Float32,
    "mem_total_mib": pl.Float32,
    "power_w": pl.Float32,
    "model": pl.String,
    "uuid": pl.String,
    "job_label": pl.String,
    "pod": pl.String,
    "origin": pl.String,
}


@dataclass
class TelemetryFile:
    samples: pl.DataFrame
    rows_read: int
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# -- what a sample may hold: one rule for nvidia-smi, DCGM and Prometheus ---------------------
MAX_MIB = float(1 << 24)  # 16 TiB of memory on one GPU
MAX_WATTS = 10_000.0
VALID_RANGES = {
    # column: (lowest, highest, what it is called in a message, unit)
    "util_pct": (0.0, 100.0, "utilization", "%"),
    "mem_used_mib": (0.0, MAX_MIB, "memory.used", "MiB"),
    "mem_total_mib": (0.0, MAX_MIB, "memory.total", "MiB"),
    "power_w": (0.0, MAX_WATTS, "power.draw", "W"),
}
# DCGM fields that are not stored as such are checked as the column they feed.
_CHECKED_AS = {"engine_active_pct": "util_pct", "mem_free_mib": "mem_used_mib"}
FIRST_YEAR, LAST_YEAR = 1970, 2200


def value_problem(column: str, value: float) -> str | None:
    """Why ``value`` cannot be a sample's ``column`` (NaN, infinite, out of range), or None."""
    lo, hi, name, unit = VALID_RANGES[_CHECKED_AS.get(column, column)]
    if math.isfinite(value) and lo <= value <= hi:
        return None
    return f"{name} {value:g} is outside {lo:g}-{hi:g} {unit}"


def time_problem(moment: datetime) -> str | None:
    if FIRST_YEAR <= moment.year <= LAST_YEAR:
        return None
    return f"time {moment:%Y-%m-%d %H:%M:%S} is outside the years {FIRST_YEAR}-{LAST_YEAR}"


def valid_value(column: str) -> pl.Expr:
    """The same rule as ``value_problem``, for a whole column."""
    lo, hi, _, _ = VALID_RANGES[column]
    value = pl.col(column)
    return value.is_null() | (value.is_finite() & value.is_between(lo, hi))


# The years FIRST_YEAR-LAST_YEAR as instants: comparing a parsed time with them is a third
# of the cost of taking its year.
_FIRST_INSTANT = datetime(FIRST_YEAR, 1, 1)
_PAST_LAST_INSTANT = datetime(LAST_YEAR + 1, 1, 1)


def valid_time(column: str | pl.Expr) -> pl.Expr:
    """A time within FIRST_YEAR-LAST_YEAR, for a column of times already parsed."""
    ts = pl.col(column) if isinstance(column, str) else column
    return (ts >= _FIRST_INSTANT) & (ts < _PAST_LAST_INSTANT)

"""The Prometheus text exposition format (dcgm-exporter's ``/metrics``, saved or scraped):
one DCGM series line at a time, each bounded like every sample."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path

from audit.errors import InputError
from audit.importers.telemetry.dcgm import (
    DCGM_FIELDS,
    add_dcgm_value,
    dcgm_frame,
    identifies_gpu,
)
from audit.importers.telemetry.samples import TelemetryFile, time_problem, value_problem
from audit.text import counted

SERIES_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def read_exposition(
    path: Path, content: str, host: str | None, skip_bad: bool, at: datetime | None
) -> TelemetryFile:
    default_ts = at or datetime.fromtimestamp(os.path.getmtime(path), UTC).replace(tzinfo=None)
    rows: dict[tuple, dict] = {}
    skipped: list[str] = []
    notes: list[str] = []
    read = 0
    untimed = 0  # samples placed at ``default_ts``: the line had no timestamp
    lines = content.splitlines()
    unterminated = not content.endswith("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.startswith("#"):
            continue
        read += 1
        try:
            sample = _exposition_sample(line, default_ts)
        except ValueError as exc:
            if unterminated and number == len(lines):
                notes.append(f"{path}: last line incomplete, skipped (a file still being written)")
                read -= 1
                continue
            message = f"{path}:{number}: {exc}"
            if not skip_bad:
                raise InputError(message) from None
            skipped.append(message)
            continue
        if sample is not None:
            metric, labels, value, ts, timed = sample
            untimed += not timed
            add_dcgm_value(rows, labels, metric, value, ts, host or path.stem, "dcgm")
    if untimed and at is None:
        # a saved snapshot is placed in time by its file's date, which a copy may have
        # changed: the user is told, once, which moment was taken
        notes.append(
            f"{path}: {counted(untimed, 'DCGM value')} without a timestamp, placed at the "
            f"file's modification time {default_ts:%Y-%m-%d %H:%M:%S} UTC (--at sets "
            "when it was scraped)"
        )
    return TelemetryFile(samples=dcgm_frame(rows), rows_read=read, skipped=skipped, notes=notes)


def read_exposition_text(label: str, content: str, host: str | None, at: datetime) -> TelemetryFile:
    """A dcgm-exporter ``/metrics`` answer scraped at ``at`` (``label``: its URL)."""
    return read_exposition(Path(label), content, host, False, at)


def _exposition_sample(line: str, default_ts: datetime) -> tuple | None:
    """(metric, labels, value, ts, whether the line gave ts) of a DCGM series line; None for
    other series; ValueError saying what is wrong with a line that cannot be read."""
    match = SERIES_LINE.match(line)
    if not match:
        raise ValueError(f"expected 'METRIC{{labels}} value [timestamp_ms]', got {line[:80]!r}")
    metric, _, labels_text, value_text, ts_text = match.groups()
    labels = dict(_LABEL.findall(labels_text or ""))
    if not metric.startswith("DCGM_FI_") or not identifies_gpu(labels):
        return None  # other exporters' series, and dummy series without a GPU
    try:
        value = float(value_text)
    except ValueError:
        raise ValueError(f"value {value_text[:40]!r} is not a number") from None
    if metric in DCGM_FIELDS:
        column, scale = DCGM_FIELDS[metric]
        problem = value_problem(column, value * scale)
        if problem:
            raise ValueError(f"{metric}: {problem}")
    if ts_text:
        try:
            ts = datetime.fromtimestamp(int(ts_text) / 1000, UTC).replace(tzinfo=None)
        except (OverflowError, OSError, ValueError):
            raise ValueError(f"timestamp {ts_text[:40]} ms is out of range") from None
    else:
        ts = default_ts
    problem = time_problem(ts)
    if problem:
        source = f"{ts_text} ms" if ts_text else "--at or the file's modification time"
        raise ValueError(f"{problem} ({source})")
    return metric, labels, value, ts, bool(ts_text)

"""A saved Prometheus ``query_range`` / ``query`` answer (JSON) of DCGM series."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from audit.errors import InputError
from audit.importers.read import parse_strict_json
from audit.importers.telemetry.dcgm import (
    DCGM_FIELDS,
    add_dcgm_value,
    dcgm_frame,
    identifies_gpu,
)
from audit.importers.telemetry.samples import TelemetryFile, time_problem, value_problem
from audit.importers.text import describe

_PROMETHEUS_SHAPE = (
    "expected a Prometheus query result "
    '({"data": {"resultType": "matrix", "result": [{"metric": {...}, "values": [[time, "value"], ...]}]}})'
)


def read_prometheus_json(
    path: Path, content: str, host: str | None, skip_bad: bool = False
) -> TelemetryFile:
    document = parse_strict_json(content, path)
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, dict) or data.get("resultType") not in ("matrix", "vector"):
        raise InputError(f"{path}: {_PROMETHEUS_SHAPE}; data.resultType must be matrix or vector")
    result = data.get("result", [])
    if not isinstance(result, list):
        raise InputError(f"{path}: data.result: expected a list of series, got {describe(result)}")
    rows: dict[tuple, dict] = {}
    skipped: list[str] = []
    read = 0
    for index, series in enumerate(result):
        where = f"{path}: data.result[{index}]"
        if not isinstance(series, dict):
            raise InputError(f"{where}: expected a series object, got {describe(series)}")
        labels = series.get("metric", {})
        if not isinstance(labels, dict):
            raise InputError(
                f"{where}.metric: expected an object of labels, got {describe(labels)}"
            )
        for key, value in labels.items():
            if not isinstance(value, str) or not _encodable(value):
                raise InputError(
                    f"{where}.metric.{key}: expected a label text, got {describe(value)}"
                )
        metric = labels.get("__name__", "")
        if not metric.startswith("DCGM_FI_") or not identifies_gpu(labels):
            continue
        if "values" in series:
            points, name = series["values"], "values"
        else:
            points, name = ([series["value"]] if "value" in series else []), "value"
        if not isinstance(points, list):
            raise InputError(f"{where}.{name}: expected a list of points, got {describe(points)}")
        for number, point in enumerate(points):
            read += 1
            try:
                ts, value = _prometheus_point(point, metric)
            except ValueError as exc:
                message = f"{where}.{name}[{number}] ({metric}): {exc}"
                if not skip_bad:
                    raise InputError(message) from None
                skipped.append(message)
                continue
            add_dcgm_value(rows, labels, metric, value, ts, host or path.stem, "prometheus")
    return TelemetryFile(samples=dcgm_frame(rows), rows_read=read, skipped=skipped)


def _prometheus_point(point, metric: str) -> tuple[datetime, float]:
    """A [unix_seconds, "value"] pair; ValueError saying what is wrong with it."""
    if not isinstance(point, list) or len(point) != 2:
        raise ValueError(f"expected a [time, value] pair, got {describe(point)}")
    moment, value_text = point
    if isinstance(moment, bool) or not isinstance(moment, int | float):
        raise ValueError(f"time: expected seconds since 1970, got {describe(moment)}")
    if isinstance(value_text, bool) or not isinstance(value_text, str | int | float):
        raise ValueError(f"value: expected a number as text, got {describe(value_text)}")
    try:
        value = float(value_text)
    except (ValueError, OverflowError):
        raise ValueError(f"value {str(value_text)[:40]!r} is not a number") from None
    try:
        ts = datetime.fromtimestamp(moment, UTC).replace(tzinfo=None)
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"time {moment!r} is out of range") from None
    problem = time_problem(ts)
    if problem is None and metric in DCGM_FIELDS:
        column, scale = DCGM_FIELDS[metric]
        problem = value_problem(column, value * scale)
    if problem:
        raise ValueError(problem)
    return ts, value


def _encodable(value: str) -> bool:
    """False for text holding lone surrogates (``"\\ud800"`` in JSON), which no table takes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

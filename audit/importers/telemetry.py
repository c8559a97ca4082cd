"""GPU telemetry files: nvidia-smi CSV, dcgm-exporter / Prometheus text, Prometheus JSON.

Everything becomes rows of ``gpu_samples`` (host, gpu, ts, util_pct, mem_used_mib, ...).
nvidia-smi files can be large (a week of 1,000 GPUs at 1 sample/min is 10M rows), so they
are parsed by polars in bulk, never line by line in Python.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import polars as pl

from audit.errors import InputError, utf8_problem

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
# nvidia-smi --query-gpu names -> our columns
_SMI_COLUMNS = {
    "utilization.gpu": "util_pct",
    "memory.used": "mem_used_mib",
    "memory.total": "mem_total_mib",
    "power.draw": "power_w",
    "power.draw.average": "power_w",
    "name": "model",
    "uuid": "uuid",
}
_SMI_IDENTITY = ("index", "uuid", "pci.bus_id")
_MISSING = ["N/A", "[N/A]", "[Not Supported]", "[Unknown Error]", "[GPU is lost]", ""]
# dcgm-exporter field -> (column, scale)
DCGM_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_pct", 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("engine_active_pct", 100.0),  # a 0-1 ratio
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", 1.0),
    "DCGM_FI_DEV_FB_FREE": ("mem_free_mib", 1.0),
    "DCGM_FI_DEV_FB_TOTAL": ("mem_total_mib", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
}
_SERIES = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


@dataclass
class TelemetryFile:
    samples: pl.DataFrame
    rows_read: int
    skipped: list[str] = field(default_factory=list)


def read_telemetry(
    path: Path,
    tz: ZoneInfo,
    host: str | None = None,
    fields: list[str] | None = None,
    skip_bad: bool = False,
    at: datetime | None = None,
) -> TelemetryFile:
    if path.is_dir():
        raise InputError(f"{path}: is a directory; pass telemetry files")
    if not path.exists():
        raise InputError(f"{path}: no such file")
    head = _head(path)
    if not head.strip():
        raise InputError(
            f"{path}: empty file; expected nvidia-smi CSV, DCGM/Prometheus text or JSON"
        )
    if b"\x00" in head:
        raise InputError(f"{path}: binary data (NUL bytes), not a telemetry text file")
    stripped = head.lstrip()
    if stripped.startswith(b"{"):
        return _read_prometheus_json(path, host)
    if (
        stripped.startswith(b"#")
        or b"DCGM_FI_" in head.split(b"\n", 1)[0]
        or _SERIES.match(head.split(b"\n", 1)[0].decode("utf-8", "replace"))
    ):
        return _read_exposition(path, host, skip_bad, at)
    return _read_nvidia_smi(path, tz, host or path.stem, fields, skip_bad)


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(65536)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def _decoded(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(utf8_problem(path, data, exc)) from None


# -- nvidia-smi ----------------------------------------------------------------------------
_TIME_FORMATS = (
    "%Y/%m/%d %H:%M:%S%.f",
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y/%m/%d %H:%M:%S",
    "%Y-%m-%d %H:%M:%S",
)


def _read_nvidia_smi(
    path: Path, tz: ZoneInfo, host: str, fields: list[str] | None, skip_bad: bool
) -> TelemetryFile:
    first_line = _head(path).split(b"\n", 1)[0].decode("utf-8", "replace")
    if fields is None:
        names = [_column_name(c) for c in first_line.split(",")]
        if "timestamp" not in names and not any(n in names for n in _SMI_IDENTITY):
            raise InputError(
                f"{path}:1: no nvidia-smi header (expected e.g. 'timestamp, index, utilization.gpu [%]'); "
                "for --format=csv,noheader files pass --fields with the --query-gpu list"
            )
        first = 1
    else:
        names, first = [_column_name(c) for c in fields], 0
    if "timestamp" not in names:
        raise InputError(
            f"{path}: no timestamp column; query nvidia-smi with --query-gpu=timestamp,..."
        )
    identity = next((n for n in _SMI_IDENTITY if n in names), None)
    if identity is None:
        raise InputError(
            f"{path}: cannot tell GPUs apart: the file needs an index, uuid or pci.bus_id column"
        )
    if not any(n in names for n in ("utilization.gpu", "memory.used")):
        raise InputError(f"{path}: no utilization.gpu or memory.used column; nothing to measure")
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise InputError(f"{path}: column {duplicated[0]!r} appears twice")
    wanted = [n for n in names if n in ("timestamp", identity, *_SMI_COLUMNS)]
    body = None if skip_bad else _fast_table(path, names, wanted, first)
    samples = None if body is None else _samples(body, host, identity, tz)
    skipped: list[str] = []
    if samples is None or samples["unparsable"].any():
        # a malformed line somewhere: find it (or them) line by line
        body, skipped = _validated_table(path, names, wanted, first, skip_bad)
        samples = _samples(body, host, identity, tz)
    samples = samples.drop("unparsable").filter(pl.col("ts").is_not_null())
    out_of_range = (
        (pl.col("util_pct") < 0) | (pl.col("util_pct") > 100) | (pl.col("mem_used_mib") < 0)
    )
    bad = samples.filter(out_of_range).height
    if bad and not skip_bad:
        raise InputError(f"{path}: utilization outside 0-100 % or negative memory in {bad} rows")
    if bad:
        skipped.append(f"{path}: {bad} rows with utilization outside 0-100 % or negative memory")
        samples = samples.filter(~out_of_range.fill_null(False))
    return TelemetryFile(samples=samples, rows_read=body.height + len(skipped), skipped=skipped)


def _samples(body: pl.DataFrame, host: str, identity: str, tz: ZoneInfo) -> pl.DataFrame:
    """Typed samples in one pass over the strings, plus a flag for values that are no number."""
    ts = pl.col("ts")
    if str(tz) != "UTC":
        ts = (
            ts.dt.replace_time_zone(str(tz), ambiguous="earliest", non_existent="null")
            .dt.convert_time_zone("UTC")
            .dt.replace_time_zone(None)
        )
    power = "power.draw" if "power.draw" in body.columns else "power.draw.average"
    return (
        body.lazy()
        .select(
            host=pl.lit(host),
            gpu=pl.col(identity),
            ts=ts,
            util_pct=_number(body, "utilization.gpu"),
            mem_used_mib=_number(body, "memory.used"),
            mem_total_mib=_number(body, "memory.total"),
            power_w=_number(body, power),
            model=_text(body, "name"),
            uuid=_text(body, "uuid"),
            job_label=pl.lit(None, dtype=pl.String),
            pod=pl.lit(None, dtype=pl.String),
            origin=pl.lit("nvidia-smi"),
            unparsable=_unparsable(body),
        )
        .cast(SAMPLE_SCHEMA)
        .collect()
    )


def _parsed_time(column: pl.Expr, sample: str | None) -> pl.Expr:
    """Parse with the one format the file uses (found on its first value); a year outside
    1970-9999 (strptime accepts a signed "-2026/...") is unparsable, not a sample."""
    chosen = _TIME_FORMATS[0]
    for fmt in _TIME_FORMATS:
        if sample is not None and pl.select(_in_range(pl.lit(sample), fmt).is_not_null()).item():
            chosen = fmt
            break
    return _in_range(column, chosen)


def _in_range(column: pl.Expr, fmt: str) -> pl.Expr:
    ts = column.str.strptime(pl.Datetime("us"), fmt, strict=False)
    return pl.when(ts.dt.year().is_between(1970, 9999)).then(ts)


def _fast_table(path: Path, names: list[str], wanted: list[str], first: int) -> pl.DataFrame | None:
    """The whole file through polars' CSV reader; None when any line looks malformed."""
    try:
        raw = pl.read_csv(
            path,
            has_header=False,
            skip_rows=first,
            new_columns=names,
            infer_schema=False,
            quote_char=None,
            encoding="utf8",
            truncate_ragged_lines=False,
        )
    except pl.exceptions.PolarsError:  # the validating reader says which line and why
        return None
    if raw.width != len(names) or raw[names[-1]].null_count():
        return None  # short lines leave the last column empty
    sample = raw["timestamp"][0].strip() if raw.height else None
    body = (
        raw.lazy()
        .select([pl.col(n).str.strip_chars() for n in wanted])
        .with_columns(ts=_parsed_time(pl.col("timestamp"), sample))
        .collect()
    )
    if body["ts"].null_count():
        return None
    return body


def _validated_table(
    path: Path, names: list[str], wanted: list[str], first: int, skip_bad: bool
) -> tuple[pl.DataFrame, list[str]]:
    try:
        lines = pl.read_csv(
            path,
            has_header=False,
            separator="\x1f",
            quote_char=None,
            new_columns=["line"],
            infer_schema=False,
            encoding="utf8",
            truncate_ragged_lines=True,
        )["line"]
    except pl.exceptions.ComputeError as exc:
        _decoded(path)  # names the line of an encoding error
        raise InputError(f"{path}: cannot read as text ({str(exc).splitlines()[0]})") from None
    body = lines.slice(first).to_frame().with_row_index("line_no", offset=first + 1)
    body = body.filter(pl.col("line").str.strip_chars() != "")
    body = body.with_columns(parts=pl.col("line").str.split(",")).with_columns(
        n=pl.col("parts").list.len()
    )
    body = body.with_columns(
        [
            pl.col("parts").list.get(names.index(n), null_on_oob=True).str.strip_chars().alias(n)
            for n in wanted
        ]
    )
    sample = body.filter(pl.col("n") == len(names))["timestamp"].head(1)
    body = body.with_columns(
        ts=_parsed_time(pl.col("timestamp"), sample[0] if sample.len() else None)
    )
    unparsable = body.filter(_unparsable(body))["line_no"].implode()
    problems = body.filter(
        (pl.col("n") != len(names)) | pl.col("ts").is_null() | pl.col("line_no").is_in(unparsable)
    )
    messages = []
    for row in problems.head(1000).iter_rows(named=True):
        if row["n"] != len(names):
            problem = f"expected {len(names)} comma-separated values, found {row['n']}"
        elif row["ts"] is None:
            problem = (
                f"timestamp: expected 2024/03/15 13:57:59.791, got {str(row['timestamp'])[:40]!r}"
            )
        else:
            problem = f"expected numbers in utilization/memory columns, got {row['line'][:80]!r}"
        messages.append(f"{path}:{row['line_no']}: {problem}")
    if messages and not skip_bad:
        raise InputError(messages[0])
    if problems.height > 1000:
        messages.append(f"{path}: ... and {problems.height - 1000} more bad lines")
    return body.join(problems.select("line_no"), on="line_no", how="anti"), messages


def _unparsable(body: pl.DataFrame) -> pl.Expr:
    """True where a measured column holds text that is neither a number nor N/A."""
    checks = [
        pl.col(n).is_not_null() & ~pl.col(n).is_in(_MISSING) & _numeric(pl.col(n)).is_null()
        for n in ("utilization.gpu", "memory.used", "memory.total")
        if n in body.columns
    ]
    return pl.any_horizontal(checks) if checks else pl.lit(False)


def _numeric(column: pl.Expr) -> pl.Expr:
    """'95 %', '7650 MiB', '70.89 W' or plain numbers -> float; anything else -> null."""
    return column.str.strip_chars_end(" %MiBW").cast(pl.Float32, strict=False)


def _number(body: pl.DataFrame, name: str) -> pl.Expr:
    if name not in body.columns:
        return pl.lit(None, dtype=pl.Float32)
    return pl.when(pl.col(name).is_in(_MISSING)).then(None).otherwise(_numeric(pl.col(name)))


def _text(body: pl.DataFrame, name: str) -> pl.Expr:
    if name not in body.columns:
        return pl.lit(None, dtype=pl.String)
    return pl.when(pl.col(name).is_in(_MISSING)).then(None).otherwise(pl.col(name))


def _column_name(raw: str) -> str:
    """'utilization.gpu [%]' -> 'utilization.gpu'."""
    return raw.strip().split(" [", 1)[0].strip().lower()


# -- Prometheus text exposition (dcgm-exporter) ----------------------------------------------
def _read_exposition(
    path: Path, host: str | None, skip_bad: bool, at: datetime | None
) -> TelemetryFile:
    text = _decoded(path)
    default_ts = at or datetime.fromtimestamp(os.path.getmtime(path), UTC).replace(tzinfo=None)
    rows: dict[tuple, dict] = {}
    skipped: list[str] = []
    read = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        read += 1
        match = _SERIES.match(line)
        if not match:
            message = f"{path}:{number}: expected 'METRIC{{labels}} value [timestamp_ms]', got {line[:80]!r}"
            if not skip_bad:
                raise InputError(message)
            skipped.append(message)
            continue
        metric, _, labels_text, value_text, ts_text = match.groups()
        labels = dict(_LABEL.findall(labels_text or ""))
        if not metric.startswith("DCGM_FI_") or not _identifies_gpu(labels):
            continue  # other exporters' series, and dummy series without a GPU
        try:
            value = float(value_text)
            ts = (
                datetime.fromtimestamp(int(ts_text) / 1000, UTC).replace(tzinfo=None)
                if ts_text
                else default_ts
            )
        except ValueError:
            message = f"{path}:{number}: value {value_text[:40]!r} is not a number"
            if not skip_bad:
                raise InputError(message) from None
            skipped.append(message)
            continue
        except (OverflowError, OSError):
            message = f"{path}:{number}: timestamp {ts_text[:40]} ms is out of range"
            if not skip_bad:
                raise InputError(message) from None
            skipped.append(message)
            continue
        _add_dcgm_value(rows, labels, metric, value, ts, host or path.stem, "dcgm")
    return TelemetryFile(samples=_dcgm_frame(rows), rows_read=read, skipped=skipped)


def _add_dcgm_value(
    rows: dict,
    labels: dict,
    metric: str,
    value: float,
    ts: datetime,
    default_host: str,
    origin: str,
) -> None:
    host = (
        labels.get("Hostname") or labels.get("hostname") or labels.get("instance") or default_host
    )
    gpu = labels.get("gpu") or labels.get("UUID") or labels.get("uuid") or "0"
    key = (host, gpu, ts)
    row = rows.setdefault(
        key,
        {
            "host": host,
            "gpu": gpu,
            "ts": ts,
            "model": labels.get("modelName"),
            "uuid": labels.get("UUID") or labels.get("uuid"),
            "job_label": labels.get("hpc_job") or None,
            "pod": f"{labels['namespace']}/{labels['pod']}"
            if labels.get("pod") and labels.get("namespace")
            else labels.get("pod") or None,
            "origin": origin,
        },
    )
    if metric in DCGM_FIELDS:  # other DCGM fields still show the host was up
        column, scale = DCGM_FIELDS[metric]
        row[column] = value * scale


def _identifies_gpu(labels: dict) -> bool:
    return any(labels.get(k) for k in ("gpu", "UUID", "uuid"))


def _dcgm_frame(rows: dict) -> pl.DataFrame:
    records = []
    for row in rows.values():
        util = row.get("util_pct", row.get("engine_active_pct"))
        used, free = row.get("mem_used_mib"), row.get("mem_free_mib")
        total = row.get("mem_total_mib")
        records.append(
            {
                **{
                    k: row.get(k)
                    for k in ("host", "gpu", "ts", "model", "uuid", "job_label", "pod", "origin")
                },
                "util_pct": util,
                "mem_used_mib": used,
                "mem_total_mib": total
                if total is not None
                else (used + free if used is not None and free is not None else None),
                "power_w": row.get("power_w"),
            }
        )
    if not records:
        return pl.DataFrame(schema=SAMPLE_SCHEMA)
    return pl.DataFrame(records).select(list(SAMPLE_SCHEMA)).cast(SAMPLE_SCHEMA)


# -- Prometheus query_range JSON -----------------------------------------------------------
def _read_prometheus_json(path: Path, host: str | None) -> TelemetryFile:
    try:
        document = json.loads(_decoded(path))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON ({exc.msg})") from None
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, dict) or data.get("resultType") not in ("matrix", "vector"):
        raise InputError(
            f"{path}: expected a Prometheus query result with data.resultType matrix or vector"
        )
    rows: dict[tuple, dict] = {}
    read = 0
    for series in data.get("result", []):
        labels = series.get("metric", {})
        metric = labels.get("__name__", "")
        if not metric.startswith("DCGM_FI_") or not _identifies_gpu(labels):
            continue
        points = series.get("values") or ([series["value"]] if "value" in series else [])
        for point in points:
            read += 1
            try:
                ts = datetime.fromtimestamp(float(point[0]), UTC).replace(tzinfo=None)
                value = float(point[1])
            except (TypeError, ValueError, IndexError, OverflowError, OSError):
                raise InputError(f"{path}: series {metric}: bad point {str(point)[:60]}") from None
            _add_dcgm_value(rows, labels, metric, value, ts, host or path.stem, "prometheus")
    return TelemetryFile(samples=_dcgm_frame(rows), rows_read=read)

"""GPU telemetry files: nvidia-smi CSV, dcgm-exporter / Prometheus text, Prometheus JSON.

Everything becomes rows of ``gpu_samples`` (host, gpu, ts, util_pct, mem_used_mib, ...).
nvidia-smi files can be large (a week of 1,000 GPUs at 1 sample/min is 10M rows), so they
are parsed by polars in bulk, never line by line in Python.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import polars as pl

from audit.errors import InputError
from audit.importers import text
from audit.importers.text import describe

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
# What nvidia-smi writes for a value it cannot measure. It never writes an empty value: an
# empty measurement is a cut line; an empty name or uuid is just unknown.
_NOT_MEASURED = ["N/A", "[N/A]", "[Not Supported]", "[Unknown Error]", "[GPU is lost]"]
_MISSING = [*_NOT_MEASURED, ""]
_MEASURED = ("utilization.gpu", "memory.used", "memory.total", "power.draw", "power.draw.average")
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


# -- reading a file -------------------------------------------------------------------------
_TABLE_PRINTOUT = re.compile(r"^\|\s*NVIDIA-SMI\s+\d|^=+NVSMI LOG=+", re.MULTILINE)
QUERY_COMMAND = (
    "nvidia-smi --query-gpu=timestamp,index,uuid,name,utilization.gpu,memory.used,"
    "memory.total,power.draw --format=csv -l 60"
)


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
    encoding = text.sniff(path, head, "a telemetry text file")
    if encoding.startswith("utf-16"):
        head = head[: len(head) - len(head) % 2]
    head_text = head.decode(encoding, errors="replace").removeprefix("\ufeff")
    if not head_text.strip():
        raise InputError(
            f"{path}: empty file; expected nvidia-smi CSV, DCGM/Prometheus text or JSON"
        )
    if _TABLE_PRINTOUT.search(head_text):
        raise InputError(
            f"{path}: this is the nvidia-smi table printout, which cannot be read; "
            f"log CSV instead: {QUERY_COMMAND}"
        )
    stripped = head_text.lstrip()
    first_line = stripped.split("\n", 1)[0]
    if stripped.startswith("{"):
        return _read_prometheus_json(path, _whole_text(path, encoding), host, skip_bad)
    if stripped.startswith("#") or "DCGM_FI_" in first_line or _SERIES.match(first_line):
        return _read_exposition(path, _whole_text(path, encoding), host, skip_bad, at)
    with text.utf8_file(path, encoding) as data:
        return _read_nvidia_smi(_Source(path, data), tz, host or path.stem, fields, skip_bad)


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(65536)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def _whole_text(path: Path, encoding: str) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    return text.decode(path, raw, encoding).removeprefix("\ufeff")


@dataclass(frozen=True)
class _Source:
    path: Path  # what the user named: every message shows it
    data: Path  # what is read: the file, or its UTF-8 transcoding


# -- nvidia-smi ----------------------------------------------------------------------------
_TIME_FORMATS = (
    "%Y/%m/%d %H:%M:%S%.f",
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y/%m/%d %H:%M:%S",
    "%Y-%m-%d %H:%M:%S",
)
# Rows of one sample of a multi-GPU query are written milliseconds apart; samples are at
# least a second apart with -l, and -lms below 500 is too fine to tell samples apart.
_SAMPLE_GAP = timedelta(milliseconds=500)


def _read_nvidia_smi(
    src: _Source, tz: ZoneInfo, host: str, fields: list[str] | None, skip_bad: bool
) -> TelemetryFile:
    path = src.path
    first_line = _head(src.data).split(b"\n", 1)[0].decode("utf-8", "replace")
    first_line = first_line.removeprefix("\ufeff")
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
    if not any(n in names for n in ("utilization.gpu", "memory.used")):
        raise InputError(f"{path}: no utilization.gpu or memory.used column; nothing to measure")
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise InputError(f"{path}: column {duplicated[0]!r} appears twice")
    wanted = [n for n in names if n in ("timestamp", *_SMI_IDENTITY, *_SMI_COLUMNS)]
    notes: list[str] = []
    drop_last = _last_line_incomplete(src.data, names, wanted, first)
    if drop_last:
        notes.append(f"{path}: last line incomplete, skipped (a file still being written)")
    body = None if skip_bad else _fast_table(src.data, names, wanted, first, drop_last)
    samples = None if body is None else _samples(body, host, identity, tz)
    skipped: list[str] = []
    if samples is None or samples["bad"].any():
        # a malformed line somewhere: find it (or them) line by line
        body, skipped = _validated_table(src, names, wanted, first, skip_bad, drop_last, tz)
        samples = _samples(body, host, identity, tz)
    samples = samples.drop("bad").filter(pl.col("ts").is_not_null())
    if identity is None:
        samples, note = _gpus_by_position(samples, path, host)
        notes.append(note)
    return TelemetryFile(
        samples=samples, rows_read=body.height + len(skipped), skipped=skipped, notes=notes
    )


def _gpus_by_position(samples: pl.DataFrame, path: Path, host: str) -> tuple[pl.DataFrame, str]:
    """GPU identity for files without an index, uuid or pci.bus_id column.

    One row per sample: the file holds one GPU, index 0 of its host. Several rows per
    sample in a stable count (the last sample may be cut short): nvidia-smi lists the GPUs
    of a query in index order, so a row's position in its sample is the GPU's index.
    A sample is a run of rows less than half a second apart (one query writes its GPUs'
    rows milliseconds apart). Anything else cannot be told apart.
    """
    gap = pl.col("ts").diff().abs()
    framed = samples.with_columns(
        _sample=(gap.is_null() | (gap >= _SAMPLE_GAP)).cum_sum()
    ).with_columns(gpu=pl.int_range(pl.len()).over("_sample").cast(pl.String))
    sizes = framed.group_by("_sample", maintain_order=True).len()["len"]
    most = int(sizes.max() or 0)
    if most <= 1:
        return framed.drop("_sample"), (
            f"{path}: no index, uuid or pci.bus_id column and one row per timestamp: "
            f"read as one GPU (index 0 of host {host})"
        )
    if (sizes.head(sizes.len() - 1) == most).all():
        return framed.drop("_sample"), (
            f"{path}: no index, uuid or pci.bus_id column: each sample has {most} rows, "
            f"read as GPUs 0-{most - 1} of host {host} by their order in the sample"
        )
    raise InputError(
        f"{path}: cannot tell GPUs apart: samples hold {int(sizes.min())} to {most} rows "
        f"(up to {most} GPUs) and there is no index, uuid or pci.bus_id column; add index "
        f"to the query: {QUERY_COMMAND}"
    )


def _samples(body: pl.DataFrame, host: str, identity: str | None, tz: ZoneInfo) -> pl.DataFrame:
    """Typed samples in one pass over the strings, plus a flag for rows that cannot be a
    sample: text that is no number, or a value the one rule of VALID_RANGES refuses."""
    ts = pl.col("ts")
    if str(tz) != "UTC":
        ts = (
            ts.dt.replace_time_zone(str(tz), ambiguous="earliest", non_existent="null")
            .dt.convert_time_zone("UTC")
            .dt.replace_time_zone(None)
        )
    power = "power.draw" if "power.draw" in body.columns else "power.draw.average"
    measured = {
        "util_pct": "utilization.gpu",
        "mem_used_mib": "memory.used",
        "mem_total_mib": "memory.total",
        "power_w": power,
    }
    samples = (
        body.lazy()
        .select(
            host=pl.lit(host),
            gpu=pl.col(identity) if identity else pl.lit("0"),
            ts=ts,
            **{column: _plain_number(body, name) for column, name in measured.items()},
            model=_text(body, "name"),
            uuid=_text(body, "uuid"),
            job_label=pl.lit(None, dtype=pl.String),
            pod=pl.lit(None, dtype=pl.String),
            origin=pl.lit("nvidia-smi"),
        )
        .cast(SAMPLE_SCHEMA)
        .collect()
    )
    # A column where some value is no plain number (N/A, empty, or odd text) is read again
    # with the whole rule, which also says which rows cannot be read; so is power.draw.average
    # beside power.draw, which is not stored but must still be readable.
    again = [c for c, n in measured.items() if n in body.columns and samples[c].null_count()]
    unstored = [n for n in _MEASURED if n in body.columns and n not in measured.values()]
    if again or unstored:
        redone = body.select(
            *(_number(body, measured[c]).cast(SAMPLE_SCHEMA[c]).alias(c) for c in again),
            unparsable=_unparsable(body, [*(measured[c] for c in again), *unstored]),
        )
        samples = samples.with_columns(redone[c] for c in again)
        unparsable = redone["unparsable"]
    else:
        unparsable = pl.repeat(False, samples.height, eager=True)
    return samples.with_columns(
        bad=unparsable | ~pl.all_horizontal(valid_value(c) for c in VALID_RANGES)
    )


def _parsed_time(column: pl.Expr, sample: str | None) -> pl.Expr:
    """Parse with the one format the file uses (found on its first value); a year outside
    FIRST_YEAR-LAST_YEAR (strptime accepts a signed "-2026/...") is unparsable."""
    chosen = _TIME_FORMATS[0]
    for fmt in _TIME_FORMATS:
        if sample is not None and pl.select(_in_range(pl.lit(sample), fmt).is_not_null()).item():
            chosen = fmt
            break
    return _in_range(column, chosen)


# The years FIRST_YEAR-LAST_YEAR as instants: comparing a parsed time with them is a third
# of the cost of taking its year.
_FIRST_INSTANT = datetime(FIRST_YEAR, 1, 1)
_PAST_LAST_INSTANT = datetime(LAST_YEAR + 1, 1, 1)


def valid_time(column: str | pl.Expr) -> pl.Expr:
    """A time within FIRST_YEAR-LAST_YEAR, for a column of times already parsed."""
    ts = pl.col(column) if isinstance(column, str) else column
    return (ts >= _FIRST_INSTANT) & (ts < _PAST_LAST_INSTANT)


def _in_range(column: pl.Expr, fmt: str) -> pl.Expr:
    ts = column.str.strptime(pl.Datetime("us"), fmt, strict=False)
    return pl.when(valid_time(ts)).then(ts)


def _timestamp_problem(raw: str | None) -> str:
    for fmt in _TIME_FORMATS:
        parsed = pl.lit(raw, dtype=pl.String).str.strptime(pl.Datetime("us"), fmt, strict=False)
        year = pl.select(parsed.dt.year()).item()  # the year alone: -2026 is no datetime
        if year is not None and not FIRST_YEAR <= year <= LAST_YEAR:
            return f"timestamp: {str(raw)[:40]!r} is outside the years {FIRST_YEAR}-{LAST_YEAR}"
    return f"timestamp: expected 2024/03/15 13:57:59.791, got {str(raw)[:40]!r}"


def _fast_table(
    data: Path, names: list[str], wanted: list[str], first: int, drop_last: bool
) -> pl.DataFrame | None:
    """The whole file through polars' CSV reader; None when any line looks malformed."""
    try:
        raw = pl.read_csv(
            data,
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
    if drop_last:
        raw = raw.head(raw.height - 1)
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


def _read_lines(src: _Source) -> pl.Series:
    try:
        return pl.read_csv(
            src.data,
            has_header=False,
            separator="\x1f",
            quote_char=None,
            new_columns=["line"],
            infer_schema=False,
            encoding="utf8",
            truncate_ragged_lines=True,
        )["line"]
    except pl.exceptions.ComputeError as exc:
        _whole_text(src.data, text.UTF8)  # names the line of an encoding error
        raise InputError(f"{src.path}: cannot read as text ({str(exc).splitlines()[0]})") from None


def _line_problems(
    body: pl.DataFrame, names: list[str], wanted: list[str], tz: ZoneInfo
) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    """Split ``body`` (line_no, line) into its fields. Returns the split body, the rows
    that cannot be a sample, and what is wrong with the first 1000 of them."""
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
    typed = _samples(body, "", None, tz).select(*VALID_RANGES)
    checks = pl.concat(
        [
            body.select("line_no", "line", "n", "timestamp", "ts", unparsable=_unparsable(body)),
            typed,
        ],
        how="horizontal",
    ).with_columns(invalid=~pl.all_horizontal(valid_value(c) for c in VALID_RANGES))
    problems = checks.filter(
        (pl.col("n") != len(names))
        | pl.col("ts").is_null()
        | pl.col("unparsable")
        | pl.col("invalid")
    )
    messages = []
    for row in problems.head(1000).iter_rows(named=True):
        if row["n"] != len(names):
            problem = f"expected {len(names)} comma-separated values, found {row['n']}"
        elif row["ts"] is None:
            problem = _timestamp_problem(row["timestamp"])
        elif row["unparsable"]:
            problem = f"expected numbers in utilization/memory columns, got {row['line'][:80]!r}"
        else:
            problem = next(
                p for c in VALID_RANGES if row[c] is not None and (p := value_problem(c, row[c]))
            )
        messages.append(f"{row['line_no']}: {problem}")
    return body, problems.select("line_no"), messages


def _validated_table(
    src: _Source,
    names: list[str],
    wanted: list[str],
    first: int,
    skip_bad: bool,
    drop_last: bool,
    tz: ZoneInfo,
) -> tuple[pl.DataFrame, list[str]]:
    lines = _read_lines(src)
    body = lines.slice(first).to_frame().with_row_index("line_no", offset=first + 1)
    if drop_last:
        body = body.head(body.height - 1)
    body = body.filter(pl.col("line").str.strip_chars() != "")
    body, problems, found = _line_problems(body, names, wanted, tz)
    messages = [f"{src.path}:{message}" for message in found]
    if messages and not skip_bad:
        raise InputError(messages[0])
    if problems.height > 1000:
        messages.append(f"{src.path}: ... and {problems.height - 1000} more bad lines")
    return body.join(problems, on="line_no", how="anti"), messages


def _last_line_incomplete(data: Path, names: list[str], wanted: list[str], first: int) -> bool:
    """A last line without a newline that is not a whole row: nvidia-smi ends every row
    with a newline and never writes an empty value, so the writer was cut off mid-row."""
    found = text.unterminated_last_line(data)
    if found is None or not found[0].strip() or (first and found[1]):
        return False  # ends with a newline, a blank line, or the header is the only line
    last = found[0]
    if any(not value.strip() for value in last.split(",")):
        return True
    body = pl.DataFrame(
        {"line_no": [0], "line": [last]}, schema={"line_no": pl.UInt32, "line": pl.String}
    )
    _, problems, _ = _line_problems(body, names, wanted, ZoneInfo("UTC"))
    return problems.height > 0


def _unparsable(body: pl.DataFrame, names: Iterable[str] = _MEASURED) -> pl.Expr:
    """True where a measured column is empty or holds text that is neither a number nor N/A."""
    checks = [
        pl.col(n).is_null() | (~pl.col(n).is_in(_NOT_MEASURED) & _numeric(pl.col(n)).is_null())
        for n in names
        if n in body.columns
    ]
    return pl.any_horizontal(checks) if checks else pl.lit(False)


def _numeric(column: pl.Expr) -> pl.Expr:
    """'95 %', '7650 MiB', '70.89 W' or plain numbers -> float; anything else -> null."""
    return column.str.strip_chars_end(" %MiBW").cast(pl.Float32, strict=False)


# The unit nvidia-smi writes after each measured value (none with --format=csv,nounits).
_UNITS = {
    "utilization.gpu": " %",
    "memory.used": " MiB",
    "memory.total": " MiB",
    "power.draw": " W",
    "power.draw.average": " W",
}


def _plain_number(body: pl.DataFrame, name: str) -> pl.Expr:
    """A number with or without its one unit -> float, else null: where not null, the same
    float as ``_numeric`` (no text a float cast accepts ends in one of " %MiBW"), for 60 %
    of the cost of stripping a set of characters."""
    if name not in body.columns:
        return pl.lit(None, dtype=pl.Float32)
    return pl.col(name).str.strip_suffix(_UNITS[name]).cast(pl.Float32, strict=False)


def _number(body: pl.DataFrame, name: str) -> pl.Expr:
    if name not in body.columns:
        return pl.lit(None, dtype=pl.Float32)
    return pl.when(pl.col(name).is_in(_NOT_MEASURED)).then(None).otherwise(_numeric(pl.col(name)))


def _text(body: pl.DataFrame, name: str) -> pl.Expr:
    if name not in body.columns:
        return pl.lit(None, dtype=pl.String)
    return pl.when(pl.col(name).is_in(_MISSING)).then(None).otherwise(pl.col(name))


def _column_name(raw: str) -> str:
    """'utilization.gpu [%]' -> 'utilization.gpu'."""
    return raw.strip().split(" [", 1)[0].strip().lower()


# -- Prometheus text exposition (dcgm-exporter) ----------------------------------------------
def _read_exposition(
    path: Path, content: str, host: str | None, skip_bad: bool, at: datetime | None
) -> TelemetryFile:
    default_ts = at or datetime.fromtimestamp(os.path.getmtime(path), UTC).replace(tzinfo=None)
    rows: dict[tuple, dict] = {}
    skipped: list[str] = []
    notes: list[str] = []
    read = 0
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
            metric, labels, value, ts = sample
            _add_dcgm_value(rows, labels, metric, value, ts, host or path.stem, "dcgm")
    return TelemetryFile(samples=_dcgm_frame(rows), rows_read=read, skipped=skipped, notes=notes)


def read_exposition_text(label: str, content: str, host: str | None, at: datetime) -> TelemetryFile:
    """A dcgm-exporter ``/metrics`` answer scraped at ``at`` (``label``: its URL)."""
    return _read_exposition(Path(label), content, host, False, at)


def _exposition_sample(line: str, default_ts: datetime) -> tuple | None:
    """(metric, labels, value, ts) of a DCGM series line; None for other series; ValueError
    saying what is wrong with a line that cannot be read."""
    match = _SERIES.match(line)
    if not match:
        raise ValueError(f"expected 'METRIC{{labels}} value [timestamp_ms]', got {line[:80]!r}")
    metric, _, labels_text, value_text, ts_text = match.groups()
    labels = dict(_LABEL.findall(labels_text or ""))
    if not metric.startswith("DCGM_FI_") or not _identifies_gpu(labels):
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
    return metric, labels, value, ts


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
_PROMETHEUS_SHAPE = (
    "expected a Prometheus query result "
    '({"data": {"resultType": "matrix", "result": [{"metric": {...}, "values": [[time, "value"], ...]}]}})'
)


def _read_prometheus_json(
    path: Path, content: str, host: str | None, skip_bad: bool = False
) -> TelemetryFile:
    document = text.load_json(path, content)
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
        if not metric.startswith("DCGM_FI_") or not _identifies_gpu(labels):
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
            _add_dcgm_value(rows, labels, metric, value, ts, host or path.stem, "prometheus")
    return TelemetryFile(samples=_dcgm_frame(rows), rows_read=read, skipped=skipped)


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

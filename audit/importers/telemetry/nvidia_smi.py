"""nvidia-smi ``--query-gpu`` CSV, parsed by polars in bulk (a week of 1,000 GPUs at one
sample a minute is 10 M rows), never line by line in Python; only when the bulk parse finds
a malformed line, or with ``--skip-bad``, is the file checked line by line to name each bad
line."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import polars as pl

from audit.errors import InputError
from audit.importers import text
from audit.importers.telemetry.file_text import head_bytes, whole_text
from audit.importers.telemetry.samples import (
    FIRST_YEAR,
    LAST_YEAR,
    SAMPLE_SCHEMA,
    VALID_RANGES,
    TelemetryFile,
    valid_time,
    valid_value,
    value_problem,
)

QUERY_COMMAND = (
    "nvidia-smi --query-gpu=timestamp,index,uuid,name,utilization.gpu,memory.used,"
    "memory.total,power.draw --format=csv -l 60"
)
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


@dataclass(frozen=True)
class SmiSource:
    path: Path  # what the user named: every message shows it
    data: Path  # what is read: the file, or its UTF-8 transcoding


_TIME_FORMATS = (
    "%Y/%m/%d %H:%M:%S%.f",
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y/%m/%d %H:%M:%S",
    "%Y-%m-%d %H:%M:%S",
)
# Rows of one sample of a multi-GPU query are written milliseconds apart; samples are at
# least a second apart with -l, and -lms below 500 is too fine to tell samples apart.
_SAMPLE_GAP = timedelta(milliseconds=500)


def read_nvidia_smi(
    src: SmiSource, tz: ZoneInfo, host: str, fields: list[str] | None, skip_bad: bool
) -> TelemetryFile:
    path = src.path
    first_line = head_bytes(src.data).split(b"\n", 1)[0].decode("utf-8", "replace")
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


def _read_lines(src: SmiSource) -> pl.Series:
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
        whole_text(src.data, text.UTF8)  # names the line of an encoding error
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
    src: SmiSource,
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

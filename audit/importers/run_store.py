"""The one run model: what every tracker importer (MLflow, W&B, trainer logs, TensorBoard)
hands the warehouse, and the code that writes it.

Readers produce polars frames with the fixed columns below (times as epoch milliseconds);
``write_batch`` normalises params, derives latest metrics and inserts a batch into
``params``, ``tags``, ``metrics``, ``latest_metrics`` and ``dataset_inputs``. Runs of every
tracker land in the same tables, each with the ``source_id`` of where it came from. Every
time passes ``epoch_ms_to_datetime`` on its way in: epoch milliseconds between the years
1970 and 2200 (the rule telemetry samples keep to), else the import is refused with the
source, the run and the field. Every text passes ``audit.redact`` on its way in: e-mail
addresses and credentials are never stored, whichever tracker they came from.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime

import polars as pl

from audit.errors import InputError
from audit.importers.numbers import END_MS, FIRST_MS
from audit.importers.params import normalised_params
from audit.importers.telemetry import FIRST_YEAR, LAST_YEAR
from audit.redact import redact_frame, redact_keys
from audit.warehouse.frames import execute_on_frame, insert_frame

# Every tracker's times keep to the years telemetry samples keep to: a run from year 1019
# (a start computed from a runtime of 3e10 s) or to year 5138 is damage, and would be
# priced as centuries of GPU time.
EPOCH_MS_MIN, EPOCH_MS_MAX = FIRST_MS, END_MS - 1

EXPERIMENT_SCHEMA = {
    "experiment_id": pl.String,
    "name": pl.String,
    "artifact_location": pl.String,
    "lifecycle_stage": pl.String,
    "creation_time": pl.Int64,  # epoch milliseconds
    "last_update_time": pl.Int64,
}
RUN_SCHEMA = {
    "run_id": pl.String,
    "experiment_id": pl.String,
    "name": pl.String,
    "user_id": pl.String,
    "status": pl.String,
    "start_time": pl.Int64,
    "end_time": pl.Int64,
    "lifecycle_stage": pl.String,
    "deleted_time": pl.Int64,
    "artifact_uri": pl.String,
    "source_name": pl.String,
    "source_type": pl.String,
    "source_commit": pl.String,
    "signature": pl.String,
}
PARAM_SCHEMA = {"run_id": pl.String, "key": pl.String, "value": pl.String}
TAG_SCHEMA = {"run_id": pl.String, "key": pl.String, "value": pl.String}
METRIC_SCHEMA = {
    "run_id": pl.String,
    "key": pl.String,
    "value": pl.Float64,
    "step": pl.Int64,
    "timestamp": pl.Int64,
}
DATASET_SCHEMA = {
    "run_id": pl.String,
    "name": pl.String,
    "digest": pl.String,
    "source_type": pl.String,
    "source": pl.String,
    "context": pl.String,
}


@dataclass
class DetailBatch:
    """Params, tags, metric history, latest metrics and dataset inputs for some runs."""

    run_count: int
    params: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=PARAM_SCHEMA))
    tags: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=TAG_SCHEMA))
    metrics: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=METRIC_SCHEMA))
    latest_metrics: pl.DataFrame | None = None  # derived from metrics when None
    datasets: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=DATASET_SCHEMA))


def stable_hash(*parts: object) -> str:
    digest = hashlib.sha1()
    for part in parts:
        digest.update(repr(part).encode("utf-8", "surrogateescape"))
        digest.update(b"\x1f")
    return digest.hexdigest()[:16]


def frame(rows: list[tuple] | list[dict], schema: dict) -> pl.DataFrame:
    """Rows (tuples in schema order, or dicts) to a typed frame."""
    if not rows:
        return pl.DataFrame(schema=schema)
    orient = "row" if isinstance(rows[0], tuple | list) else None
    return pl.DataFrame(rows, schema=schema, orient=orient)


def latest_from_history(metrics: pl.DataFrame) -> pl.DataFrame:
    """MLflow's rule for the latest value: highest step, then latest timestamp, then max value."""
    if metrics.is_empty():
        return metrics
    return (
        metrics.sort(["run_id", "key", "step", "timestamp", "value"], nulls_last=False)
        .group_by(["run_id", "key"], maintain_order=True)
        .last()
    )


# A number that is a time of this century in micro- or nanoseconds: said so in a refusal
# (one that is a time only in the sense of lying between 1970 and 2200 is not).
_PLAUSIBLE_UNITS_FROM = int(datetime(2000, 1, 1, tzinfo=UTC).timestamp() * 1000)


def check_epoch_ms(number: int, where: object, field: str) -> None:
    if EPOCH_MS_MIN <= number <= EPOCH_MS_MAX:
        return
    hint = ""
    for unit, factor in (("microseconds", 1_000), ("nanoseconds", 1_000_000)):
        if _PLAUSIBLE_UNITS_FROM <= number / factor <= EPOCH_MS_MAX:
            hint = f" (it looks like {unit})"
            break
    raise InputError(
        f"{where}: {field} {number} is not a time in epoch milliseconds between years "
        f"{FIRST_YEAR} and {LAST_YEAR}{hint}"
    )


def epoch_ms_to_datetime(
    frame: pl.DataFrame, columns: list[str], what: str, id_column: str, location: str
) -> pl.DataFrame:
    """Epoch-millisecond columns as timestamps, after checking each is between the years
    1970 and 2200: the one gate every tracker's times pass on the way to the warehouse."""
    for column in columns:
        values = pl.col(column)
        bad = frame.filter(values.is_not_null() & ~values.is_between(EPOCH_MS_MIN, EPOCH_MS_MAX))
        if bad.height:
            row = bad.row(0, named=True)
            check_epoch_ms(row[column], f"{location}: {what} {row[id_column]}", column)
    return frame.with_columns(**{c: pl.from_epoch(pl.col(c), time_unit="ms") for c in columns})


def write_batch(con, batch: DetailBatch, source_id: str, location: str) -> None:
    """Insert one batch of run details (params normalised, latest metrics derived if absent)."""
    latest = (
        batch.latest_metrics
        if batch.latest_metrics is not None
        else latest_from_history(batch.metrics)
    )
    source = pl.lit(source_id)
    params = redact_frame(redact_keys(batch.params, "key"), ["value"], keyed=("key", "value"))
    tags = redact_frame(redact_keys(batch.tags, "key"), ["value"], keyed=("key", "value"))
    datasets = redact_frame(batch.datasets, ["name", "source", "context"])
    insert_frame(con, "params", normalised_params(params).with_columns(source_id=source))
    insert_frame(con, "tags", tags.with_columns(source_id=source))
    insert_frame(con, "metrics", metric_frame(batch.metrics, source_id, location))
    insert_frame(con, "latest_metrics", metric_frame(latest, source_id, location))
    insert_frame(con, "dataset_inputs", datasets.with_columns(source_id=source))


def upsert_source(con, source_id: str, kind: str, location: str, now: datetime) -> None:
    exists = con.execute("SELECT 1 FROM sources WHERE source_id = ?", [source_id]).fetchall()
    if exists:
        con.execute("UPDATE sources SET last_imported_at = ? WHERE source_id = ?", [now, source_id])
    else:
        con.execute(
            "INSERT INTO sources VALUES (?, ?, ?, ?, ?)", [source_id, kind, location, now, now]
        )


def replace_experiments(con, source_id: str, experiments: pl.DataFrame, location: str) -> None:
    frame = epoch_ms_to_datetime(
        redact_frame(experiments, ["name", "artifact_location"]),
        ["creation_time", "last_update_time"],
        "experiment",
        "experiment_id",
        location,
    ).with_columns(source_id=pl.lit(source_id))
    execute_on_frame(
        con,
        "DELETE FROM experiments t WHERE EXISTS (SELECT 1 FROM incoming_frame k "
        "WHERE k.source_id = t.source_id AND k.experiment_id = t.experiment_id)",
        frame.select("source_id", "experiment_id"),
    )
    insert_frame(con, "experiments", frame)


def runs_frame(runs: pl.DataFrame, source_id: str, now: datetime, location: str) -> pl.DataFrame:
    runs = redact_frame(
        runs, ["name", "source_name", "artifact_uri", "signature"], users=["user_id"]
    )
    return epoch_ms_to_datetime(
        runs, ["start_time", "end_time", "deleted_time"], "run", "run_id", location
    ).with_columns(source_id=pl.lit(source_id), imported_at=pl.lit(now))


def metric_frame(metrics: pl.DataFrame, source_id: str, location: str) -> pl.DataFrame:
    metrics = redact_keys(metrics, "key")
    checked = epoch_ms_to_datetime(metrics, ["timestamp"], "metric of run", "run_id", location)
    return checked.with_columns(
        source_id=pl.lit(source_id),
        value=pl.col("value").fill_null(float("nan")),  # MLflow stores NaN as NULL + is_nan
    ).rename({"timestamp": "ts"})

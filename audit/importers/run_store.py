"""The one run model: what every tracker importer (MLflow, W&B, trainer logs, TensorBoard)
hands the warehouse, and the code that writes it.

Readers produce polars frames with the fixed columns below (times as epoch milliseconds);
``write_batch`` normalises params, derives latest metrics and inserts a batch into
``params``, ``tags``, ``metrics``, ``latest_metrics`` and ``dataset_inputs``. Runs of every
tracker land in the same tables, each with the ``source_id`` of where it came from.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime

import polars as pl

from audit.importers.files import insert_frame
from audit.importers.params import normalised_params

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


def write_batch(con, batch: DetailBatch, source_id: str) -> None:
    """Insert one batch of run details (params normalised, latest metrics derived if absent)."""
    latest = (
        batch.latest_metrics
        if batch.latest_metrics is not None
        else latest_from_history(batch.metrics)
    )
    source = pl.lit(source_id)
    insert_frame(con, "params", normalised_params(batch.params).with_columns(source_id=source))
    insert_frame(con, "tags", batch.tags.with_columns(source_id=source))
    insert_frame(con, "metrics", metric_frame(batch.metrics, source_id))
    insert_frame(con, "latest_metrics", metric_frame(latest, source_id))
    insert_frame(con, "dataset_inputs", batch.datasets.with_columns(source_id=source))


def upsert_source(con, source_id: str, kind: str, location: str, now: datetime) -> None:
    exists = con.execute("SELECT 1 FROM sources WHERE source_id = ?", [source_id]).fetchall()
    if exists:
        con.execute("UPDATE sources SET last_imported_at = ? WHERE source_id = ?", [now, source_id])
    else:
        con.execute(
            "INSERT INTO sources VALUES (?, ?, ?, ?, ?)", [source_id, kind, location, now, now]
        )


def replace_experiments(con, source_id: str, experiments: pl.DataFrame) -> None:
    frame = experiments.with_columns(
        source_id=pl.lit(source_id),
        creation_time=pl.from_epoch(pl.col("creation_time"), time_unit="ms"),
        last_update_time=pl.from_epoch(pl.col("last_update_time"), time_unit="ms"),
    )
    con.register("incoming_experiments", frame)
    con.execute(
        "DELETE FROM experiments WHERE source_id = ? AND experiment_id IN "
        "(SELECT experiment_id FROM incoming_experiments)",
        [source_id],
    )
    con.unregister("incoming_experiments")
    insert_frame(con, "experiments", frame)


def runs_frame(runs: pl.DataFrame, source_id: str, now: datetime) -> pl.DataFrame:
    return runs.with_columns(
        source_id=pl.lit(source_id),
        imported_at=pl.lit(now),
        **{
            c: pl.from_epoch(pl.col(c), time_unit="ms")
            for c in ("start_time", "end_time", "deleted_time")
        },
    )


def metric_frame(metrics: pl.DataFrame, source_id: str) -> pl.DataFrame:
    return metrics.with_columns(
        source_id=pl.lit(source_id),
        value=pl.col("value").fill_null(float("nan")),  # MLflow stores NaN as NULL + is_nan
        ts=pl.from_epoch(pl.col("timestamp"), time_unit="ms"),
    ).drop("timestamp")

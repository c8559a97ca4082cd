"""What every MLflow reader hands to the loader: polars frames with fixed columns."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import polars as pl

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
MODEL_VERSION_SCHEMA = {
    "name": pl.String,
    "version": pl.String,
    "run_id": pl.String,
    "source": pl.String,
    "status": pl.String,
    "current_stage": pl.String,
    "creation_time": pl.Int64,
}

# MLflow's numeric enums, as the file store writes them.
RUN_STATUS_BY_NUMBER = {1: "RUNNING", 2: "SCHEDULED", 3: "FINISHED", 4: "FAILED", 5: "KILLED"}
SOURCE_TYPE_BY_NUMBER = {
    1: "NOTEBOOK",
    2: "JOB",
    3: "PROJECT",
    4: "LOCAL",
    5: "UNKNOWN",
    6: "RECIPE",
}
GIT_COMMIT_TAG = "mlflow.source.git.commit"
RUN_NAME_TAG = "mlflow.runName"


@dataclass
class DetailBatch:
    """Params, tags, metric history, latest metrics and dataset inputs for some runs."""

    run_count: int
    params: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=PARAM_SCHEMA))
    tags: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=TAG_SCHEMA))
    metrics: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=METRIC_SCHEMA))
    latest_metrics: pl.DataFrame | None = None  # derived from metrics when None
    datasets: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=DATASET_SCHEMA))


class MlflowReader(Protocol):
    """A source of MLflow history. ``location`` never contains credentials."""

    kind: str
    location: str

    def experiments(self) -> pl.DataFrame: ...

    def runs(self, experiment_ids: list[str]) -> pl.DataFrame: ...

    def details(self, run_ids: list[str]) -> Iterator[DetailBatch]: ...

    def model_versions(self) -> pl.DataFrame: ...

    def close(self) -> None: ...


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

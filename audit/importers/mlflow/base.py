"""What every MLflow reader hands to the loader: the run model's frames, plus MLflow's own
enums and the model registry."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import polars as pl

from audit.importers.run_store import DetailBatch

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


class MlflowReader(Protocol):
    """A source of MLflow history. ``location`` never contains credentials."""

    kind: str
    location: str

    def experiments(self) -> pl.DataFrame: ...

    def runs(self, experiment_ids: list[str]) -> pl.DataFrame: ...

    def details(self, run_ids: list[str]) -> Iterator[DetailBatch]: ...

    def model_versions(self) -> pl.DataFrame: ...

    def close(self) -> None: ...


def to_int(value) -> int | None:
    """MLflow writes epoch milliseconds as numbers or strings; anything else is unknown."""
    if value in (None, ""):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None

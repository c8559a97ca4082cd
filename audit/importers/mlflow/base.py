"""What every MLflow reader hands to the loader: the run model's frames, plus MLflow's own
enums and the model registry."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class KnownRuns:
    """What the warehouse holds of a source's runs, for a reader that can prove runs
    unchanged without computing their signatures in the store (the SQL store reader)."""

    # run_id, signature, name, source_commit, user_id, artifact_uri, source_name and
    # source_type as last imported
    signatures: pl.DataFrame
    # (table, aggregate expressions over its rows aliased x, run ids) -> the aggregates
    # over the warehouse's rows of the source's runs except those, as integers
    totals: Callable[[str, tuple[str, ...], pl.Series], tuple[int, ...]]


class MlflowReader(Protocol):
    """A source of MLflow history. ``location`` never contains credentials."""

    kind: str
    location: str

    def experiments(self) -> pl.DataFrame: ...

    def runs(self, experiment_ids: list[str], known: KnownRuns | None = None) -> pl.DataFrame:
        """Every run with its change signature; ``known`` may spare a reader work."""
        ...

    def details(self, run_ids: list[str]) -> Iterator[DetailBatch]: ...

    def model_versions(self) -> pl.DataFrame: ...

    def close(self) -> None: ...

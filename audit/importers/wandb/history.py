"""A run's history points kept as columns, compacted into polars chunks as they come, so
millions of points cost columns of memory, not a dict per row."""

from __future__ import annotations

import polars as pl

from audit.importers.run_files import POINT_SCHEMA

_POINTS_PER_CHUNK = 250_000
# W&B's own history keys: step, time and runtime of a row, not metrics
HIDDEN_HISTORY = {"_step", "_timestamp", "_runtime"}


class History:
    """History points as columns, compacted into polars chunks as they come."""

    def __init__(self) -> None:
        self.chunks: list[pl.DataFrame] = []
        self.keys: list[str] = []
        self.values: list[str] = []
        self.steps: list[int | None] = []
        self.times: list[int | None] = []
        self.interned: dict[str, str] = {}

    def add_row(self, keys: list[str], values: list[str], step, ms) -> None:
        n = len(keys)
        self.keys.extend(keys)
        self.values.extend(values)
        self.steps.extend([step] * n)
        self.times.extend([ms] * n)
        if len(self.keys) >= _POINTS_PER_CHUNK:
            self.compact()

    def compact(self) -> None:
        if not self.keys:
            return
        chunk = pl.DataFrame(
            {"key": self.keys, "raw": self.values, "step": self.steps, "timestamp": self.times},
            schema={
                "key": pl.String,
                "raw": pl.String,
                "step": pl.Int64,
                "timestamp": pl.Int64,
            },
        )
        # JSON numbers (NaN, Infinity included) become floats, booleans 1/0; text, lists and
        # media (tables, images) are not metrics and are left out.
        value = (
            pl.when(pl.col("raw") == "true")
            .then(1.0)
            .when(pl.col("raw") == "false")
            .then(0.0)
            .otherwise(pl.col("raw").cast(pl.Float64, strict=False))
        )
        self.chunks.append(
            chunk.with_columns(value=value)
            .filter(pl.col("value").is_not_null())
            .select("key", "value", "step", "timestamp")
        )
        self.keys, self.values, self.steps, self.times = [], [], [], []

    def frame(self) -> pl.DataFrame:
        self.compact()
        if not self.chunks:
            return pl.DataFrame(schema=POINT_SCHEMA)
        return pl.concat(self.chunks).with_columns(pl.col("key").cast(pl.String))

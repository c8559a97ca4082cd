"""Which of several records of one job is the newer: the merge of overlapping ``sacct``
exports (and the controller's live view) that never makes the warehouse older."""

from __future__ import annotations

from datetime import datetime

import polars as pl

from audit.importers.slurm.jobs import JOB_SCHEMA, TERMINAL_STATES


def _moment() -> pl.Expr:
    """The latest moment a job record describes."""
    return pl.coalesce(
        pl.col("end_time"),
        pl.col("start_time") + pl.duration(seconds=pl.col("elapsed_s")),
        pl.col("start_time"),
        pl.col("eligible_time"),
        pl.col("submit_time"),
    )


# what tells records apart: not where or when they were imported
_COMPARED = [c for c in JOB_SCHEMA if c != "source_file"]


def newest_records(jobs: pl.DataFrame, stored: pl.DataFrame | None = None) -> pl.DataFrame:
    """Of several records of one job, the newer: the one describing the later moment
    (End, else Start + elapsed, Start, Eligible, Submit); at the same moment a finished
    state beats an unfinished one, then the record with more fields filled (a later export
    adds jobstats' AdminComment), then a fixed order of the values, so that no result
    depends on the order of imports. ``stored`` rows are the warehouse's: an incoming
    record replaces one only when it is not older, so re-importing old files, in any
    order, never makes the warehouse older. Returns the rows of ``jobs`` to write."""
    keyed = jobs.with_columns(_stored=pl.lit(False), _order=pl.int_range(pl.len()))
    if stored is not None and stored.height:
        keyed = pl.concat(
            [
                keyed,
                stored.select(*(c for c in keyed.columns if c in stored.columns)).with_columns(
                    _stored=pl.lit(True), _order=pl.lit(-1, dtype=pl.Int64)
                ),
            ],
            how="diagonal_relaxed",
        )
    ranked = keyed.with_columns(
        _moment=_moment().fill_null(datetime(1, 1, 1)),
        _final=pl.col("state").is_in(list(TERMINAL_STATES)).fill_null(False),
        _filled=pl.sum_horizontal(pl.col(c).is_not_null() for c in _COMPARED),
        _values=pl.concat_str([pl.col(c).cast(pl.String) for c in _COMPARED], ignore_nulls=True),
    ).sort(["_moment", "_final", "_filled", "_values", "_order"])
    newest = ranked.unique(["cluster", "job_id"], keep="last", maintain_order=True)
    return (
        newest.filter(~pl.col("_stored"))
        .sort("_order")
        .select(jobs.columns)
        .cast(dict(jobs.schema))
    )

"""A run's change signature, computed inside the store: the SQL of its parts (counts and
sums over the run's params, tags and latest metrics) and the frame that assembles them
with the run's own row, name and commit."""

from __future__ import annotations

import polars as pl

from audit.importers.run_store import RUN_SCHEMA

# Per-run change detector computed inside the store: anything MLflow lets a client change
# on a run (status, end, lifecycle, name, new params/tags/metric points) moves one of these.
# A run's change signature: counts and sums over its params, tags and latest metrics. Three
# grouped queries on separate connections run side by side (one joined query takes 2.3 s at
# 100k runs in SQLite, the three in parallel 0.6 s). Per part: table, aggregates, names.
# Tag lengths are in bytes, as in the whole-store totals below: counted in characters, a tag
# rewritten to as many bytes in fewer characters moved the signature but not the totals,
# and the proof called its run unchanged.
SIGNATURE_PARTS = {
    "p": ("params", "count(*)", ("n",)),
    "t": ("tags", "count(*), CAST(sum({tag_length}) AS BIGINT)", ("n", "len")),
    "m": (
        "latest_metrics",
        "count(*), max(x.timestamp), CAST(sum(x.step) AS BIGINT)",
        ("n", "ts", "steps"),
    ),
}


# A text's length in bytes, per dialect: the stores' and the warehouse's (DuckDB). SQLite's
# length() of a text counts characters and stops at a NUL.
BYTE_LENGTH = {
    "sqlite": "length(CAST({} AS BLOB))",
    "postgres": "octet_length({})",
    "duckdb": "strlen({})",
}


def tag_length(byte_length: str) -> str:
    """A tag's key and value length in bytes (rows aliased x; ``byte_length`` formats one)."""
    value = "coalesce(x.value, '')"
    return f"({byte_length.format('x.key')} + {byte_length.format(value)})"


def signature_sql(
    name: str, byte_length: str, table: str | None = None, only: str | None = None
) -> str:
    """The per-run query of one signature part, over every run or only those in ``only``
    (a temporary table of run ids)."""
    default_table, aggregates, _ = SIGNATURE_PARTS[name]
    aggregates = aggregates.format(tag_length=tag_length(byte_length))
    return (
        f"SELECT x.run_uuid, {aggregates} FROM {rows_of(table or default_table, only)} "
        "GROUP BY x.run_uuid"
    )


def rows_of(table: str, only: str | None) -> str:
    """``table`` aliased x, restricted to the runs in the temporary table ``only``. SQLite
    keeps the order of a CROSS JOIN: the few wanted ids drive lookups in the table's run
    index (left to itself it scans the whole index and probes the ids: 0.6 s at 1.5M params)."""
    if only is None:
        return f"{table} x"
    return f"{only} w CROSS JOIN {table} x ON x.run_uuid = w.run_uuid"


SPECIAL_TAGS = "('mlflow.source.git.commit', 'mlflow.runName')"


def signatures_of(frames: dict[str, pl.DataFrame]) -> pl.DataFrame:
    joined = None
    for name in SIGNATURE_PARTS:
        part = frames[name]
        joined = (
            part if joined is None else joined.join(part, on="run_id", how="full", coalesce=True)
        )
    counts = [f"{name}_{c}" for name, (_, _, cols) in SIGNATURE_PARTS.items() for c in cols]
    return joined.select(
        "run_id",
        sig=pl.concat_str([pl.col(c).fill_null(0).cast(pl.String) for c in counts], separator=":"),
    )


def run_part() -> pl.Expr:
    """The part of a signature taken from the run's own row (the rest sums its details)."""
    return pl.concat_str(
        [
            pl.col(c).cast(pl.String).fill_null("")
            for c in ("status", "end_time", "lifecycle_stage", "deleted_time", "name")
        ],
        separator="|",
    )


NO_DETAILS_SIGNATURE = ":".join("0" for _, _, cols in SIGNATURE_PARTS.values() for _ in cols)


def with_signatures(runs: pl.DataFrame, frames: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """``runs`` with their change signatures, names and commits, from the frames of the
    signature queries (``special_tags`` and one per part)."""
    special_tags = frames["special_tags"]
    commits = special_tags.filter(pl.col("key") == "mlflow.source.git.commit").select(
        "run_id", tag_commit="value"
    )
    names = special_tags.filter(pl.col("key") == "mlflow.runName").select(
        "run_id", tag_name="value"
    )
    return (
        runs.join(signatures_of(frames), on="run_id", how="left")
        .with_columns(pl.col("sig").fill_null(NO_DETAILS_SIGNATURE))
        .join(commits.unique("run_id"), on="run_id", how="left")
        .join(names.unique("run_id"), on="run_id", how="left")
        .with_columns(
            signature=pl.concat_str([run_part(), pl.col("sig")], separator="|"),
            source_commit=pl.when(pl.col("source_commit").fill_null("") != "")
            .then(pl.col("source_commit"))
            .otherwise(pl.col("tag_commit")),
            # MLflow before 1.x wrote '' in runs.name and the name in a tag
            name=pl.coalesce(
                pl.when(pl.col("name") != "").then(pl.col("name")), pl.col("tag_name")
            ),
        )
        .select(list(RUN_SCHEMA))
    )

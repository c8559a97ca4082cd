"""GPU samples as stored, and the only way to write them.

Every reader queries the view ``gpu_samples`` (host, gpu, ts, util_pct, mem_used_mib,
mem_total_mib, power_w, model, uuid, job_label, pod, origin, source_id, run_id, util_max,
bucket_s). It joins two tables:

- ``gpu_series``: one row per GPU and the labels all its samples share (host, gpu,
  model, uuid, job_label, pod, origin, source_id, run_id, bucket_s), numbered by ``series``;
- ``gpu_readings``: one row per sample: its series, its time and its five numbers.

A reading is a raw sample (``bucket_s`` NULL: one measurement at ``ts``) or a rollup of the
``bucket_s`` seconds up to ``ts`` that a metrics server computed (``audit ingest
prometheus``): ``util_pct`` is the bucket's mean utilisation, ``util_max`` its highest,
``mem_used_mib`` its memory peak. Readers judge them through the expressions below, so a
5-minute mean of 0.5 % never passes for five idle minutes when a spike hid inside it.

Why two tables: DuckDB's append costs about as much per row for every column of the
table, a column the rows leave NULL included. At 100,000 runs (10 M nvidia-smi samples)
the fourteen-column table cost 3.6 CPU-s per 10 M rows to append to, five of its columns
alone 0.9 s in a table of five and 2.7 s in the table of fourteen; the labels, the same
for all of a GPU's samples, are now written once per series.

Series are never deleted: one left without readings shows no row, and importing its
samples again finds it again.
"""

from __future__ import annotations

import polars as pl

from audit.warehouse.frames import execute_on_frame

SERIES_SCHEMA = {
    "host": pl.String,
    "gpu": pl.String,
    "model": pl.String,
    "uuid": pl.String,
    "job_label": pl.String,
    "pod": pl.String,
    "origin": pl.String,
    "source_id": pl.String,
    "run_id": pl.String,
    "bucket_s": pl.Int32,  # a rollup's width; NULL for raw samples
}
SERIES_COLUMNS = tuple(SERIES_SCHEMA)
READING_SCHEMA = {
    "ts": pl.Datetime("us"),
    "util_pct": pl.Float32,
    "mem_used_mib": pl.Float32,
    "mem_total_mib": pl.Float32,
    "power_w": pl.Float32,
    "util_max": pl.Float32,  # a rollup's highest utilisation; NULL for raw samples
}
_SAME_SERIES = " AND ".join(f"s.{c} IS NOT DISTINCT FROM i.{c}" for c in SERIES_COLUMNS)


def append_samples(con, samples: pl.DataFrame, only_new: bool = False) -> None:
    """Store ``samples``: rows with any of ``gpu_samples``' columns (host, gpu, ts and origin
    required; the others NULL where absent). With ``only_new``, a sample whose (host, gpu,
    ts) is stored already is left out: the stored one is kept."""
    if not samples.height:
        return
    unknown = sorted(set(samples.columns) - set(SERIES_COLUMNS) - set(READING_SCHEMA))
    if unknown:
        raise ValueError(f"not columns of gpu_samples: {', '.join(unknown)}")
    frame = samples.select(
        *(_column(samples, name, dtype) for name, dtype in SERIES_SCHEMA.items()),
        *(_column(samples, name, dtype) for name, dtype in READING_SCHEMA.items()),
    )
    # Labels all NULL in this frame (a file's uuid, job_label, pod, run...) take no part in
    # telling its series apart: hashing them was most of the cost of finding series.
    told = [name for name in SERIES_COLUMNS if frame[name].null_count() < frame.height]
    keys = frame.select(told).unique(maintain_order=True)
    untold = [
        pl.lit(None, SERIES_SCHEMA[name]).alias(name) for name in SERIES_COLUMNS if name not in told
    ]
    series = _series_of(
        con,
        keys.cast({name: SERIES_SCHEMA[name] for name in told})
        .with_columns(untold)
        .select(SERIES_COLUMNS),
    )
    # joined on the frame's own types: categorical labels join by their codes
    rows = frame.join(
        series.select(*told, "series").cast({name: frame.schema[name] for name in told}),
        on=told,
        how="left",
        nulls_equal=True,  # a label NULL on some rows only
        maintain_order="left",
    )
    readings = ", ".join(f"i.{c}" for c in READING_SCHEMA)
    if only_new:
        execute_on_frame(
            con,
            f"INSERT INTO gpu_readings SELECT i.series, {readings} FROM incoming_frame i "
            "ANTI JOIN gpu_samples e ON e.host = i.host AND e.gpu = i.gpu AND e.ts = i.ts",
            rows.select("series", "host", "gpu", *READING_SCHEMA),
        )
    else:
        execute_on_frame(
            con,
            f"INSERT INTO gpu_readings SELECT i.series, {readings} FROM incoming_frame i",
            rows.select("series", *READING_SCHEMA),
        )


def delete_samples(con, condition: str, frame: pl.DataFrame | None = None) -> None:
    """Delete the samples of the series ``t`` for which ``condition`` (SQL over the series'
    columns, written by the caller's code, never user text) holds; ``incoming_frame`` in
    it is ``frame``."""
    sql = (
        "DELETE FROM gpu_readings WHERE series IN "
        f"(SELECT t.series FROM gpu_series t WHERE {condition})"
    )
    if frame is None:
        con.execute(sql)
    else:
        execute_on_frame(con, sql, frame)


def _column(samples: pl.DataFrame, name: str, dtype) -> pl.Expr:
    if name not in samples.columns:
        return pl.lit(None, dtype).alias(name)
    if dtype == pl.String and isinstance(samples.schema[name], pl.Categorical):
        return pl.col(name)  # labels as codes stay codes (the telemetry import's)
    return pl.col(name).cast(dtype)


def _series_of(con, keys: pl.DataFrame) -> pl.DataFrame:
    """``keys`` (distinct label tuples) with their ``series``; those not stored yet are
    numbered after the highest stored and stored."""
    stored = execute_on_frame(
        con, f"SELECT i.*, s.series FROM incoming_frame i JOIN gpu_series s ON {_SAME_SERIES}", keys
    ).pl()
    new = keys.join(stored, on=list(SERIES_COLUMNS), how="anti", nulls_equal=True)
    if not new.height:
        return stored.with_columns(pl.col("series").cast(pl.Int32))
    first = con.execute("SELECT coalesce(max(series), 0) + 1 FROM gpu_series").fetchall()[0][0]
    new = new.with_columns(series=pl.int_range(first, first + new.height, dtype=pl.Int32))
    columns = ", ".join(SERIES_COLUMNS)
    execute_on_frame(
        con,
        f"INSERT INTO gpu_series (series, {columns}) SELECT series, {columns} FROM incoming_frame",
        new,
    )
    return pl.concat([stored.with_columns(pl.col("series").cast(pl.Int32)), new])


# -- reading rollups and raw samples alike ---------------------------------------------------
def util_peak(alias: str = "") -> str:
    """SQL: the highest utilisation a reading vouches for: a rollup's maximum, a raw sample's
    own value. Whatever judges a stretch of time idle reads this, never the mean."""
    prefix = f"{alias}." if alias else ""
    return f"coalesce({prefix}util_max, {prefix}util_pct)"


def util_mean(alias: str = "") -> str:
    """SQL: the mean utilisation a reading stands for (a rollup's mean, a raw sample)."""
    return f"{alias}.util_pct" if alias else "util_pct"


def in_window(alias: str, lo: str, hi: str) -> str:
    """SQL: a reading counts for the window [lo, hi) when its time lies in it: a raw sample
    taken then, or a bucket ending then. A bucket ending just after ``lo`` began up to its
    width before it: with 5-minute buckets a job's first bucket may hold up to four minutes
    of the GPU before the job (at size L, 8 of 2,021 findings of the bench fleet changed
    rule against the raw samples, 73 means moved by under a point). One-minute buckets of
    one-minute samples count exactly the samples the raw rule does."""
    return f"{alias}.ts >= {lo} AND {alias}.ts < {hi}"


def logged_by_a_run(alias: str) -> str:
    """SQL: a sample a tracker logged for its run (MLflow's ``system/gpu_*``, W&B's, SwanLab's
    or trackio's system metrics, any importer's): every run importer stores its samples with
    their run, host telemetry never has one. It is a run's own evidence, never a host's."""
    return f"{alias}.run_id IS NOT NULL"


def may_belong_to(alias: str, job_id: str) -> str:
    """SQL: a sample of the job ``job_id`` (SQL) may be: one labelled with that job by its
    exporter (dcgm-exporter's ``hpc_job``, jobstats' ``jobid``), or an unlabelled one, which
    only its host and time can attach. A sample labelled with another job is never this
    job's, whatever host and time it shares."""
    return f"({alias}.job_label IS NULL OR {alias}.job_label = {job_id})"


_ORIGIN_NAMES = {
    "prometheus": "Prometheus",
    "dcgm": "DCGM snapshots",
    "nvidia-smi": "nvidia-smi",
    "wandb": "W&B system metrics",
    "mlflow": "MLflow system metrics",
}


def resolution_text(origin: str | None, bucket_s: int | None) -> str:
    """'5-minute buckets from Prometheus', 'raw samples from nvidia-smi'."""
    source = _ORIGIN_NAMES.get(origin or "", origin or "telemetry")
    if not bucket_s:
        return f"raw samples from {source}"
    if bucket_s % 3600 == 0:
        width = f"{bucket_s // 3600}-hour"
    elif bucket_s % 60 == 0:
        width = f"{bucket_s // 60}-minute"
    else:
        width = f"{bucket_s}-second"
    return f"{width} buckets from {source}"


def resolutions_text(pairs) -> str:
    """The resolutions of several (origin, bucket_s) pairs in one phrase, in a stable order."""
    texts = sorted({resolution_text(o, b) for o, b in pairs})
    return " and ".join(texts) if texts else "no samples"


def resolutions_by_host(con) -> dict[str, str]:
    """Per host, what its telemetry is made of ('5-minute buckets from Prometheus'): read
    from the series alone (a few rows per GPU), for the evidence of per-host findings."""
    by_host: dict[str, set] = {}
    for host, origin, bucket_s in con.execute(
        "SELECT DISTINCT host, origin, bucket_s FROM gpu_series WHERE run_id IS NULL"
    ).fetchall():
        by_host.setdefault(host, set()).add((origin, bucket_s))
    return {host: resolutions_text(pairs) for host, pairs in by_host.items()}

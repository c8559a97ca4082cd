"""Reading an MLflow SQL store (SQLite, or Postgres with the optional driver) in bulk.

The MLflow client fetches one run at a time; reading the tables directly is orders of
magnitude faster for whole histories. Rows arrive as Arrow through ADBC drivers (no
per-row Python objects), inside one read transaction so the snapshot stays consistent
while a tracking server keeps writing. The drivers are used through the driver manager's
low-level API: its DB-API module imports ``pyarrow.dataset``, which imports pandas (half a
second of every process start, a quarter of an incremental import's budget).

Two access paths: when most runs changed (a first import), each table is scanned once
sequentially; when few changed, their rows are fetched through a temporary table of run
ids joined on MLflow's ``run_uuid`` indexes. Change detection follows the same split: the
per-run signature is computed only for runs that may have changed once whole-table totals
prove the others unchanged (``SqlStoreReader._runs_proven_unchanged``).
"""

from audit.importers.mlflow.sql.reader import SqlStoreReader

__all__ = ["SqlStoreReader"]

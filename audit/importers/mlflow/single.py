"""Refreshing one run from its MLflow source (``audit gate --refresh``), fast.

For a tracking server: ``runs/get`` plus the run's metric histories, written in one
transaction (a RUNNING run included). For SQL and file stores: an incremental import of
the source, which rewrites only what changed. A tracking URI given by the caller wins
over the source the run was imported from (a run imported from a copy of a store is
refreshed from the live server named).
"""

from __future__ import annotations

from audit.config import Config
from audit.errors import InputError
from audit.importers.links import refresh_links_of_runs
from audit.importers.mlflow import import_mlflow, open_reader
from audit.importers.mlflow.rest import RestReader
from audit.importers.run_store import (
    replace_experiments,
    runs_frame,
    stable_hash,
    upsert_source,
    write_batch,
)
from audit.importers.search_index import update_search_tables
from audit.warehouse import Warehouse
from audit.warehouse.frames import insert_frame
from audit.windows import now_utc


def _known_source(wh: Warehouse, run_id: str) -> tuple[str, str] | None:
    rows = wh.con.execute(
        "SELECT s.kind, s.location FROM runs r JOIN sources s USING (source_id) WHERE r.run_id = ? LIMIT 1",
        [run_id],
    ).fetchall()
    return rows[0] if rows else None


def tracking_reader(
    wh: Warehouse, run_id: str, config: Config, tracking_uri: str | None
) -> RestReader:
    """The tracking server the run lives on (credentials from the URI or environment)."""
    known = _known_source(wh, run_id)
    uri = tracking_uri or (known[1] if known and known[0] == "http" else None)
    if not uri:
        raise InputError(
            f"run {run_id} does not come from a tracking server; pass --tracking-uri http://…"
        )
    reader = open_reader(uri, config)
    if not isinstance(reader, RestReader):
        reader.close()
        raise InputError("writing tags back needs a tracking server (http://…), not a store path")
    return reader


def refresh_run(wh: Warehouse, run_id: str, config: Config, tracking_uri: str | None) -> None:
    known = _known_source(wh, run_id)
    if not tracking_uri and known and known[0] != "http":
        import_mlflow(wh, known[1], config=config)  # store locations are paths or URIs already
        return
    uri = tracking_uri or (known[1] if known else None)
    if not uri:
        raise InputError(f"run {run_id} is not in the warehouse; pass --tracking-uri to fetch it")
    reader = open_reader(uri, config)
    try:
        if not isinstance(reader, RestReader):
            reader.close()
            import_mlflow(wh, uri, config=config)
            return
        source_id = stable_hash(reader.kind, reader.location)[:12]
        run = reader.fetch_run(run_id)
        experiment = reader.experiment(run["experiment_id"][0])
        batches = list(reader.details([run_id]))
        now = now_utc()
        with wh.transaction() as con:
            upsert_source(con, source_id, reader.kind, reader.location, now)
            replace_experiments(con, source_id, experiment, reader.location)
            for table in ("runs", "params", "tags", "metrics", "latest_metrics", "dataset_inputs"):
                con.execute(
                    f"DELETE FROM {table} WHERE source_id = ? AND run_id = ?", [source_id, run_id]
                )
            insert_frame(con, "runs", runs_frame(run, source_id, now, reader.location))
            for batch in batches:
                write_batch(con, batch, source_id, reader.location)
            # links read the run's rows: kept exact for later imports' incremental refresh
            refresh_links_of_runs(con, config, {source_id: [run_id]})
            update_search_tables(con, source_id, [run_id])
    finally:
        reader.close()

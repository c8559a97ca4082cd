"""What the warehouse holds, as plain data (used by ``audit status`` and reports)."""

from __future__ import annotations

from audit.warehouse import SCHEMA_VERSION, Warehouse


def warehouse_status(wh: Warehouse) -> dict:
    sources = wh.con.execute(
        """
        SELECT s.source_id, s.kind, s.location,
               (SELECT count(*) FROM experiments e WHERE e.source_id = s.source_id),
               (SELECT count(*) FROM runs r WHERE r.source_id = s.source_id),
               (SELECT count(*) FROM runs r WHERE r.source_id = s.source_id
                  AND r.lifecycle_stage = 'deleted'),
               strftime(s.last_imported_at, '%Y-%m-%d %H:%M:%S')
        FROM sources s ORDER BY s.location
        """
    ).fetchall()
    keys = [
        "source_id",
        "kind",
        "location",
        "experiments",
        "runs",
        "deleted_runs",
        "last_imported_at",
    ]
    first, last = wh.con.execute(
        "SELECT strftime(min(start_time), '%Y-%m-%d %H:%M'), strftime(max(start_time), '%Y-%m-%d %H:%M') FROM runs"
    ).fetchall()[0]
    return {
        "schema_version": SCHEMA_VERSION,
        "sources": [dict(zip(keys, row, strict=True)) for row in sources],
        "totals": {
            "runs": wh.scalar("SELECT count(*) FROM runs"),
            "deleted_runs": wh.scalar(
                "SELECT count(*) FROM runs WHERE lifecycle_stage = 'deleted'"
            ),
            "params": wh.scalar("SELECT count(*) FROM params"),
            "tags": wh.scalar("SELECT count(*) FROM tags"),
            "metric_points": wh.scalar("SELECT count(*) FROM metrics"),
            "dataset_inputs": wh.scalar("SELECT count(*) FROM dataset_inputs"),
        },
        "first_run": first,
        "last_run": last,
        "runs_by_status": wh.con.execute(
            "SELECT coalesce(status, 'unknown'), count(*) FROM runs GROUP BY 1 ORDER BY 1"
        ).fetchall(),
    }

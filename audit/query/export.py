"""``audit export``: every warehouse table as Hive-partitioned Parquet, written in slices
of partitions and renamed into place whole."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from audit import atomic
from audit.errors import InputError
from audit.query import partitions
from audit.query.sandbox import first_line
from audit.warehouse import open_warehouse
from audit.warehouse.slices import partition_slices

# Rows written by one COPY of the export. DuckDB holds a partition's rows until it has a
# row group's worth, so 1,000 hosts of 80,640 telemetry samples each were all held at once
# (past 14 GiB at 80 M samples); a slice of partitions bounds that (0.4 GB at 10 M).
EXPORT_SLICE_ROWS = 1_000_000


EXPORT_PARTITIONS = {
    "runs": "source_id",
    "params": "source_id",
    "tags": "source_id",
    "metrics": "source_id",
    "latest_metrics": "source_id",
    "dataset_inputs": "source_id",
    "experiments": "source_id",
    "jobs": "cluster",
    "job_nodes": "cluster",
    "gpu_samples": "host",
    "checkpoints": "root",
    "findings": "scan_id",
    "rule_results": "scan_id",
}


def export_parquet(db: Path, folder: Path) -> dict[str, int]:
    """Every table as Hive-partitioned Parquet under ``folder/<table>/<column>=<value>/``.

    Written into a temporary folder next to ``folder`` and renamed into place, so an
    interrupted export leaves no partial folder.
    """
    folder = Path(folder)
    counts: dict[str, int] = {}

    def build(target: Path) -> None:
        with open_warehouse(db, read_only=True) as wh:
            if not wh.scalar("SELECT current_setting('enable_external_access')"):
                raise InputError(
                    "cannot export: another connection of this process to the warehouse "
                    "has file access disabled (a search or sql); close it first"
                )
            for table, partition in EXPORT_PARTITIONS.items():
                sizes = wh.con.execute(
                    f"SELECT {partition}, count(*) FROM {table} GROUP BY 1 ORDER BY 1"
                ).fetchall()
                counts[table] = sum(rows for _, rows in sizes)
                fitting = [(v, n) for v, n in sizes if partitions.fits(partition, v)]
                for values in partition_slices(fitting, EXPORT_SLICE_ROWS):
                    _copy(
                        wh.con,
                        f"COPY (SELECT * FROM {table} WHERE list_contains(?, {partition})) "
                        f"TO '{_sql_path(target / table)}' "
                        f"(FORMAT parquet, PARTITION_BY ({partition}), OVERWRITE_OR_IGNORE)",
                        [values],
                        folder,
                    )
                _export_shortened(
                    wh.con,
                    table,
                    partition,
                    [v for v, _ in sizes if not partitions.fits(partition, v)],
                    target / table,
                    folder,
                )

    atomic.build_folder(folder, build)
    return counts


def _copy(con, sql: str, params: list, folder: Path) -> None:
    try:
        con.execute(sql, params)
    except duckdb.Error as exc:
        raise InputError(
            f"cannot write {folder}: {first_line(exc)}; nothing was exported"
        ) from None


def _export_shortened(
    con, table: str, partition: str, values: list, target: Path, folder: Path
) -> None:
    """The partitions whose folder names no file system holds (``audit.query.partitions``):
    each in a shortened folder, its rows keeping the value, and the folders listed with
    their values in the table's index."""
    index = []
    for value in values:
        name = partitions.shortened_name(partition, value)
        (target / name).mkdir(parents=True, exist_ok=True)
        _copy(
            con,
            f"COPY (SELECT * FROM {table} WHERE {partition} = ?) "
            f"TO '{_sql_path(target / name / 'data_0.parquet')}' (FORMAT parquet)",
            [value],
            folder,
        )
        index.append({"column": partition, "folder": name, "value": value})
    if index:
        (target / partitions.SHORTENED_INDEX).write_text(
            json.dumps(index, indent=1, ensure_ascii=False, default=str) + "\n"
        )


def _sql_path(path: Path) -> str:
    return str(path.resolve()).replace("'", "''")

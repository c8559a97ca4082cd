"""The Python API over the queryable history: search, "already run?", compare, read-only
SQL, Parquet export, each a method delegating to its module in ``audit.query``.

    from audit import Registry
    reg = Registry("audit.duckdb")
    reg.search("params.learning_rate < 3e-5 and tags.team = 'coder'")   # polars DataFrame

Every method opens the warehouse read-only: a search can run while nothing else writes.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from audit.config import Config, load_config
from audit.query import compare, export, sandbox, search, similar
from audit.query.fields import lock_down
from audit.query.similar import Similar
from audit.warehouse import open_warehouse


class Registry:
    def __init__(self, db: str | Path = "audit.duckdb", config: Config | None = None):
        self.db = Path(db)
        self.config = config or load_config(None)
        self._warehouse = None
        self._wide: dict[str, set[str]] | None = None

    def _open(self):
        """The read-only connection, opened on first use and kept for later calls.

        It runs locked down like ``sql()``: no file or network access, no extensions.
        """
        if self._warehouse is None:
            warehouse = open_warehouse(self.db, read_only=True)
            try:
                lock_down(warehouse.con)
            except BaseException:
                warehouse.close()
                raise
            self._warehouse = warehouse
        return _Borrowed(self._warehouse)

    def close(self) -> None:
        if self._warehouse is not None:
            self._warehouse.close()
            self._warehouse = None

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def search(
        self,
        filter_text: str = "",
        order_by: list[str] | None = None,
        limit: int | None = 100,
        columns: list[str] | None = None,
        include_deleted: bool = False,
    ) -> pl.DataFrame:
        query = search.parse_query(filter_text, order_by, columns)
        with self._open() as wh:
            if self._wide is None:
                self._wide = search.wide_keys(wh)
            return search.search(wh, self._wide, query, limit, include_deleted)

    def missing_keys(self, filter_text: str) -> list[str]:
        """For each params/metrics/tags key of ``filter_text`` that no run has, a hint naming
        the closest existing key (for an empty result)."""
        query = search.parse_query(filter_text)
        with self._open() as wh:
            return search.missing_keys(wh, query)

    def similar(
        self,
        run_id: str | None = None,
        config_file: Path | None = None,
        params: dict[str, str] | None = None,
        ignore: list[str] | None = None,
        limit: int = 10,
    ) -> Similar:
        with self._open() as wh:
            return similar.similar(wh, self.config, run_id, config_file, params, ignore, limit)

    def compare(self, run_ids: list[str], all_params: bool = False) -> dict[str, pl.DataFrame]:
        compare.require_two(run_ids)
        with self._open() as wh:
            return compare.compare(wh, self.config, run_ids, all_params)

    def sql(self, query: str, timeout: float | None = None) -> pl.DataFrame:
        """Read-only SQL over the documented views; writes and file access are refused.
        The query is stopped after ``timeout`` seconds, and at Ctrl-C at once."""
        return sandbox.sql(self.db, query, timeout)

    def export_parquet(self, folder: Path) -> dict[str, int]:
        """Every table as Hive-partitioned Parquet under ``folder/<table>/<column>=<value>/``.

        Written into a temporary folder next to ``folder`` and renamed into place, so an
        interrupted export leaves no partial folder.
        """
        # COPY needs file access, which search connections give up for good: the export's
        # is a connection of its own, opened after the kept one is closed
        self.close()
        return export.export_parquet(self.db, folder)


class _Borrowed:
    """Lends the kept connection to a ``with`` block without closing it afterwards."""

    def __init__(self, warehouse):
        self.warehouse = warehouse

    def __enter__(self):
        return self.warehouse

    def __exit__(self, *exc: object) -> None:
        return None

"""One ADBC connection to an MLflow SQL store: SQL in, Arrow out, and the drivers'
messages made readable."""

from __future__ import annotations

import re


class Connection:
    """One ADBC connection: SQL in, Arrow out, nothing of the DB-API layer."""

    def __init__(self, database, autocommit: bool, options: dict[str, str]):
        import adbc_driver_manager

        self._connection = adbc_driver_manager.AdbcConnection(database)
        self._statement = None
        try:
            if not autocommit:
                self._connection.set_autocommit(False)  # one read transaction: one snapshot
            self._statement = adbc_driver_manager.AdbcStatement(self._connection)
            if options:
                self._statement.set_options(**options)
        except BaseException:
            self._connection.close()
            raise

    def reader(self, sql: str, bind=None):
        """The result of ``sql`` as a ``pyarrow.RecordBatchReader`` (read it before the next call)."""
        import pyarrow as pa

        self._statement.set_sql_query(sql)
        if bind is not None:
            self._statement.bind_stream(bind)
        handle, _ = self._statement.execute_query()
        return pa.RecordBatchReader.from_stream(handle)

    def table(self, sql: str):
        return self.reader(sql).read_all()

    def rows(self, sql: str) -> list[tuple]:
        table = self.table(sql)
        return list(zip(*(c.to_pylist() for c in table.columns), strict=True))

    def execute(self, sql: str, bind=None) -> None:
        """A statement without a result; ``bind`` (Arrow data) runs it once per row."""
        self.reader(sql, bind).read_all()

    def rollback(self) -> None:
        self._connection.rollback()

    def close(self) -> None:
        try:
            if self._statement is not None:
                self._statement.close()
        finally:
            self._connection.close()


_DRIVER_PREFIX = re.compile(r"^(?:[A-Z_]+: )?(?:\[\w+\] )?(?:Failed to prepare query: )?")


def first_line(exc: BaseException) -> str:
    """The driver's message without its status code and driver-name prefixes."""
    text = str(exc).strip().splitlines()
    return _DRIVER_PREFIX.sub("", text[0]) if text else type(exc).__name__

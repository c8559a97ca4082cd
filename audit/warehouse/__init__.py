"""The DuckDB warehouse: schema, migrations and connections."""

from audit.warehouse.store import SCHEMA_VERSION, Warehouse, open_warehouse

__all__ = ["SCHEMA_VERSION", "Warehouse", "open_warehouse"]

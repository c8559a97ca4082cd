"""Fixtures of the importers' tests."""

from __future__ import annotations

import shutil

import pytest

from audit.importers.mlflow import import_mlflow
from audit.warehouse import open_warehouse


@pytest.fixture
def imported(server, tmp_path):
    """A copy of the reference store and a warehouse that imported it."""
    store = tmp_path / "store.db"
    shutil.copy(server["backend"], store)
    db = tmp_path / "w.duckdb"
    with open_warehouse(db) as wh:
        import_mlflow(wh, f"sqlite:///{store}")
    return store, db

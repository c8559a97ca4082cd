"""The bench's bulk writer produces exactly what the MLflow client writes."""

from __future__ import annotations

from bench.generate import create_store, synthetic_runs, write_bulk, write_with_client
from tests.helpers import warehouse_rows


def test_bulk_writer_matches_the_client(tmp_path, run_cli):
    stores = {}
    for writer in ("client", "bulk"):
        folder = tmp_path / writer
        folder.mkdir()
        path = folder / "mlflow.db"
        ids = create_store(path, experiments=3)
        (write_with_client if writer == "client" else write_bulk)(
            path, synthetic_runs(12, seed=5, experiments=3), ids
        )
        db = folder / "w.duckdb"
        code, _, err = run_cli(
            "--db", str(db), "ingest", "mlflow", "--tracking-uri", f"sqlite:///{path}"
        )
        assert code == 0, err
        stores[writer] = warehouse_rows(db)
    assert stores["bulk"] == stores["client"]
    assert len(stores["bulk"]["runs"]) == 12
    assert len(stores["bulk"]["metrics"]) == 12 * 5 * 50

"""Metric histories from a real tracking server: a hundred runs of one metric per request
through the bulk endpoint, and the same rows when the server does not offer it or when an
answer reaches MLflow's limit (asked again in halves)."""

from __future__ import annotations

import threading
import time

import duckdb
import pytest

from audit.config import load_config
from audit.importers.mlflow import rest
from tests.robustness.test_faulty_server import FaultProxy


def history(db) -> list[str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(
            "SELECT r.name, m.key, m.step, m.ts, m.value FROM metrics m "
            "JOIN runs r USING (source_id, run_id) ORDER BY ALL"
        ).fetchall()
    finally:
        con.close()
    return [repr(row) for row in rows]  # repr: NaN equals NaN


def ingest(run_cli, db, url):
    code, out, err = run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", url)
    assert code == 0, err
    return out


def history_requests(proxy) -> tuple[list[str], list[str]]:
    paths = [path for _method, path in proxy.requests]
    bulk = [p for p in paths if "/ajax-api/2.0/mlflow/metrics/get-history-bulk?" in p]
    single = [p for p in paths if "/api/2.0/mlflow/metrics/get-history?" in p]
    return bulk, single


def test_bulk_history_matches_per_run_history(server, run_cli, tmp_path):
    with FaultProxy(server["url"], lambda n, path, body: None) as proxy:
        ingest(run_cli, tmp_path / "bulk.duckdb", proxy.url)
    bulk, single = history_requests(proxy)
    assert bulk and not single
    no_bulk = lambda n, path, body: ("answer", 404, b"") if "/ajax-api/" in path else None  # noqa: E731
    with FaultProxy(server["url"], no_bulk) as proxy:
        ingest(run_cli, tmp_path / "single.duckdb", proxy.url)
    bulk_tried, single = history_requests(proxy)
    # asked by the requests already under way (at most one per worker), then run by run
    concurrency = load_config(None).values["mlflow"]["http_concurrency"]
    assert 1 <= len(bulk_tried) <= concurrency and single
    reference = history(tmp_path / "single.duckdb")
    assert len(reference) > 50
    assert history(tmp_path / "bulk.duckdb") == reference


def test_an_answer_at_the_limit_is_asked_again_in_halves(server, run_cli, tmp_path, monkeypatch):
    ingest(run_cli, tmp_path / "reference.duckdb", server["url"])
    monkeypatch.setattr(rest, "BULK_POINTS", 4)  # most histories here have more points
    with FaultProxy(server["url"], lambda n, path, body: None) as proxy:
        ingest(run_cli, tmp_path / "split.duckdb", proxy.url)
    bulk, single = history_requests(proxy)
    assert single, "single runs at the limit fall back to the paged endpoint"
    assert any(path.count("run_id=") > 1 for path in bulk)
    assert history(tmp_path / "split.duckdb") == history(tmp_path / "reference.duckdb")


def test_a_point_of_a_run_not_asked_for_is_refused(server, run_cli, tmp_path):
    def foreign(n, path, body):
        if "get-history-bulk" not in path:
            return None
        return ("rewrite", lambda a: {"metrics": [{**m, "run_id": "x" * 32} for m in a["metrics"]]})

    with FaultProxy(server["url"], foreign) as proxy:
        code, _out, err = run_cli(
            "--db", str(tmp_path / "w.duckdb"), "ingest", "mlflow", "--tracking-uri", proxy.url
        )
    assert code == 2, err
    assert "metrics/get-history-bulk" in err and "which was not asked for" in err


class Overlap:
    """A proxy fault that forwards every request after holding it a moment, and counts
    how many requests the importer had under way at once."""

    def __init__(self, hold: float = 0.15):
        self.hold = hold
        self.lock = threading.Lock()
        self.active = self.most = 0

    def __call__(self, n, path, body):
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(self.hold)
        with self.lock:
            self.active -= 1
        return None


@pytest.mark.parametrize("concurrency", [1, 2])
def test_http_concurrency_bounds_the_requests_under_way(server, run_cli, tmp_path, concurrency):
    config = tmp_path / "audit.toml"
    config.write_text(f"[mlflow]\nhttp_concurrency = {concurrency}\n")
    overlap = Overlap()
    with FaultProxy(server["url"], overlap) as proxy:
        code, _out, err = run_cli(
            "--db", str(tmp_path / "w.duckdb"), "--config", str(config),
            "ingest", "mlflow", "--tracking-uri", proxy.url,
        )  # fmt: skip
    assert code == 0, err
    bulk, _single = history_requests(proxy)
    assert len(bulk) > concurrency  # enough requests that the bound is what held them
    assert overlap.most == concurrency
    assert history(tmp_path / "w.duckdb") == history_of_plain_import(server, run_cli, tmp_path)


def history_of_plain_import(server, run_cli, tmp_path) -> list[str]:
    ingest(run_cli, tmp_path / "plain.duckdb", server["url"])
    return history(tmp_path / "plain.duckdb")


def test_http_concurrency_out_of_range_is_a_config_error(run_cli, tmp_path):
    config = tmp_path / "audit.toml"
    config.write_text("[mlflow]\nhttp_concurrency = 0\n")
    code, _out, err = run_cli(
        "--db", str(tmp_path / "w.duckdb"), "--config", str(config),
        "ingest", "mlflow", "--tracking-uri", "http://127.0.0.1:9",
    )  # fmt: skip
    assert code == 2
    assert "[mlflow] http_concurrency must be a number of requests at a time from 1 to 64" in err


def test_an_unchanged_reimport_fetches_no_history(server, run_cli, tmp_path):
    db = tmp_path / "w.duckdb"
    with FaultProxy(server["url"], lambda n, path, body: None) as proxy:
        first = ingest(run_cli, db, proxy.url)
        before = history(db)
        asked_first = len(proxy.requests)
        second = ingest(run_cli, db, proxy.url)
    assert "(0 unchanged)" in first
    bulk, _single = history_requests(proxy)
    bulk_again = [p for _m, p in proxy.requests[asked_first:] if "get-history" in p]
    assert bulk and not bulk_again, "the second import asked for metric histories"
    assert "imported 0 new or changed runs" in second
    assert history(db) == before

"""A tracker that is neither a folder of files nor MLflow imports through the one loader
(``audit.importers.source.load_runs``) with nothing but a ``RunSource`` of its own.

``MemoryServer`` stands for a server-based tracker (ClearML, Aim): it lists runs with a
change signature cheaply and hands over a run's params, tags and metrics only when asked.
The loader, not the source, skips unchanged runs on a re-import, replaces a changed run's
rows, redacts what people typed, writes the import log and keeps a failed import out.
"""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import polars as pl
import pytest

from audit.config import load_config
from audit.errors import InputError
from audit.importers.run_store import (
    EXPERIMENT_SCHEMA,
    METRIC_SCHEMA,
    PARAM_SCHEMA,
    RUN_SCHEMA,
    TAG_SCHEMA,
    DetailBatch,
)
from audit.importers.source import RunBatch, RunImport, StoredSignatures, load_runs
from audit.warehouse.store import open_warehouse

EMAIL = "ann.secret@corp-mail.example.org"
HF = "hf_" + "Q7w" * 11 + "Zk"
START_MS = 1_794_787_200_000  # 2026-11-16


class MemoryServer:
    """A tracking server's store, in memory: runs by id, each a dict of its fields."""

    def __init__(self) -> None:
        self.runs: dict[str, dict] = {}

    def log_run(self, run_id: str, user: str, params: dict, tags: dict, losses: list[float]):
        self.runs[run_id] = {
            "user": user,
            "params": dict(params),
            "tags": dict(tags),
            "losses": list(losses),
            "version": self.runs.get(run_id, {}).get("version", 0) + 1,
        }


class MemorySource:
    """The ``RunSource`` of a ``MemoryServer``: one location, runs listed with their
    signatures, details fetched for the runs the loader asks for."""

    kind = "memory"
    tracker = "memory"

    def __init__(self, server: MemoryServer, fail_on: str | None = None) -> None:
        self.server = server
        self.location = "memory://tracker.example"
        self.fetched: list[list[str]] = []
        self.fail_on = fail_on
        self.closed = False

    def begin(self, con, known: StoredSignatures) -> None:
        return None

    def batches(self) -> Iterator[RunBatch]:
        ids = sorted(self.server.runs)
        runs = pl.DataFrame(
            [
                {
                    "run_id": run_id,
                    "experiment_id": "exp",
                    "name": f"run {run_id} by {EMAIL}",
                    "user_id": self.server.runs[run_id]["user"],
                    "status": "FINISHED",
                    "start_time": START_MS,
                    "end_time": START_MS + 3_600_000,
                    "lifecycle_stage": "active",
                    "signature": f"v{self.server.runs[run_id]['version']}",
                }
                for run_id in ids
            ],
            schema=RUN_SCHEMA,
        )
        experiments = pl.DataFrame(
            [{"experiment_id": "exp", "name": "sft", "lifecycle_stage": "active"}],
            schema=EXPERIMENT_SCHEMA,
        )
        yield RunBatch(location=self.location, runs=runs, experiments=experiments)

    def details(self, location: str, run_ids: list[str]) -> Iterator[DetailBatch]:
        self.fetched.append(list(run_ids))
        for run_id in run_ids:
            if run_id == self.fail_on:
                raise InputError(f"{location}: run {run_id}: the server answered 500")
            run = self.server.runs[run_id]
            yield DetailBatch(
                run_count=1,
                params=pl.DataFrame(
                    [(run_id, k, v) for k, v in run["params"].items()],
                    schema=PARAM_SCHEMA,
                    orient="row",
                ),
                tags=pl.DataFrame(
                    [(run_id, k, v) for k, v in run["tags"].items()],
                    schema=TAG_SCHEMA,
                    orient="row",
                ),
                metrics=pl.DataFrame(
                    [
                        (run_id, "loss", v, step, START_MS + step * 1000)
                        for step, v in enumerate(run["losses"])
                    ],
                    schema=METRIC_SCHEMA,
                    orient="row",
                ),
            )

    def finish(self, con, summary: RunImport) -> None:
        summary.location = self.location

    def close(self) -> None:
        self.closed = True


def _import(db, source: MemorySource) -> RunImport:
    wh = open_warehouse(db)
    try:
        return load_runs(wh, source, load_config(None))
    finally:
        wh.close()


def _rows(db, sql: str) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.fixture
def server() -> MemoryServer:
    server = MemoryServer()
    server.log_run(
        "a",
        EMAIL,
        {"lr": "1e-5", "hf_token": HF, "notify": f"mail {EMAIL}"},
        {"team": "coder", "cmd": f"train.py --hf_token={HF}"},
        [2.0, 1.5, 1.2],
    )
    server.log_run("b", "bob", {"lr": "2e-5"}, {"team": "infra"}, [3.0, 2.5])
    return server


def test_a_server_source_imports_redacted_and_logged(server, db):
    source = MemorySource(server)
    summary = _import(db, source)
    assert (summary.runs_written, summary.runs_unchanged) == (2, 0)
    assert (summary.params, summary.tags, summary.metric_points) == (4, 3, 5)
    assert summary.line().startswith("imported 2 new or changed runs (0 unchanged) from memory://")
    assert source.fetched == [["a", "b"]] and source.closed
    assert _rows(db, "SELECT kind, location FROM sources") == [
        ("memory", "memory://tracker.example")
    ]
    assert _rows(db, "SELECT run_id, user_id FROM runs ORDER BY 1") == [
        ("a", "ann.secret"),
        ("b", "bob"),
    ]
    texts = _rows(
        db,
        "SELECT string_agg(value, ' ') FROM (SELECT value FROM params UNION ALL "
        "SELECT value FROM tags UNION ALL SELECT name FROM runs)",
    )[0][0]
    assert EMAIL not in texts and HF not in texts
    assert "<redacted>" in texts and "<e-mail removed>" in texts
    assert _rows(db, "SELECT value_num FROM params WHERE key = 'lr' ORDER BY run_id") == [
        (1e-05,),
        (2e-05,),
    ]
    assert _rows(
        db,
        "SELECT kind, runs_seen, runs_written, runs_unchanged, params, metric_points FROM import_log",
    ) == [("memory", 2, 2, 0, 4, 5)]


def test_a_re_import_fetches_only_the_changed_run_and_replaces_its_rows(server, db):
    _import(db, MemorySource(server))
    again = MemorySource(server)
    summary = _import(db, again)
    assert (summary.runs_written, summary.runs_unchanged) == (0, 2)
    assert again.fetched == []  # nothing asked of the server for unchanged runs

    server.log_run("b", "bob", {"lr": "2e-5", "epochs": "3"}, {"team": "infra"}, [3.0, 2.5, 2.1])
    changed = MemorySource(server)
    summary = _import(db, changed)
    assert (summary.runs_written, summary.runs_unchanged) == (1, 1)
    assert changed.fetched == [["b"]]
    assert _rows(db, "SELECT run_id, count(*) FROM metrics GROUP BY 1 ORDER BY 1") == [
        ("a", 3),
        ("b", 3),
    ]
    assert _rows(db, "SELECT run_id, count(*) FROM runs GROUP BY 1 ORDER BY 1") == [
        ("a", 1),
        ("b", 1),
    ]
    assert _rows(db, "SELECT key FROM params WHERE run_id = 'b' ORDER BY 1") == [
        ("epochs",),
        ("lr",),
    ]
    assert _rows(db, "SELECT runs_written, runs_unchanged FROM import_log ORDER BY import_id") == [
        (2, 0),
        (0, 2),
        (1, 1),
    ]


def test_a_source_failing_half_way_leaves_the_warehouse_as_it_was(server, db):
    _import(db, MemorySource(server))
    before = _rows(db, "SELECT (SELECT count(*) FROM params), (SELECT count(*) FROM import_log)")
    server.log_run("a", EMAIL, {"lr": "3e-5"}, {}, [1.0])
    server.log_run("b", "bob", {"lr": "4e-5"}, {}, [1.0])
    failing = MemorySource(server, fail_on="b")
    with pytest.raises(InputError, match="answered 500"):
        _import(db, failing)
    assert failing.closed
    assert (
        _rows(db, "SELECT (SELECT count(*) FROM params), (SELECT count(*) FROM import_log)")
        == before
    )
    assert _rows(db, "SELECT value FROM params WHERE run_id = 'a' AND key = 'lr'") == [("1e-5",)]

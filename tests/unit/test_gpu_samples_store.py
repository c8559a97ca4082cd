"""GPU samples are stored as series and readings behind the view ``gpu_samples``
(``audit.warehouse.samples``): whatever is appended, in whatever order and types, the view
holds exactly the rows a single table would, and older warehouses move over unchanged."""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.warehouse import migrations, open_warehouse
from audit.warehouse import store as store_module
from audit.warehouse.samples import READING_SCHEMA, SERIES_COLUMNS, append_samples, delete_samples
from tests.helpers import property_examples

T0 = datetime(2026, 11, 16)
VIEW_COLUMNS = [
    "host",
    "gpu",
    "ts",
    "util_pct",
    "mem_used_mib",
    "mem_total_mib",
    "power_w",
    "model",
    "uuid",
    "job_label",
    "pod",
    "origin",
    "source_id",
    "run_id",
]
label = st.none() | st.sampled_from(["a", "b", ""])
sample = st.fixed_dictionaries(
    {
        "host": st.sampled_from(["h1", "h2"]),
        "gpu": st.sampled_from(["0", "1"]),
        "ts": st.integers(0, 3).map(lambda m: T0 + timedelta(minutes=m)),
        "util_pct": st.none() | st.integers(0, 100).map(float),
        "mem_used_mib": st.none() | st.integers(0, 80_000).map(float),
        "model": label,
        "uuid": label,
        "job_label": label,
        "pod": label,
        "origin": st.sampled_from(["nvidia-smi", "wandb"]),
        "source_id": label,
        "run_id": label,
    }
)
batch = st.tuples(
    st.lists(sample, min_size=1, max_size=12),
    st.booleans(),  # only_new
    st.booleans(),  # labels as categoricals (the telemetry import's) or as text
    st.sets(st.sampled_from(["model", "uuid", "pod", "source_id", "run_id"])),  # left out
)


def _frame(rows: list[dict], categorical: bool, left_out: set[str]) -> pl.DataFrame:
    names = [n for n in rows[0] if n not in left_out]
    schema = {n: READING_SCHEMA.get(n, pl.String) for n in names}
    frame = pl.DataFrame([{n: r[n] for n in names} for r in rows], schema=schema)
    if categorical:
        labels = [n for n in ("host", "gpu", "model", "origin") if n in names]
        frame = frame.with_columns(pl.col(labels).cast(pl.Categorical))
    return frame


def _as_stored(row: dict, left_out: set[str]) -> tuple:
    return tuple(None if n in left_out else row.get(n) for n in VIEW_COLUMNS)


def _view(con) -> list[tuple]:
    return sorted(
        con.execute(f"SELECT {', '.join(VIEW_COLUMNS)} FROM gpu_samples").fetchall(),
        key=repr,
    )


@settings(
    max_examples=property_examples(40, 400),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=st.lists(batch, min_size=1, max_size=5))
def test_the_view_holds_what_a_single_table_would(tmp_path_factory, batches):
    """The model is the table before V10: append every row, or with ``only_new`` only those
    whose (host, gpu, ts) was not stored before the batch."""
    path = tmp_path_factory.mktemp("samples") / "w.duckdb"
    expected: list[tuple] = []
    with open_warehouse(path) as wh:
        for rows, only_new, categorical, left_out in batches:
            stored_keys = {(r[0], r[1], r[2]) for r in expected}
            append_samples(wh.con, _frame(rows, categorical, left_out), only_new=only_new)
            expected += [
                _as_stored(r, left_out)
                for r in rows
                if not only_new or (r["host"], r["gpu"], r["ts"]) not in stored_keys
            ]
        assert _view(wh.con) == sorted(expected, key=repr)
        # one series per label tuple (NULL equal to NULL), and every reading has its series
        columns = ", ".join(SERIES_COLUMNS)
        assert wh.con.execute(
            f"SELECT count(*) FROM (SELECT {columns} FROM gpu_series GROUP BY ALL HAVING count(*) > 1)"
        ).fetchall() == [(0,)]
        assert wh.con.execute(
            "SELECT count(*) FROM gpu_readings ANTI JOIN gpu_series USING (series)"
        ).fetchall() == [(0,)]


def test_deleted_samples_leave_their_series_to_be_found_again(tmp_path):
    rows = [
        {"host": "h", "gpu": "0", "ts": T0, "origin": "wandb", "source_id": "s", "run_id": "r"},
        {"host": "h", "gpu": "0", "ts": T0, "origin": "nvidia-smi"},
    ]
    frame = pl.DataFrame(rows)
    with open_warehouse(tmp_path / "w.duckdb") as wh:
        append_samples(wh.con, frame)
        delete_samples(wh.con, "t.run_id = 'r'")
        assert wh.con.execute("SELECT origin FROM gpu_samples").fetchall() == [("nvidia-smi",)]
        append_samples(wh.con, frame.head(1))
        assert wh.con.execute("SELECT count(*) FROM gpu_series").fetchall() == [(2,)]
        assert wh.con.execute("SELECT count(*) FROM gpu_samples").fetchall() == [(2,)]


def test_a_column_gpu_samples_lacks_is_refused(tmp_path):
    frame = pl.DataFrame(
        {"host": ["h"], "gpu": ["0"], "ts": [T0], "origin": ["x"], "colour": ["red"]}
    )
    with (
        open_warehouse(tmp_path / "w.duckdb") as wh,
        pytest.raises(ValueError, match="not columns of gpu_samples: colour"),
    ):
        append_samples(wh.con, frame)


def test_samples_of_a_warehouse_before_v10_move_over_unchanged(tmp_path, monkeypatch):
    path = tmp_path / "w.duckdb"
    before = migrations.MIGRATIONS.index(migrations.V10)
    monkeypatch.setattr(store_module, "MIGRATIONS", migrations.MIGRATIONS[:before])
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", before)
    old = [
        ("h1", "0", T0, 50.0, 1.0, 80.0, None, "H100", None, None, None, "nvidia-smi", None, None),
        ("h1", "0", T0, 50.0, 1.0, 80.0, None, "H100", None, None, None, "nvidia-smi", None, None),
        ("h1", "0", T0, 7.0, None, None, 300.0, None, "GPU-9", "42", "ns/p", "dcgm", None, None),
        ("h2", "3", T0, None, None, None, None, None, None, None, None, "wandb", "s", "r"),
    ]
    with open_warehouse(path) as wh:
        wh.con.executemany(
            f"INSERT INTO gpu_samples VALUES ({', '.join('?' * len(VIEW_COLUMNS))})", old
        )
    monkeypatch.undo()
    with open_warehouse(path) as wh:
        assert _view(wh.con) == sorted(old, key=repr)
        assert wh.con.execute("SELECT count(*) FROM gpu_series").fetchall() == [(3,)]
        # a later import finds the moved series
        append_samples(
            wh.con,
            pl.DataFrame(
                {
                    "host": ["h1"],
                    "gpu": ["0"],
                    "ts": [T0 + timedelta(minutes=1)],
                    "model": ["H100"],
                    "origin": ["nvidia-smi"],
                }
            ),
        )
        assert wh.con.execute("SELECT count(*) FROM gpu_series").fetchall() == [(3,)]

"""GPUs reporting per host instant and per host: the fast forms count exactly what the plain ones mean."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.warehouse.intervals import host_instants
from audit.warehouse.samples import delete_samples
from audit.warehouse.store import open_warehouse
from tests.helpers import add_samples

T0 = datetime(2026, 11, 23, 8, 0)

# Index labels in and out of the fast path's range, non-canonical spellings of an index
# ("00", "+1", " 1"), and the labels nvidia-smi and DCGM use when there is no index.
LABELS = [
    "0",
    "1",
    "7",
    "63",
    "64",
    "255",
    "256",
    "00",
    "07",
    "+1",
    " 1",
    "-1",
    "1.0",
    "GPU-5f1c",
    "GPU-9a2b",
    "00000000:3B:00.0",
    "x",
]

sample = st.tuples(
    st.sampled_from(["gpu-h01", "gpu-h02"]),
    st.sampled_from(LABELS),
    st.integers(0, 3),  # minutes after T0: few instants, so labels meet in one instant
    st.sampled_from([None, "NVIDIA H100 80GB HBM3"]),
)


@pytest.fixture
def empty_warehouse(tmp_path):
    wh = open_warehouse(tmp_path / "w.duckdb")
    yield wh
    wh.con.close()


def _plain(con, where, params):
    return con.execute(
        f"SELECT host, ts, count(DISTINCT gpu) FROM gpu_samples WHERE {where} "
        "GROUP BY host, ts ORDER BY host, ts",
        params,
    ).fetchall()


def _fast(con, where, params):
    return con.execute(
        f"SELECT host, ts, gpus FROM {host_instants(where)} ORDER BY host, ts", params
    ).fetchall()


@settings(
    max_examples=200,
    deadline=None,  # a loaded CI machine makes single DuckDB queries slow, not wrong
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(samples=st.lists(sample, max_size=40), since_minute=st.none() | st.integers(0, 3))
def test_gpus_per_instant_equal_count_distinct(empty_warehouse, samples, since_minute):
    """Duplicates (two runs logging one GPU at one second), mixed label kinds in one
    instant and a window condition with a parameter all give count(DISTINCT gpu)."""
    con = empty_warehouse.con
    delete_samples(con, "true")
    add_samples(
        con,
        "host, gpu, ts, model, origin",
        [(h, g, T0 + timedelta(minutes=m), model, "nvidia-smi") for h, g, m, model in samples],
    )
    where, params = "TRUE", []
    if since_minute is not None:
        where, params = "ts >= ?", [T0 + timedelta(minutes=since_minute)]
    assert _fast(con, where, params) == _plain(con, where, params)


def test_model_is_one_the_instant_reported(empty_warehouse):
    con = empty_warehouse.con
    add_samples(
        con,
        "host, gpu, ts, model, origin",
        [
            ("h", "0", T0, None, "dcgm"),
            ("h", "GPU-1", T0, "A100", "dcgm"),
            ("h", "1", T0, None, "dcgm"),
        ],
    )
    rows = con.execute(f"SELECT gpus, model FROM {host_instants()}").fetchall()
    assert rows == [(3, "A100")]


def test_status_counts_host_gpu_pairs_not_their_joined_text(empty_warehouse):
    """Host 'a/b' with GPU 'c' and host 'a' with GPU 'b/c' are two GPUs, not one."""
    from audit.status import warehouse_status

    add_samples(
        empty_warehouse.con,
        "host, gpu, ts, origin",
        [
            ("a/b", "c", T0, "nvidia-smi"),
            ("a", "b/c", T0, "nvidia-smi"),
            ("a", "b/c", T0 + timedelta(minutes=1), "nvidia-smi"),
        ],
    )
    cluster = warehouse_status(empty_warehouse)["cluster"]
    assert (cluster["samples"], cluster["hosts"], cluster["gpus"]) == (3, 2, 2)

"""GPU telemetry: real nvidia-smi and DCGM captures, Prometheus JSON, bad input, bulk."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import duckdb
import pytest

from audit.errors import InputError
from audit.importers.telemetry import read_telemetry
from tests.helpers import SHARED

UTC = ZoneInfo("UTC")
SMI = SHARED / "nvidia-smi"
DCGM = SHARED / "dcgm" / "datadog_dcgm_metrics.txt"
real = pytest.mark.skipif(not SMI.exists(), reason=f"{SMI} not present")


@real
def test_real_nvidia_smi_files():
    h100 = read_telemetry(SMI / "query-gpu-8xH100.csv", UTC).samples
    assert h100.height == 8
    assert h100["gpu"].to_list() == [str(i) for i in range(8)]
    assert set(h100["host"]) == {"query-gpu-8xH100"}
    assert h100["mem_total_mib"].unique().to_list() == [81559.0]
    assert str(h100["ts"][0]) == "2024-03-15 13:57:59.791000"

    t4 = read_telemetry(SMI / "query-gpu-4xT4.csv", UTC, host="node-t4").samples
    assert t4["gpu"].to_list() == [f"0000000{i}:00:00.0" for i in range(1, 5)]  # no index column
    assert t4["mem_used_mib"].to_list() == [257.0, 14.0, 14.0, 14.0]
    assert set(t4["host"]) == {"node-t4"}

    na = read_telemetry(SMI / "query-gpu-1xT4-NA.csv", UTC).samples
    assert na.height == 1
    assert na["power_w"][0] is None  # [N/A]
    assert (na["util_pct"][0], na["mem_used_mib"][0]) == (2.0, 100.0)


@real
def test_real_dcgm_capture():
    samples = read_telemetry(DCGM, UTC, at=None).samples
    by_host = {r["host"]: r for r in samples.iter_rows(named=True)}
    assert set(by_host) == {"424773df46e0", "551bdf382151", "ip-11111"}
    assert by_host["424773df46e0"]["util_pct"] == 0.0
    assert by_host["424773df46e0"]["mem_total_mib"] == 15109.0
    assert by_host["424773df46e0"]["model"] == "Tesla T4"
    assert by_host["ip-11111"]["pod"] == "ray-llm/ray-1111111"


def test_a_snapshot_without_timestamps_says_which_time_it_took(tmp_path):
    lines = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n1"} 40\nDCGM_FI_DEV_GPU_UTIL{gpu="1",Hostname="n1"} 50'
    snapshot = tmp_path / "metrics.txt"
    snapshot.write_text(f"# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n{lines}\n")
    mtime = datetime(2026, 11, 16, 9, 30, tzinfo=UTC).timestamp()
    os.utime(snapshot, (mtime, mtime))
    read = read_telemetry(snapshot, UTC, at=None)
    assert set(read.samples["ts"].to_list()) == {datetime(2026, 11, 16, 9, 30)}
    assert read.notes == [
        f"{snapshot}: 2 DCGM values without a timestamp, placed at the file's modification "
        "time 2026-11-16 09:30:00 UTC (--at sets when it was scraped)"
    ]
    assert read_telemetry(snapshot, UTC, at=datetime(2026, 11, 17)).notes == []
    timed = tmp_path / "timed.txt"
    timed.write_text('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n1"} 40 1763285400000\n')
    assert read_telemetry(timed, UTC, at=None).notes == []


def test_units_in_values_and_noheader(tmp_path):
    with_units = tmp_path / "n1.csv"
    with_units.write_text(
        "timestamp, index, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n"
        "2026/11/16 10:00:00.000, 0, 95 %, 7650 MiB, 81559 MiB\n"
        "2026/11/16 10:00:00.000, 1, [N/A], N/A, 81559 MiB\n"
    )
    samples = read_telemetry(with_units, ZoneInfo("Europe/Amsterdam")).samples
    assert samples["util_pct"].to_list() == [95.0, None]
    assert samples["mem_used_mib"].to_list() == [7650.0, None]
    assert str(samples["ts"][0]) == "2026-11-16 09:00:00"
    noheader = tmp_path / "n2.csv"
    noheader.write_text("0, 2026/11/16 10:00:00.000, 50\n1, 2026/11/16 10:00:00.000, 60\n")
    got = read_telemetry(noheader, UTC, fields=["index", "timestamp", "utilization.gpu"]).samples
    assert got["util_pct"].to_list() == [50.0, 60.0]


def test_prometheus_query_range_json(tmp_path):
    doc = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {
                        "__name__": "DCGM_FI_DEV_GPU_UTIL",
                        "Hostname": "n7",
                        "gpu": "3",
                        "hpc_job": "4242",
                    },
                    "values": [[1794816000, "87"], [1794816060, "90"]],
                },
                {
                    "metric": {
                        "__name__": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                        "Hostname": "n8",
                        "gpu": "0",
                    },
                    "values": [[1794816000, "0.25"]],
                },
            ],
        },
    }
    path = tmp_path / "range.json"
    path.write_text(json.dumps(doc))
    samples = read_telemetry(path, UTC).samples.sort("host", "ts")
    assert samples["util_pct"].to_list() == [87.0, 90.0, 25.0]
    assert samples["job_label"].to_list() == ["4242", "4242", None]
    assert str(samples["ts"][0]) == "2026-11-16 08:00:00"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty file"),
        ("index, utilization.gpu [%]\n0, 5\n", "no timestamp column"),
        (
            "timestamp, utilization.gpu [%]\n2026/11/16 10:00:00.000, 5\n2026/11/16 10:00:00.010, 7\n"
            "2026/11/16 10:01:00.000, 5\n2026/11/16 10:02:00.000, 5\n2026/11/16 10:02:00.010, 5\n",
            "cannot tell GPUs apart: samples hold 1 to 2 rows",
        ),
        (
            "timestamp, index, name\n2026/11/16 10:00:00.000, 0, T4\n",
            "no utilization.gpu or memory.used column",
        ),
        (
            "timestamp, index, utilization.gpu [%]\n2026/11/16 10:00:00.000, 0\n",
            ":2: expected 3 comma-separated values, found 2",
        ),
        (
            "timestamp, index, utilization.gpu [%]\nyesterday, 0, 5\n",
            ":2: timestamp: expected 2024/03/15 13:57:59.791",
        ),
        (
            "timestamp, index, utilization.gpu [%]\n2026/11/16 10:00:00.000, 0, lots\n",
            ":2: expected numbers",
        ),
        (
            "timestamp, index, utilization.gpu [%]\n2026/11/16 10:00:00.000, 0, 250\n",
            "outside 0-100 %",
        ),
        ('# HELP x\nDCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="a"} notanumber\n', "is not a number"),
        ('{"data": {}}', "expected a Prometheus query result"),
        ("{not json", "invalid JSON"),
    ],
)
def test_bad_telemetry(tmp_path, content, message):
    path = tmp_path / "t.csv"
    path.write_text(content)
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("(", r"\(")):
        read_telemetry(path, UTC)


def test_skip_bad_keeps_good_rows(tmp_path, run_cli):
    path = tmp_path / "n1.csv"
    path.write_text(
        "timestamp, index, utilization.gpu [%]\n2026/11/16 10:00:00.000, 0, 5\n2026/11/16 10:01, 0\n"
        "2026/11/16 10:02:00.000, 0, 7\n"
    )
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "gpu", str(path))
    assert code == 2 and f"{path}:3:" in err
    code, out, err = run_cli("--db", str(db), "ingest", "gpu", "--skip-bad", str(path))
    assert code == 0
    assert out.startswith("imported 2 GPU samples from 1 file (3 lines read, skipped 1 bad line)")
    assert f"skipped: {path}:3: expected 3 comma-separated values, found 2" in err


def test_reimport_and_overlap_add_nothing_twice(tmp_path, run_cli):
    rows = [f"2026/11/16 10:{m:02d}:00.000, {g}, {m}" for m in range(10) for g in range(2)]
    header = "timestamp, index, utilization.gpu [%]\n"
    first, second = tmp_path / "node1.csv", tmp_path / "node1-later.csv"
    first.write_text(header + "\n".join(rows[:12]) + "\n")
    second.write_text(header + "\n".join(rows[6:]) + "\n")
    db = tmp_path / "w.duckdb"
    assert run_cli("--db", str(db), "ingest", "gpu", "--host", "node1", str(first))[1].startswith(
        "imported 12 GPU"
    )
    assert run_cli("--db", str(db), "ingest", "gpu", "--host", "node1", str(first))[1].startswith(
        "imported 0 GPU"
    )
    assert run_cli("--db", str(db), "ingest", "gpu", "--host", "node1", str(second))[1].startswith(
        "imported 8 GPU"
    )
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute(
        "SELECT count(*), count(DISTINCT (gpu, ts)) FROM gpu_samples"
    ).fetchall() == [(20, 20)]
    con.close()


def test_bulk_file(tmp_path, run_cli):
    """A 200k-row file goes through the bulk (polars) path in one piece."""
    path = tmp_path / "bulk.csv"
    with open(path, "w") as fh:
        fh.write("timestamp, index, utilization.gpu [%], memory.used [MiB]\n")
        start = datetime(2026, 11, 16)
        for minute in range(25_000):
            stamp = (start + timedelta(minutes=minute)).strftime("%Y/%m/%d %H:%M:%S.000")
            for gpu in range(8):
                fh.write(f"{stamp}, {gpu}, {(minute + gpu) % 101}, {gpu * 1000}\n")
    db = tmp_path / "w.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "gpu", str(path))
    assert code == 0, err
    assert out.startswith("imported 200,000 GPU samples")
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*), sum(util_pct), max(ts) FROM gpu_samples").fetchall()[0][
        :2
    ] == (200_000, float(sum((m + g) % 101 for m in range(25_000) for g in range(8))))
    con.close()

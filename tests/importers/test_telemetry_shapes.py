"""Telemetry as people really record it (issue 19) and one rule for valid values (issue 14).

The files in tests/data/telemetry reproduce shapes met in public repositories: one-GPU logs
without an identity column, a PowerShell (UTF-16LE, byte-order mark, CRLF) log, a live file
whose last line stops mid-row, and the plain ``nvidia-smi`` table printed in a loop.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import duckdb
import pytest

from audit.importers.telemetry.nvidia_smi import QUERY_COMMAND
from tests.helpers import REPO

DATA = REPO / "tests" / "data" / "telemetry"


def samples(db, where: str = "TRUE") -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(
            f"SELECT host, gpu, ts, util_pct, mem_used_mib, mem_total_mib, power_w, model "
            f"FROM gpu_samples WHERE {where} ORDER BY host, ts, gpu"
        ).fetchall()
    finally:
        con.close()


def count(db) -> int:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0]
    finally:
        con.close()


# -- one GPU, no identity column --------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "rows", "first"),
    [
        ("one-gpu-memory-util.csv", 12, (0.0, 3415.0, None, None)),
        ("one-gpu-name-util-temp.csv", 10, (3.0, None, None, "NVIDIA GeForce RTX 3090")),
    ],
)
def test_one_gpu_log_without_identity_column(run_cli, db, name, rows, first):
    code, out, err = run_cli("--db", str(db), "ingest", "gpu", str(DATA / name))
    assert code == 0, err
    assert out.startswith(f"imported {rows} GPU samples from 1 file")
    host = name.removesuffix(".csv")
    assert err == (
        f"note: {DATA / name}: no index, uuid or pci.bus_id column and one row per timestamp: "
        f"read as one GPU (index 0 of host {host})\n"
    )
    got = samples(db)
    assert len(got) == rows
    assert {(h, g) for h, g, *_ in got} == {(host, "0")}
    util, used, _total, _power, model = got[0][3:8]
    assert (util, used, model) == (first[0], first[1], first[3])


def _multi_gpu_without_identity(rows_per_sample: list[int]) -> str:
    """nvidia-smi --query-gpu=timestamp,name,utilization.gpu -l 60 on a node with several
    GPUs: one sample's rows are milliseconds apart."""
    lines = ["timestamp, name, utilization.gpu [%]"]
    start = datetime(2026, 3, 2, 8, 0, 0, 117000)
    for sample, gpus in enumerate(rows_per_sample):
        for gpu in range(gpus):
            stamp = start + timedelta(seconds=60 * sample, milliseconds=3 * gpu)
            lines.append(
                f"{stamp:%Y/%m/%d %H:%M:%S}.{stamp.microsecond // 1000:03d}, NVIDIA L40S, "
                f"{10 * gpu + sample} %"
            )
    return "\n".join(lines) + "\n"


def test_several_gpus_in_stable_order_are_told_apart_by_position(run_cli, db, tmp_path):
    path = tmp_path / "node4.csv"
    path.write_text(_multi_gpu_without_identity([4, 4, 4, 2]))  # the last sample cut short
    code, _out, err = run_cli("--db", str(db), "ingest", "gpu", str(path))
    assert code == 0, err
    assert "each sample has 4 rows, read as GPUs 0-3 of host node4" in err
    got = samples(db)
    assert [(g, u) for _, g, _, u, *_ in got[:4]] == [
        ("0", 0.0),
        ("1", 10.0),
        ("2", 20.0),
        ("3", 30.0),
    ]
    assert len(got) == 14


def test_several_gpus_in_unstable_order_are_an_error_naming_count_and_column(run_cli, db, tmp_path):
    path = tmp_path / "node4.csv"
    path.write_text(_multi_gpu_without_identity([4, 3, 4, 4]))
    code, _out, err = run_cli("--db", str(db), "ingest", "gpu", str(path))
    assert code == 2
    assert err == (
        f"Error: {path}: cannot tell GPUs apart: samples hold 3 to 4 rows (up to 4 GPUs) and "
        f"there is no index, uuid or pci.bus_id column; add index to the query: {QUERY_COMMAND}\n"
    )
    assert not db.exists()  # a refused first import leaves no warehouse


# -- encodings ------------------------------------------------------------------------------
def test_powershell_utf16le_log_imports(run_cli, db):
    path = DATA / "powershell-utf16le.csv"
    assert path.read_bytes()[:2] == b"\xff\xfe" and b"\r\x00\n\x00" in path.read_bytes()
    code, out, err = run_cli("--db", str(db), "ingest", "gpu", str(path))
    assert code == 0, err
    assert out.startswith("imported 6 GPU samples")
    got = samples(db)
    assert got[0][1:] == (
        "0",
        datetime(2026, 1, 12, 9, 30, 0, 251000),
        12.0,
        1480.0,
        24564.0,
        pytest.approx(31.52, abs=1e-4),
        "NVIDIA GeForce RTX 4090",
    )


@pytest.mark.parametrize(
    ("encoding", "bom"),
    [
        ("utf-16-le", b"\xff\xfe"),
        ("utf-16-be", b"\xfe\xff"),
        ("utf-8", b"\xef\xbb\xbf"),
        ("utf-8", b""),
    ],
)
def test_accepted_encodings_give_the_same_samples(run_cli, tmp_path, encoding, bom):
    text = (DATA / "one-gpu-name-util-temp.csv").read_text()
    path = tmp_path / "ws.csv"
    path.write_bytes(bom + text.encode(encoding))
    reference = tmp_path / "ref.duckdb"
    plain = tmp_path / "ws-plain" / "ws.csv"
    plain.parent.mkdir()
    plain.write_text(text)
    assert run_cli("--db", str(reference), "ingest", "gpu", str(plain))[0] == 0
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "gpu", str(path))
    assert code == 0, err
    assert samples(db) == samples(reference)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "timestamp, index, utilization.gpu [%]\n".encode("utf-16-le"),
            "UTF-16 text without a byte-order mark; save the file as UTF-8",
        ),
        (
            b"\xff\xfe\x00\x00" + "timestamp, index\n".encode("utf-32-le"),
            "UTF-32 text (byte-order mark); save the file as UTF-8",
        ),
        (
            b"\xff\xfe"
            + "timestamp, index, utilization.gpu [%]\n2026/01/12 09:30:00.000, 0, 5\n".encode(
                "utf-16-le"
            )
            + b"\x00\xd8\x41\x00\n\x00",
            ":3: invalid UTF-16-LE",
        ),
        (
            b"timestamp, index, name, utilization.gpu [%]\n2026/01/12 09:30:00.000, 0, Quadro caf\xe9, 5\n",
            ":2: invalid UTF-8 (byte 0xe9 at column 39)",
        ),
    ],
)
def test_other_encodings_are_input_errors_naming_the_problem(
    run_cli, db, tmp_path, content, message
):
    path = tmp_path / "gpu.csv"
    path.write_bytes(content)
    code, _, err = run_cli("--db", str(db), "ingest", "gpu", str(path))
    assert code == 2
    assert err.startswith(f"Error: {path}")
    assert message in err
    assert "Traceback" not in err


# -- a file still being written ---------------------------------------------------------------
def test_live_file_last_line_incomplete_is_skipped_with_a_note(run_cli, db):
    path = DATA / "live-h100nvl.csv"
    assert path.read_text().endswith("95830 MiB,")
    code, out, err = run_cli("--db", str(db), "ingest", "gpu", str(path))
    assert code == 0, err
    assert out.startswith("imported 7 GPU samples from 1 file (7 lines read)")
    assert f"note: {path}: last line incomplete, skipped (a file still being written)\n" in err
    got = samples(db)
    assert got[-1][2] == datetime(2026, 2, 25, 10, 6, 20, 443000)
    assert {(g, m) for _, g, *_, m in got} == {("0", "NVIDIA H100 NVL")}


@pytest.mark.parametrize(
    "last",
    [
        "2026/11/16 10:02:00.000, 0, 7",  # whole, just no newline: kept
        "2026/11/16 10:02:0",  # cut in the timestamp
        "2026/11/16 10:02:00.000, 0,",  # cut before the value
    ],
)
def test_unterminated_last_line(run_cli, db, tmp_path, last):
    path = tmp_path / "n1.csv"
    path.write_text(
        "timestamp, index, utilization.gpu [%]\n2026/11/16 10:00:00.000, 0, 5\n"
        "2026/11/16 10:01:00.000, 0, 6\n" + last
    )
    code, _out, err = run_cli("--db", str(db), "ingest", "gpu", str(path))
    assert code == 0, err
    whole = last.endswith("7")
    assert count(db) == (3 if whole else 2)
    assert ("last line incomplete" in err) is not whole


def test_incomplete_line_elsewhere_is_a_bad_line(run_cli, db, tmp_path):
    path = tmp_path / "n1.csv"
    path.write_text(
        "timestamp, index, utilization.gpu [%]\n2026/11/16 10:00:00.000, 0, 5\n"
        "2026/11/16 10:01:00.000, 0,\n2026/11/16 10:02:00.000, 0, 7\n"
    )
    code, _, err = run_cli("--db", str(db), "ingest", "gpu", str(path))
    assert code == 2
    assert f"{path}:3:" in err
    assert not db.exists()


def test_dcgm_text_cut_mid_line_keeps_the_rest(run_cli, db, tmp_path):
    path = tmp_path / "dcgm.prom"
    path.write_text(
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n1"} 97 1794787200000\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",Hostname="n1"} 3 1794787200000\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n1"} 9'
    )
    code, _out, err = run_cli("--db", str(db), "ingest", "gpu", str(path))
    assert code == 0, err
    assert "last line incomplete" not in err  # "9" is a whole value: the line is read
    path.write_text(path.read_text()[:-4])
    db2 = db.with_name("w2.duckdb")
    code, _out, err = run_cli("--db", str(db2), "ingest", "gpu", str(path))
    assert code == 0, err
    assert "last line incomplete" in err
    assert count(db2) == 2


# -- the plain nvidia-smi table -----------------------------------------------------------------
@pytest.mark.parametrize("name", ["table-loop-driver550.txt", "table-loop-driver470.txt"])
def test_table_printout_is_refused_with_the_query_to_log_instead(run_cli, db, name):
    path = DATA / name
    code, _out, err = run_cli("--db", str(db), "ingest", "gpu", str(path))
    assert code == 2
    assert err == (
        f"Error: {path}: this is the nvidia-smi table printout, which cannot be read; "
        "log CSV instead: nvidia-smi --query-gpu=timestamp,index,uuid,name,utilization.gpu,"
        "memory.used,memory.total,power.draw --format=csv -l 60\n"
    )


# -- one rule for valid values across nvidia-smi, DCGM and Prometheus (issue 14, case 9) ------
INVALID = [
    ("util 250", {"util": "250"}, "utilization 250 is outside 0-100 %"),
    ("util -5", {"util": "-5"}, "utilization -5 is outside 0-100 %"),
    ("util NaN", {"util": "NaN"}, "utilization nan is outside 0-100 %"),
    ("util +Inf", {"util": "+Inf"}, "utilization inf is outside 0-100 %"),
    ("memory 1e30", {"mem": "1e30"}, "memory.used 1e+30 is outside"),
    ("year 1", {"year": 1}, "outside the years 1970-2200"),
    ("year 9999", {"year": 9999}, "outside the years 1970-2200"),
]


def _files(tmp_path, util="50", mem="1000", year=2026) -> dict:
    moment = datetime(2026, 11, 16, 10, 0)
    stamp_ms = int((moment - datetime(1970, 1, 1)).total_seconds() * 1000)
    if year != 2026:
        stamp_ms = int((datetime(year, 6, 1) - datetime(1970, 1, 1)).total_seconds() * 1000)
    smi = tmp_path / "smi.csv"
    smi.write_text(
        "timestamp, index, utilization.gpu [%], memory.used [MiB]\n"
        f"2026/11/16 09:59:00.000, 0, 40, 900\n{year:04d}/11/16 10:00:00.000, 0, {util}, {mem}\n"
    )
    dcgm = tmp_path / "dcgm.prom"
    dcgm.write_text(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",Hostname="n1"}} 40 {stamp_ms - 60_000 if year == 2026 else 1794823140000}\n'
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",Hostname="n1"}} {util} {stamp_ms}\n'
        f'DCGM_FI_DEV_FB_USED{{gpu="0",Hostname="n1"}} {mem} {stamp_ms}\n'
    )
    prom = tmp_path / "prom.json"
    prom.write_text(
        json.dumps(
            {
                "status": "success",
                "data": {
                    "resultType": "matrix",
                    "result": [
                        {
                            "metric": {
                                "__name__": "DCGM_FI_DEV_GPU_UTIL",
                                "gpu": "0",
                                "Hostname": "n1",
                            },
                            "values": [[1794823140, "40"], [stamp_ms / 1000, util]],
                        },
                        {
                            "metric": {
                                "__name__": "DCGM_FI_DEV_FB_USED",
                                "gpu": "0",
                                "Hostname": "n1",
                            },
                            "values": [[stamp_ms / 1000, mem]],
                        },
                    ],
                },
            }
        )
    )
    return {"nvidia-smi": smi, "dcgm": dcgm, "prometheus": prom}


@pytest.mark.parametrize("fmt", ["nvidia-smi", "dcgm", "prometheus"])
@pytest.mark.parametrize(("case", "values", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_one_rule_for_valid_values(run_cli, tmp_path, fmt, case, values, message):
    path = _files(tmp_path, **values)[fmt]
    db = tmp_path / "w.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "gpu", str(path))
    assert code == 2, out
    assert err.startswith(f"Error: {path}")
    assert message in err
    if fmt != "prometheus":
        assert f"{path}:2:" in err or f"{path}:3:" in err  # the line
    else:
        assert ".values[1]" in err or ".values[0]" in err  # the point
    assert not db.exists() or count(db) == 0
    code, out, err = run_cli("--db", str(db), "ingest", "gpu", "--skip-bad", str(path))
    assert code == 0, err
    assert f"skipped: {path}" in err
    con = duckdb.connect(str(db), read_only=True)
    stored = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE NOT isfinite(util_pct) OR util_pct NOT BETWEEN 0 AND 100 "
        "OR year(ts) NOT BETWEEN 1970 AND 2200) FROM gpu_samples"
    ).fetchall()[0]
    con.close()
    assert stored[0] >= 1 and stored[1] == 0


# -- Prometheus JSON of the wrong shape: exit 2 naming file and place, never exit 3 -----------
GOOD_SERIES = {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", "Hostname": "n1"}


def _prom(result) -> str:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (_prom({"metric": GOOD_SERIES}), "data.result: expected a list of series, got an object"),
        (_prom("DCGM_FI_DEV_GPU_UTIL"), "data.result: expected a list of series, got text"),
        (
            _prom([{"metric": ["gpu", "0"], "values": []}]),
            "data.result[0].metric: expected an object",
        ),
        (
            _prom([{"metric": {**GOOD_SERIES, "__name__": 7}, "values": []}]),
            "data.result[0].metric.__name__: expected a label text, got a number 7",
        ),
        (
            _prom([{"metric": {**GOOD_SERIES, "Hostname": ["n1", "n2"]}, "values": []}]),
            "data.result[0].metric.Hostname: expected a label text, got a list",
        ),
        (
            _prom([{"metric": GOOD_SERIES, "values": [{"t": 1794823140, "v": "40"}]}]),
            "data.result[0].values[0] (DCGM_FI_DEV_GPU_UTIL): expected a [time, value] pair, got an object",
        ),
        (
            _prom([{"metric": GOOD_SERIES, "values": [[1794823140, "40", "x"]]}]),
            "expected a [time, value] pair",
        ),
        (_prom([{"metric": GOOD_SERIES, "values": [["soon", "40"]]}]), "time: expected seconds"),
        (_prom([{"metric": GOOD_SERIES, "values": [[1e300, "40"]]}]), "is out of range"),
        (_prom([{"metric": GOOD_SERIES, "values": [[1794823140, 10**400]]}]), "is not a number"),
        (
            _prom([{"metric": GOOD_SERIES, "values": "[[1, 2]]"}]),
            "values: expected a list of points",
        ),
        (_prom([7]), "data.result[0]: expected a series object, got a number 7"),
        ('{"data": {"resultType": "matrix", "result": [[NaN, 1]]}}', "NaN is not JSON"),
        (_prom([{"metric": {**GOOD_SERIES, "Hostname": "\ud800"}, "values": []}]), "Hostname"),
        ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"data": ' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
    ],
)
def test_prometheus_json_of_the_wrong_shape(run_cli, db, tmp_path, content, message):
    path = tmp_path / "prom.json"
    path.write_text(content)
    code, out, err = run_cli("--db", str(db), "ingest", "gpu", str(path))
    assert code == 2, (out, err)
    assert err.startswith(f"Error: {path}")
    assert message in err
    assert "Traceback" not in err

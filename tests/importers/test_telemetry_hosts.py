"""A GPU sample belongs to the machine that wrote it: default host names that cannot collide.

Seen before the fix: nvidia-smi logs from five machines, each named ``gpu_usage.log``,
were merged into one host ``gpu_usage`` (the default host was the file stem), silently.
"""

from __future__ import annotations

import duckdb

from tests.helpers import SHARED

HEADER = "timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n"


def _log(path, model: str, util: int, minutes: int = 3) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        f"2026/11/16 10:0{m}:00.000, 0, {model}, {util} %, 1000 MiB, 81559 MiB\n"
        for m in range(minutes)
    ]
    path.write_text(HEADER + "".join(rows))


def _hosts(db) -> dict[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return dict(con.execute("SELECT host, count(*) FROM gpu_samples GROUP BY 1").fetchall())
    finally:
        con.close()


def test_files_of_one_name_from_several_machines_take_their_folder(tmp_path, run_cli):
    for machine in ("gpu-h01", "gpu-h02", "gpu-h03"):
        _log(tmp_path / "logs" / machine / "gpu_usage.log", "NVIDIA H100 80GB HBM3", 90)
    _log(tmp_path / "logs" / "solo.log", "NVIDIA H100 80GB HBM3", 50)
    db = tmp_path / "w.duckdb"
    files = sorted(str(p) for p in (tmp_path / "logs").rglob("*.log"))
    code, _out, err = run_cli("--db", str(db), "ingest", "gpu", *files)
    assert code == 0, err
    assert _hosts(db) == {"gpu-h01": 3, "gpu-h02": 3, "gpu-h03": 3, "solo": 3}
    assert "named after their folder" in err and "as host gpu-h02" in err


def test_folders_that_cannot_tell_them_apart_stop_the_import(tmp_path, run_cli):
    _log(tmp_path / "x" / "node" / "gpu.log", "NVIDIA A100-SXM4-80GB", 90)
    _log(tmp_path / "y" / "node" / "gpu.log", "NVIDIA A100-SXM4-80GB", 10)
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli(
        "--db",
        str(db),
        "ingest",
        "gpu",
        str(tmp_path / "x" / "node" / "gpu.log"),
        str(tmp_path / "y" / "node" / "gpu.log"),
    )
    assert code == 2
    assert "2 telemetry files are named gpu.log" in err and "--host NAME" in err


def test_two_machines_under_one_host_name_are_a_warning(tmp_path, run_cli):
    _log(tmp_path / "a.csv", "NVIDIA H100 80GB HBM3", 90)
    _log(tmp_path / "b.csv", "Tesla T4", 10)
    db = tmp_path / "w.duckdb"
    base = ("--db", str(db), "ingest", "gpu", "--host", "node7")
    assert run_cli(*base, str(tmp_path / "a.csv"))[0] == 0
    code, _, err = run_cli(*base, str(tmp_path / "b.csv"))
    assert code == 0
    # the same GPU index and times: the second machine's samples are kept out, and said so
    assert "3 samples of host node7 not imported" in err
    assert "from a NVIDIA H100 80GB HBM3 and these are from a Tesla T4" in err
    # other GPU indices at the same times: both kept, and the mix is a warning
    _log(tmp_path / "c.csv", "Tesla T4", 10)
    (tmp_path / "c.csv").write_text(
        (tmp_path / "c.csv").read_text().replace(", 0, Tesla", ", 3, Tesla")
    )
    code, _, err = run_cli(*base, str(tmp_path / "c.csv"))
    assert code == 0
    assert (
        "host node7 has samples of NVIDIA H100 80GB HBM3 and of Tesla T4 at the same times" in err
    )


def test_the_real_files_keep_their_names(tmp_path, run_cli):
    folder = SHARED / "nvidia-smi"
    if not folder.exists():
        return
    db = tmp_path / "w.duckdb"
    files = sorted(str(p) for p in folder.glob("*.csv"))
    assert run_cli("--db", str(db), "ingest", "gpu", *files)[0] == 0
    assert set(_hosts(db)) == {"query-gpu-8xH100", "query-gpu-4xT4", "query-gpu-1xT4-NA"}

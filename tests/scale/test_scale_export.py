"""Beyond one machine (docs/scale.md): the Hive-partitioned Parquet export is read by an
existing distributed engine, Dask on a cluster of worker processes, and answers as the
warehouse does."""

from __future__ import annotations

import dask.dataframe as dd
import duckdb
from distributed import Client, LocalCluster


def test_export_is_read_by_a_distributed_engine(demo_db, run_cli, tmp_path):
    target = tmp_path / "export"
    code, _out, err = run_cli("--db", str(demo_db["db"]), "export", "--parquet", str(target))
    assert code == 0, err
    con = duckdb.connect(str(demo_db["db"]), read_only=True)
    utilisation = dict(
        con.execute("SELECT host, avg(util_pct) FROM gpu_samples GROUP BY host").fetchall()
    )
    runs_per_source = dict(
        con.execute("SELECT source_id, count(*) FROM runs GROUP BY source_id").fetchall()
    )
    con.close()
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster),
    ):
        samples = dd.read_parquet(str(target / "gpu_samples"), engine="pyarrow")
        by_host = samples.groupby("host")["util_pct"].mean().compute().to_dict()
        runs = dd.read_parquet(str(target / "runs"), engine="pyarrow")
        by_source = runs.groupby("source_id").size().compute().to_dict()
    # the partition columns (host=…, source_id=…) come back from the folder names
    assert {str(host) for host in by_host} == set(utilisation)
    for host, mean in utilisation.items():
        assert abs(by_host[host] - mean) < 1e-3, host
    assert {str(source): int(n) for source, n in by_source.items()} == runs_per_source
    assert sum(runs_per_source.values()) == 23

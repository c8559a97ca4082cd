"""A real PostgreSQL MLflow store, read through the optional ADBC driver."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers import free_port, log_reference_runs, warehouse_rows


def _pg_bindir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(candidates[-1]).parent if candidates else None


BINDIR = _pg_bindir()
pytestmark = pytest.mark.skipif(
    BINDIR is None, reason="PostgreSQL server binaries not installed (apt-get install postgresql)"
)


@contextmanager
def postgres_server():
    """initdb + pg_ctl in a temporary folder on a free port; as root, run as user postgres."""
    as_user: list[str] = []
    data = Path(tempfile.mkdtemp(prefix="audit-pg-"))
    if os.geteuid() == 0:
        account = pwd.getpwnam("postgres")
        os.chown(data, account.pw_uid, account.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    subprocess.run(
        [*as_user, str(BINDIR / "initdb"), "-D", str(data / "db"), "-A", "trust", "-U", "postgres"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *as_user,
            str(BINDIR / "pg_ctl"),
            "-D",
            str(data / "db"),
            "-l",
            str(data / "log"),
            "-w",
            "start",
            "-o",
            f"-p {port} -k {data} -c listen_addresses=127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*as_user, str(BINDIR / "pg_ctl"), "-D", str(data / "db"), "-m", "fast", "stop"],
            capture_output=True,
        )
        shutil.rmtree(data, ignore_errors=True)


def test_postgres_store_matches_sqlite_store(server, run_cli, tmp_path):
    with postgres_server() as uri:
        log_reference_runs(uri)
        via_pg, via_sqlite = tmp_path / "pg.duckdb", tmp_path / "sqlite.duckdb"
        code, out, err = run_cli("--db", str(via_pg), "ingest", "mlflow", "--tracking-uri", uri)
        assert code == 0, err
        assert out.startswith(
            "imported 6 new or changed runs (0 unchanged) from postgresql://127.0.0.1:"
        )
        assert (
            run_cli(
                "--db",
                str(via_sqlite),
                "ingest",
                "mlflow",
                "--tracking-uri",
                f"sqlite:///{server['backend']}",
            )[0]
            == 0
        )
        pg_rows, sqlite_rows = warehouse_rows(via_pg), warehouse_rows(via_sqlite)
        for table in (
            "params",
            "tags",
            "metrics",
            "latest_metrics",
            "dataset_inputs",
            "model_versions",
            "experiments",
        ):
            assert pg_rows[table] == sqlite_rows[table], table
        assert pg_rows["runs"] == sqlite_rows["runs"]
        code, out, _ = run_cli("--db", str(via_pg), "ingest", "mlflow", "--tracking-uri", uri)
        assert out.startswith("imported 0 new or changed runs (6 unchanged)")


def test_unreachable_postgres_is_a_clear_error(run_cli, tmp_path):
    uri = f"postgresql://postgres:s3cret@127.0.0.1:{free_port()}/mlflow"
    code, _out, err = run_cli(
        "--db", str(tmp_path / "w.duckdb"), "ingest", "mlflow", "--tracking-uri", uri
    )
    assert code == 2
    assert err.startswith(
        f"Error: postgresql://127.0.0.1:{uri.rsplit(':', 1)[1].split('/')[0]}/mlflow: cannot connect"
    )
    assert "s3cret" not in err
    assert "Traceback" not in err

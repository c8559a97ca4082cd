"""Bad input ends in one clear line and exit 2, never a traceback, and writes nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import duckdb
import pytest

from tests.helpers import REPO, free_port

SAMPLE = REPO / "sample_logs" / "mlruns"


def _one_line_error(code: int, out: str, err: str, expected: str) -> None:
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    assert err.startswith("Error: ")
    assert err.count("\n") == 1
    assert expected in err, err


def _make_file_store_with(tmp_path: Path, relpath: str, content: str) -> Path:
    store = tmp_path / "store"
    import shutil

    shutil.copytree(SAMPLE, store)
    target = next(store.glob(relpath))
    target.write_text(content)
    return store


@pytest.mark.parametrize(
    ("uri_of", "expected"),
    [
        (lambda p: str(p / "nope"), "no such MLflow file store (folder not found)"),
        (
            lambda p: f"sqlite:///{p}/nope.db",
            "no such SQLite file; check the path after sqlite:///",
        ),
        (lambda p: "sqlite://relative.db", "SQLite URIs look like sqlite:///relative.db"),
        (lambda p: "mysql://user:secret@db/mlflow", "unsupported tracking URI scheme 'mysql'"),
        (lambda p: str(p / "empty"), "empty folder, not an MLflow file store"),
        (lambda p: f"sqlite:///{p / 'text.db'}", "cannot read (file is not a database)"),
        (lambda p: f"sqlite:///{p / 'other.db'}", "not an MLflow tracking database"),
        (lambda p: f"sqlite:///{p / 'empty'}", "is a directory"),
        (lambda p: str(p / "text.db"), "is a file; a SQLite store is passed as sqlite:///"),
        (lambda p: "   ", "empty tracking URI"),
    ],
)
def test_bad_sources(tmp_path, run_cli, uri_of, expected):
    (tmp_path / "empty").mkdir()
    (tmp_path / "text.db").write_text("this is not sqlite\n" * 100)
    other = sqlite3.connect(tmp_path / "other.db")
    other.execute("CREATE TABLE t (x)")
    other.commit()
    other.close()
    db = tmp_path / "w.duckdb"
    code, out, err = run_cli(
        "--db", str(db), "ingest", "mlflow", "--tracking-uri", uri_of(tmp_path)
    )
    _one_line_error(code, out, err, expected)
    assert "secret" not in err


def test_damaged_file_store_names_the_file_and_writes_nothing(tmp_path, run_cli):
    db = tmp_path / "w.duckdb"
    assert run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", str(SAMPLE))[0] == 0
    store = _make_file_store_with(
        tmp_path, "*/*/metrics/train/loss", "1794787200000 0.5 0\nnot a metric line\n"
    )
    code, out, err = run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", str(store))
    _one_line_error(code, out, err, "/metrics/train/loss:2: expected 'timestamp value [step]'")
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM sources").fetchall() == [(1,)]
    assert con.execute("SELECT count(*) FROM runs").fetchall() == [(20,)]
    con.close()


def test_damaged_meta_yaml(tmp_path, run_cli):
    store = _make_file_store_with(tmp_path, "*/*/meta.yaml", "run_id: [unclosed\n")
    code, out, err = run_cli(
        "--db", str(tmp_path / "w.duckdb"), "ingest", "mlflow", "--tracking-uri", str(store)
    )
    _one_line_error(code, out, err, "cannot read MLflow metadata")


def test_unreachable_server_is_retried_then_exit_2(tmp_path, run_cli):
    config = tmp_path / "audit.toml"
    config.write_text(
        "[mlflow]\nhttp_max_retries = 2\nhttp_backoff_seconds = 0.01\nhttp_timeout_seconds = 2\n"
    )
    db = tmp_path / "w.duckdb"
    url = f"http://user:hunter2@127.0.0.1:{free_port()}"
    code, out, err = run_cli(
        "--db", str(db), "--config", str(config), "ingest", "mlflow", "--tracking-uri", url
    )
    _one_line_error(
        code, out, err, "experiments/search still failing after 3 attempts (ConnectionError)"
    )
    assert "hunter2" not in err


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        (
            "[mlflow]\npage_sise = 10\n",
            "unknown key 'page_sise' in [mlflow]; valid keys: http_backoff_seconds, http_concurrency, http_max_retries, http_timeout_seconds, max_response_mb, page_size",
        ),
        (
            "[clusters]\ntimezone = 'UTC'\n",
            "unknown section [clusters]; valid sections: attribution, cluster, cost, evaluations, links, materiality, metrics, mlflow, prices, prometheus, rules, shift, sql, suppress, watch",
        ),
        ("[cluster]\ntimezone = 'Mars/Olympus'\n", "is not an IANA time zone"),
        ("[mlflow]\nhttp_max_retries = 'five'\n", "http_max_retries must be int, got 'five'"),
        ("[mlflow\n", "invalid TOML"),
    ],
)
def test_bad_config(tmp_path, run_cli, toml, expected):
    config = tmp_path / "audit.toml"
    config.write_text(toml)
    code, out, err = run_cli(
        "--db",
        str(tmp_path / "w.duckdb"),
        "--config",
        str(config),
        "ingest",
        "mlflow",
        "--tracking-uri",
        str(SAMPLE),
    )
    _one_line_error(code, out, err, expected)


def test_config_is_a_directory(tmp_path, run_cli):
    code, out, err = run_cli(
        "--config",
        str(tmp_path),
        "--db",
        str(tmp_path / "w.duckdb"),
        "ingest",
        "mlflow",
        "--tracking-uri",
        str(SAMPLE),
    )
    _one_line_error(code, out, err, "is a directory, expected a TOML file")


def test_status_without_warehouse(tmp_path, run_cli):
    code, out, err = run_cli("--db", str(tmp_path / "none.duckdb"), "status")
    _one_line_error(code, out, err, "no warehouse at")
    assert not (tmp_path / "none.duckdb").exists()


def test_db_is_a_directory(tmp_path, run_cli):
    code, _out, err = run_cli("--db", str(tmp_path), "status")
    assert code == 2
    assert "Traceback" not in err


def test_missing_option_is_usage_error(run_cli):
    code, _, err = run_cli("ingest", "mlflow", env={"MLFLOW_TRACKING_URI": ""})
    assert code == 2
    assert "Missing option '--tracking-uri'" in err


def test_a_command_imports_only_its_own_module():
    """Commands are found by name without importing every command module (the rule engine
    and report renderers stay out of an import's start-up), and the name map is complete."""
    import subprocess
    import sys

    script = (
        "import sys, click\n"
        "from audit.cli import cli, _COMMAND_MODULES\n"
        "ctx = click.Context(cli)\n"
        "assert cli.get_command(ctx, 'ingest') is not None\n"
        "print(sorted(m for m in sys.modules if m.startswith('audit.cli.')))\n"
        "print(sorted(cli.list_commands(ctx)) == sorted(_COMMAND_MODULES))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.splitlines()
    assert out == ["['audit.cli.ingest', 'audit.cli.options']", "True"]

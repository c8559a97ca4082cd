"""Tokens and passwords never reach the warehouse, reports, logs or messages.

Credentials travel in the tracking URI (user:password@host), in MLFLOW_TRACKING_TOKEN and
MLFLOW_TRACKING_PASSWORD, and in a Postgres DSN. Every artefact audit writes or prints is
then searched for them: the DuckDB file (after a checkpoint, with its WAL), every command's
stdout and stderr (success and failure paths), the HTML, Markdown and JSON reports, scan
output and the prune plan.
"""

from __future__ import annotations

import socket

import duckdb

TOKEN, PASSWORD, DB_PASSWORD = "tok-SECRET-4242", "pw-SECRET-9191", "pg-SECRET-7373"
SECRETS = (TOKEN, PASSWORD, DB_PASSWORD)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_credentials_appear_nowhere(server, run_cli, tmp_path):
    db = tmp_path / "w.duckdb"
    env = {"MLFLOW_TRACKING_TOKEN": TOKEN, "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    with_password = server["url"].replace("http://", f"http://bob:{PASSWORD}@")
    seen: list[str] = []

    def run(*args: str) -> int:
        code, out, err = run_cli("--db", str(db), *args, env=env)
        seen.append(out + err)
        return code

    assert run("ingest", "mlflow", "--tracking-uri", with_password) == 0
    assert run("ingest", "mlflow", "--tracking-uri", with_password) == 0  # incremental path
    # failure paths: the messages name the source without its credentials
    dead = f"http://bob:{PASSWORD}@127.0.0.1:{_free_port()}"
    assert run("ingest", "mlflow", "--tracking-uri", dead) == 2
    assert run("ingest", "mlflow", "--tracking-uri", f"mysql://bob:{DB_PASSWORD}@db/mlflow") == 2
    assert (
        run(
            "ingest",
            "mlflow",
            "--tracking-uri",
            f"postgresql://bob:{DB_PASSWORD}@127.0.0.1:{_free_port()}/mlflow",
        )
        == 2
    )
    assert run("status") == 0
    assert run("scan") in (0, 1)
    assert run("scan", "--format", "json") in (0, 1)
    assert run("runs", "search", "attributes.status = 'FINISHED'", "--format", "json") == 0
    assert run("sql", "select * from sources") == 0
    reports = []
    for fmt in ("html", "md", "json"):
        target = tmp_path / f"weekly.{fmt}"
        assert (
            run("report", "weekly", "--week", "2026-W47", "--format", fmt, "--output", str(target))
            == 0
        )
        reports.append(target.read_text())
    plan = tmp_path / "plan.json"
    run("prune", "--plan", str(plan))
    if plan.exists():
        reports.append(plan.read_text())

    con = duckdb.connect(str(db))
    con.execute("CHECKPOINT")
    con.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("w.duckdb*"))
    for secret in SECRETS:
        assert secret.encode() not in stored, f"{secret} is in the warehouse"
        for text in seen + reports:
            assert secret not in text
    assert "bob:" not in "".join(seen + reports)  # not even the user part of the URI
    assert any("127.0.0.1" in text for text in seen)  # the sources are still named

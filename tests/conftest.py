from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from audit.cli import cli
from tests.helpers import log_reference_runs, mlflow_server

os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """A real mlflow server with the reference runs logged through HTTP by the client."""
    workdir = tmp_path_factory.mktemp("mlflow-server")
    with mlflow_server(workdir) as (url, backend):
        ids = log_reference_runs(url)
        yield {"url": url, "backend": backend, "ids": ids}


@pytest.fixture
def run_cli(tmp_path):
    """Invoke the CLI in-process; returns (exit_code, stdout, stderr)."""
    runner = CliRunner()

    def invoke(*args: str, env: dict | None = None):
        result = runner.invoke(cli, list(args), env=env, catch_exceptions=False)
        return result.exit_code, result.stdout, result.stderr

    return invoke


@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "audit.duckdb"

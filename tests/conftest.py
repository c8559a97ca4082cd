"""The test suite, by layer: each folder holds the tests of one layer of the tool, so a
change to a layer names the tests to run first.

- ``unit/``: one library module in process (warehouse, allocator, facts, the filter
  evaluator, the layering of imports), no CLI and no source files.
- ``importers/``: each source read into the warehouse (MLflow stores and servers, W&B and
  the other file trackers, Slurm, telemetry, Prometheus, checkpoints and links, redaction).
- ``rules/``: rules and the scan: the cases in ``cases/``, rules on real and logged runs,
  the accuracy against the expert verdicts, the plug-in example.
- ``cli/``: commands as a user calls them: errors, language, docs and packaging, gate,
  prune, queries, status, watch.
- ``reports/``: the weekly and scan reports and their figures.
- ``robustness/``: hostile, broken and random input (corpora, fuzzing and properties that
  attack), kill -9, Ctrl-C, concurrency, full disks, secrets. ``test_extreme_warehouse``
  is here: extreme values, not size.
- ``scale/``: the benchmark harness and what lies beyond one machine.

Shared parts stay at this level: ``helpers.py`` (functions), this conftest (fixtures every
layer uses; a layer's own fixtures in its conftest), ``cases/``, ``data/``, ``golden/``,
the example plug-ins, ``accuracy/`` (``python -m tests.accuracy``), and the parts a few
tests start (``slurm_cluster.py``, ``hostile_cases.py``, ``watch_parts.py``,
``docs_pages.py``).
"""

from __future__ import annotations

import os
import shutil

# MLflow's usage telemetry (on by default since 3.x) would try the network from every test
# process and mlflow server, and its thread sets and unsets _MLFLOW_TELEMETRY_SESSION_ID in
# os.environ while a request iterates os.environ for proxies (a KeyError seen in CI). Set
# before anything imports mlflow; server subprocesses inherit it.
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import settings

from audit.cli import cli
from audit.warehouse import open_warehouse
from tests.helpers import REPO, log_reference_runs, mlflow_server

SAMPLE = REPO / "sample_logs"

os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")

# `make test` (and so CI) replays the same examples every time, so a red run is
# reproducible and never depends on the seed of the day; `make fuzz` explores new ones
# and keeps what fails in .hypothesis/ for the next replay.
settings.register_profile("replay", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("AUDIT_HYPOTHESIS", "replay"))


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


@pytest.fixture(scope="session")
def schema_warehouse(tmp_path_factory):
    """An empty warehouse whose tables audit's own migrations made (tests write no DDL of
    warehouse tables), shared by the session: a test writes its rows inside
    ``tests.helpers.rolled_back`` so the next one finds it empty again."""
    with open_warehouse(tmp_path_factory.mktemp("schema") / "w.duckdb") as warehouse:
        yield warehouse


@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "audit.duckdb"


@pytest.fixture(scope="session")
def demo_db(tmp_path_factory):
    """The sample week imported exactly as `make demo` does it, through the real CLI."""
    work = tmp_path_factory.mktemp("demo")
    scratch = work / "scratch"
    subprocess.run(
        [sys.executable, str(SAMPLE / "make_checkpoints.py"), str(scratch)],
        check=True,
        capture_output=True,
    )
    config = work / "audit.toml"
    config.write_text(f'[links]\npath_prefixes = {{ "/scratch" = "{scratch}" }}\n')
    db = work / "demo.duckdb"
    base = [sys.executable, "-m", "audit", "--db", str(db), "--config", str(config)]
    for args in (
        ["ingest", "mlflow", "--tracking-uri", str(SAMPLE / "mlruns")],
        ["ingest", "slurm", str(SAMPLE / "slurm" / "week47.sacct")],
        ["ingest", "gpu", *sorted(str(p) for p in (SAMPLE / "gpu").glob("*.csv"))],
        ["ingest", "checkpoints", str(scratch)],
        ["ingest", "wandb", str(SAMPLE / "wandb")],
    ):
        subprocess.run([*base, *args], check=True, capture_output=True, cwd=work)
    status = subprocess.run(
        [*base, "status"], check=True, capture_output=True, text=True, cwd=work
    ).stdout
    return {"db": db, "status": status, "scratch": scratch, "config": config}


def pytest_addoption(parser):
    parser.addoption(
        "--regenerate-golden",
        action="store_true",
        help="rewrite tests/golden/* from the current output",
    )


@pytest.fixture
def fresh_demo_db(demo_db, tmp_path):
    """A copy of the sample-week warehouse without any stored scan (scan ids start at 1) or
    stored report."""

    import duckdb

    db = tmp_path / "demo.duckdb"
    shutil.copy(demo_db["db"], db)
    con = duckdb.connect(str(db))
    for table in ("scans", "findings", "rule_results", "report_models"):
        con.execute(f"DELETE FROM {table}")
    con.close()
    return {**demo_db, "db": db}

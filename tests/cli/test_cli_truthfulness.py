"""Every command tells the truth: no report on a warehouse it just created, no ignored
settings file, no traceback into a closed pipe, no damaged file read as a bug, and the
documentation agrees with the code."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import duckdb
import pytest

from audit.docs import iter_commands
from audit.warehouse import SCHEMA_VERSION
from audit.warehouse.migrations import MIGRATIONS
from tests.docs_pages import command_path, shell_command_lines, user_pages
from tests.helpers import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
SCHEMA_DOC = (REPO / "docs" / "schema.md").read_text(encoding="utf-8")

# One valid invocation of every command that reads an existing warehouse
READERS = [
    ("status",),
    ("scan",),
    ("scan", "--format", "json"),
    ("report", "weekly", "--week", "2026-W47", "--format", "md"),
    ("runs", "search"),
    ("runs", "similar", "--param", "learning_rate=1e-5"),
    ("runs", "compare", "5a7bde3db006447f", "9339f45d8ecb4aa8"),
    ("sql", "select 1"),
    ("gate", "5a7bde3db006447fb77bc3295fc96c7f"),
    ("prune",),
]


@pytest.mark.parametrize("args", READERS, ids=[" ".join(a) for a in READERS])
def test_only_imports_create_a_warehouse(args, tmp_path, run_cli):
    missing = tmp_path / "mistyped.duckdb"
    code, out, err = run_cli("--db", str(missing), *args)
    assert code == 2, (out, err)
    assert f"no warehouse at {missing}" in err
    assert not missing.exists()
    assert "$0" not in out


def test_an_import_creates_the_warehouse(tmp_path, run_cli):
    db = tmp_path / "new.duckdb"
    sacct = REPO / "sample_logs" / "slurm" / "week47.sacct"
    code, _out, err = run_cli("--db", str(db), "ingest", "slurm", str(sacct))
    assert code == 0, err
    assert db.exists()


def _leaf_commands() -> list[tuple[str, ...]]:
    return [path[1:] for path, command in iter_commands() if not isinstance(command, click.Group)]


# arguments that make each command valid apart from the --config
ARGUMENTS = {
    ("gate",): ["5a7bde3db006447fb77bc3295fc96c7f"],
    ("ingest", "checkpoints"): ["/nonexistent-root"],
    ("ingest", "gpu"): ["/nonexistent.csv"],
    ("ingest", "mlflow"): ["--tracking-uri", "/nonexistent-store"],
    ("ingest", "slurm"): ["/nonexistent.sacct"],
    ("rules", "explain"): ["DUP001"],
    ("runs", "compare"): ["5a7b", "9339"],
    ("runs", "similar"): ["--param", "a=1"],
    ("sql",): ["select 1"],
    ("export",): ["--parquet", "/nonexistent-folder/x"],
}


@pytest.mark.parametrize("command", _leaf_commands(), ids=" ".join)
def test_a_missing_config_is_an_error_for_every_command(command, demo_db, tmp_path, run_cli):
    db = tmp_path / "demo.duckdb"
    shutil.copyfile(demo_db["db"], db)
    missing = tmp_path / "audit-typo.toml"
    args = [*command, *ARGUMENTS.get(command, [])]
    code, out, err = run_cli("--db", str(db), "--config", str(missing), *args)
    assert code == 2, (out, err)
    assert err == f"Error: config {missing}: no such file\n"


CLOSED_PIPE = [
    ("status",),
    ("rules", "list"),
    ("runs", "search"),
    ("scan",),
    ("sql", "select * from range(100)"),
    ("--help",),
]


@pytest.mark.parametrize("args", CLOSED_PIPE, ids=" ".join)
def test_output_into_a_closed_pipe_stops_quietly(args, demo_db, tmp_path):
    """`audit status | head -2`: the reader is gone before audit writes."""
    db = tmp_path / "demo.duckdb"
    shutil.copyfile(demo_db["db"], db)
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "audit", "--db", str(db), *args],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            timeout=120,
        )
    finally:
        os.close(writer)
    assert done.stderr == ""
    assert done.returncode == 141


TRUNCATIONS = {"half": 0.5, "a tenth": 0.1, "last 1000 bytes cut": -1000}
READS = [("status",), ("scan",), ("runs", "search"), ("sql", "select count(*) from metrics")]


@pytest.mark.parametrize("cut", list(TRUNCATIONS))
@pytest.mark.parametrize("args", READS, ids=" ".join)
def test_a_truncated_warehouse_is_an_input_error(cut, args, demo_db, tmp_path, run_cli):
    """DuckDB reads blocks lazily: a command whose blocks are all there answers (whole);
    one that reaches a missing block says the file is damaged, exit 2."""
    whole = demo_db["db"].read_bytes()
    keep = TRUNCATIONS[cut]
    db = tmp_path / "cut.duckdb"
    db.write_bytes(whole[: int(len(whole) * keep)] if keep > 0 else whole[:keep])
    code, out, err = run_cli("--db", str(db), *args)
    assert code in (0, 2), (out, err)
    if code == 2:
        assert err.startswith(f"Error: warehouse {db} is damaged (IO Error: ")
        assert "restore it from a backup" in err
    if cut == "a tenth" and args[0] in ("status", "scan"):
        assert code == 2  # these read every table: the damage cannot go unnoticed


def test_scan_writes_the_html_report_the_docs_show(demo_db, tmp_path, run_cli):
    db = tmp_path / "demo.duckdb"
    shutil.copyfile(demo_db["db"], db)
    reports = (REPO / "docs" / "reports.md").read_text(encoding="utf-8")
    assert "audit scan --format html --output scan.html" in reports
    target = tmp_path / "scan.html"
    code, out, err = run_cli(
        "--db",
        str(db),
        "--config",
        str(demo_db["config"]),
        "scan",
        "--format",
        "html",
        "--output",
        str(target),
    )
    assert code == 0, err
    assert out.startswith(f"wrote {target} (")
    assert target.read_text().startswith("<!DOCTYPE html>")
    code, _out, err = run_cli("--db", str(db), "scan", "--format", "html")
    assert code == 2 and "--format html needs --output PATH" in err


def test_runs_compare_takes_unique_prefixes(demo_db, tmp_path, run_cli):
    db = tmp_path / "demo.duckdb"
    shutil.copyfile(demo_db["db"], db)
    code, full, err = run_cli(
        "--db",
        str(db),
        "runs",
        "compare",
        "5a7bde3db006447fb77bc3295fc96c7f",
        "9339f45d8ecb4aa89787a91399d9898d",
    )
    assert code == 0, err
    for short in (("5a7bde3db006447f", "9339f45d8ecb4aa8"), ("5a7b", "9339")):
        code, out, err = run_cli("--db", str(db), "runs", "compare", *short)
        assert code == 0, err
        assert out == full
    code, _out, err = run_cli("--db", str(db), "runs", "compare", "5a7", "9339")
    assert code == 2
    assert "no run '5a7' in the warehouse (a prefix needs at least 4 characters)" in err
    twins = tmp_path / "twins.duckdb"
    shutil.copyfile(demo_db["db"], twins)
    con = duckdb.connect(str(twins))
    con.execute(
        "INSERT INTO runs (source_id, run_id, name) SELECT source_id, '5a7b0000', 'twin' FROM runs LIMIT 1"
    )
    con.close()
    code, _out, err = run_cli("--db", str(twins), "runs", "compare", "5a7b", "9339")
    assert code == 2
    assert (
        "run id prefix '5a7b' is ambiguous: it starts 5a7b0000 (twin), "
        "5a7bde3db006447fb77bc3295fc96c7f (sft-qwen-lr2e-5); give more characters" in err
    )


def test_sql_without_rows_says_no_rows(demo_db, run_cli):
    code, out, err = run_cli(
        "--db", str(demo_db["db"]), "sql", "select run_id, name from runs where false"
    )
    assert code == 0, err
    assert out == "no rows (run_id, name)\n"


# -- documentation against the code ---------------------------------------------------------
DOC_COMMANDS = shell_command_lines(user_pages())


def test_the_docs_have_command_examples():
    assert len(DOC_COMMANDS) >= 40


@pytest.mark.parametrize(
    "args", [args for _, args in DOC_COMMANDS], ids=[f"{p}: {' '.join(a)}" for p, a in DOC_COMMANDS]
)
def test_every_documented_example_is_accepted_by_the_cli(args):
    try:
        command_path(args)
    except click.UsageError as exc:
        pytest.fail(f"the docs show `audit {shlex.join(args)}`, the CLI refuses it: {exc}")


def test_the_documented_schema_version_is_the_code_s():
    assert re.search(r"^# Warehouse schema \(version (\d+)\)", SCHEMA_DOC, re.M)[1] == str(
        SCHEMA_VERSION
    )
    for number in range(2, len(MIGRATIONS) + 1):
        assert re.search(rf"^## Version {number}: ", SCHEMA_DOC, re.M), (
            f"docs/schema.md lacks version {number}"
        )
    pages = "".join(page.read_text(encoding="utf-8") for page in user_pages())
    shown = re.findall(r"\(schema v(\d+)\)", pages)
    assert shown and set(shown) == {str(SCHEMA_VERSION)}


def test_readme_says_how_to_use_the_demo_warehouse():
    makefile = (REPO / "Makefile").read_text()
    demo = re.search(r"^DEMO := \S+ --db \$\(OUT\)/(\S+) --config (\S+)$", makefile, re.M)
    assert f"export AUDIT_DB=out/{demo[1]} AUDIT_CONFIG={demo[2]}" in README
    assert f"--db out/{demo[1]} --config {demo[2]}" in README


def test_the_demo_instructions_work(demo_db, tmp_path):
    """What the README tells a new user to type after `make demo`."""
    out = tmp_path / "out"
    out.mkdir()
    shutil.copyfile(demo_db["db"], out / "demo.duckdb")
    shutil.copytree(
        REPO / "sample_logs", tmp_path / "sample_logs", ignore=shutil.ignore_patterns("mlruns")
    )
    env = {**os.environ, "AUDIT_DB": "out/demo.duckdb", "AUDIT_CONFIG": "sample_logs/audit.toml"}
    done = subprocess.run(
        [sys.executable, "-m", "audit", "status"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"warehouse out/demo.duckdb (schema v{SCHEMA_VERSION})")
    assert Path(tmp_path / "out" / "demo.duckdb").exists()

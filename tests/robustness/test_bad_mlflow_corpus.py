"""A corpus of hostile MLflow sources: file stores, SQLite stores and tracking servers.

Each case damages a real store (the sample file store written by the MLflow client, a
SQLite store written by the client through ``log_reference_runs``) or rewrites the answers
of a real ``mlflow server``, then imports it through the real command in its own process,
with a time limit and an address-space limit (a hang or a runaway read fails the case
instead of the machine). The verdict is the corpus's: exit 2 naming the file (and line)
or the run and field, or exit 0 when the input is still usable; never a traceback;
nothing written on a rejection. The tally goes to ``test-artifacts/bad-mlflow-inputs.txt``
at the end of a session that ran every case.
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from audit.cli import cli
from tests.helpers import REPO, CorpusTally, bound_address_space, log_reference_runs, table_counts

SAMPLE_STORE = REPO / "sample_logs" / "mlruns"
TIME_LIMIT_S = 90


# -- the file store ------------------------------------------------------------------------
def _experiment(store: Path) -> Path:
    return next(p for p in sorted(store.iterdir()) if (p / "meta.yaml").is_file() and p.name != "0")


def _run(store: Path) -> Path:
    return next(p for p in sorted(_experiment(store).iterdir()) if (p / "meta.yaml").is_file())


def _param(store: Path) -> Path:
    return _run(store) / "params" / "learning_rate"


def _replace_with_link(path: Path, target: str) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    path.symlink_to(target)


def _replace_with_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _replace_with_socket(path: Path) -> None:
    path.unlink()
    here = os.getcwd()
    os.chdir(path.parent)  # a socket path is limited to 108 bytes; a relative one is short
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path.name)
    finally:
        os.chdir(here)


def _edit_yaml(path: Path, field: str, value: str) -> None:
    """Set a top-level field of a meta.yaml to ``value`` (YAML source text)."""
    lines = path.read_text().splitlines()
    kept, skipping = [], False
    for line in lines:
        if line.startswith(f"{field}:"):
            skipping = True  # the field and its indented continuation lines
            continue
        if skipping and line.startswith((" ", "-")):
            continue
        skipping = False
        kept.append(line)
    path.write_text("\n".join([*kept, f"{field}: {value}"]) + "\n")


def _run_meta(field: str, value: str):
    return lambda s: _edit_yaml(_run(s) / "meta.yaml", field, value)


def _experiment_meta(field: str, value: str):
    return lambda s: _edit_yaml(_experiment(s) / "meta.yaml", field, value)


def _input_link(store: Path) -> Path:
    return next((_run(store) / "inputs").iterdir()) / "meta.yaml"


def _dataset_meta(store: Path) -> Path:
    return next((_experiment(store) / "datasets").iterdir()) / "meta.yaml"


def _model_version_meta(store: Path) -> Path:
    return next((store / "models").iterdir()) / "version-1" / "meta.yaml"


def _metric_file(store: Path) -> Path:
    return _run(store) / "metrics" / "train" / "loss"


def _append_metric_line(line: bytes):
    def mutate(store: Path) -> None:
        with open(_metric_file(store), "ab") as fh:
            fh.write(b"\n" + line + b"\n")

    return mutate


def _run_folder_is_a_link(store: Path) -> None:
    run = _run(store)
    outside = store.parent / "outside-run"
    shutil.copytree(run, outside)
    _replace_with_link(run, str(outside))


def _sparse(path: Path, size: int) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(size)


def _rename_bytes(path: Path, new_name: bytes) -> None:
    os.rename(bytes(path), os.fsencode(path.parent) + b"/" + new_name)


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
)

# name -> (mutation of a copy of the sample store, text the rejection must contain)
FILE_STORE = {
    # links and special files in every folder that is walked
    "param is a link to /etc/hostname": (
        lambda s: _replace_with_link(_param(s), "/etc/hostname"),
        "learning_rate: is a symbolic link",
    ),
    "param is a broken link": (
        lambda s: _replace_with_link(_param(s), "/nonexistent/file"),
        "learning_rate: is a symbolic link",
    ),
    "param is a link to /dev/zero": (
        lambda s: _replace_with_link(_param(s), "/dev/zero"),
        "learning_rate: is a symbolic link",
    ),
    "param is a FIFO": (lambda s: _replace_with_fifo(_param(s)), "learning_rate: is a FIFO"),
    "param is a socket": (lambda s: _replace_with_socket(_param(s)), "learning_rate: is a socket"),
    "tag is a FIFO": (
        lambda s: _replace_with_fifo(_run(s) / "tags" / "team"),
        "team: is a FIFO",
    ),
    "metric file is a FIFO": (lambda s: _replace_with_fifo(_metric_file(s)), "loss: is a FIFO"),
    "params folder is a link to /etc": (
        lambda s: _replace_with_link(_run(s) / "params", "/etc"),
        "params: is a symbolic link",
    ),
    "nested metric folder is a link out": (
        lambda s: _replace_with_link(_run(s) / "metrics" / "train", "/tmp"),
        "train: is a symbolic link",
    ),
    "run folder is a link": (_run_folder_is_a_link, "is a symbolic link"),
    "experiment folder is a link": (
        lambda s: (s / "outside").symlink_to(_experiment(s)),
        "outside: is a symbolic link",
    ),
    ".trash is a link": (lambda s: (s / ".trash").symlink_to("/tmp"), ".trash: is a symbolic link"),
    "run meta.yaml is a link": (
        lambda s: _replace_with_link(_run(s) / "meta.yaml", "/etc/hostname"),
        "meta.yaml: is a symbolic link",
    ),
    "experiment meta.yaml is a link": (
        lambda s: _replace_with_link(_experiment(s) / "meta.yaml", "/etc/hostname"),
        "meta.yaml: is a symbolic link",
    ),
    "dataset input meta.yaml is a FIFO": (
        lambda s: _replace_with_fifo(_input_link(s)),
        "meta.yaml: is a FIFO",
    ),
    "dataset meta.yaml is a link": (
        lambda s: _replace_with_link(_dataset_meta(s), "/etc/hostname"),
        "meta.yaml: is a symbolic link",
    ),
    "model version meta.yaml is a link": (
        lambda s: _replace_with_link(_model_version_meta(s), "/etc/hostname"),
        "meta.yaml: is a symbolic link",
    ),
    "dataset source_id leads out of the store": (
        lambda s: _edit_yaml(_input_link(s), "source_id", "../../../../../../etc"),
        "is not the id of a dataset folder",
    ),
    # sizes
    "2 MB param value": (lambda s: _sparse(_param(s), 2 << 20), "learning_rate: 2,097,152 bytes"),
    "2 MB meta.yaml": (
        lambda s: (_run(s) / "meta.yaml").write_text(
            (_run(s) / "meta.yaml").read_text() + "#" * (2 << 20) + "\n"
        ),
        "meta.yaml: 2,",
    ),
    "300 MB sparse metric file": (
        lambda s: _sparse(_metric_file(s), 300 << 20),
        "loss: 314,572,800 bytes",
    ),
    # meta.yaml fields of the wrong type or beyond range
    "status is a list": (_run_meta("status", "[1, 2]"), "meta.yaml: status [1, 2] is not one of"),
    "status is unknown": (_run_meta("status", "9"), "meta.yaml: status 9 is not one of"),
    "source_type is a list": (_run_meta("source_type", "[1]"), "meta.yaml: source_type [1]"),
    "lifecycle_stage is a list": (
        _run_meta("lifecycle_stage", "[active]"),
        "meta.yaml: lifecycle_stage must be text, got a list",
    ),
    "user_id is a list": (_run_meta("user_id", "[1, 2]"), "meta.yaml: user_id must be text"),
    "run_name is a mapping": (
        _run_meta("run_name", "{a: 1}"),
        "meta.yaml: run_name must be text, got a mapping",
    ),
    "run_id is a list": (_run_meta("run_id", "[x]"), "meta.yaml: run_id must be text"),
    "artifact_uri is binary": (
        _run_meta("artifact_uri", "!!binary aGVsbG8="),
        "meta.yaml: artifact_uri must be text, got binary data",
    ),
    "start_time is .inf": (
        _run_meta("start_time", ".inf"),
        "meta.yaml: start_time must be a whole number, got float inf",
    ),
    "start_time is NaN": (_run_meta("start_time", ".nan"), "start_time must be a whole number"),
    "start_time has 26 digits": (
        _run_meta("start_time", "12345678901234567890123456"),
        "meta.yaml: start_time 12345678901234567890123456 is beyond the 64-bit integer range",
    ),
    "start_time is binary": (
        _run_meta("start_time", "!!binary aGVsbG8="),
        "meta.yaml: start_time must be a whole number, got binary data",
    ),
    "start_time is a boolean": (_run_meta("start_time", "true"), "start_time must be a whole"),
    "start_time is a date": (_run_meta("start_time", "2026-11-16"), "start_time must be a whole"),
    "start_time in microseconds": (
        _run_meta("start_time", "1794823200000000"),
        "start_time 1794823200000000 is not a time in epoch milliseconds between years 1970 and "
        "2200 (it looks like microseconds)",
    ),
    "start_time after year 9999": (
        _run_meta("start_time", "253402300800000"),
        "start_time 253402300800000 is not a time in epoch milliseconds",
    ),
    "start_time before year 1": (
        _run_meta("start_time", "-62135596800001"),
        "start_time -62135596800001 is not a time in epoch milliseconds",
    ),
    "end_time is text": (_run_meta("end_time", "soon"), "end_time must be a whole number"),
    "experiment name is a list": (
        _experiment_meta("name", "[a, b]"),
        "meta.yaml: name must be text, got a list",
    ),
    "experiment creation_time is NaN": (
        _experiment_meta("creation_time", ".nan"),
        "meta.yaml: creation_time must be a whole number",
    ),
    "experiment_id is a mapping": (
        _experiment_meta("experiment_id", "{a: 1}"),
        "meta.yaml: experiment_id must be text",
    ),
    "dataset name is a list": (
        lambda s: _edit_yaml(_dataset_meta(s), "name", "[a]"),
        "meta.yaml: name must be text",
    ),
    "dataset input tags is a list": (
        lambda s: _edit_yaml(_input_link(s), "tags", "[a]"),
        "meta.yaml: tags must be a mapping",
    ),
    "model version creation time is text": (
        lambda s: _edit_yaml(_model_version_meta(s), "creation_timestamp", "yesterday"),
        "meta.yaml: creation_timestamp must be a whole number",
    ),
    # YAML itself
    "alias bomb in meta.yaml": (
        lambda s: (_run(s) / "meta.yaml").write_text((_run(s) / "meta.yaml").read_text() + BOMB),
        "refused as an alias bomb",
    ),
    "recursive anchor in meta.yaml": (
        lambda s: (_run(s) / "meta.yaml").write_text(
            (_run(s) / "meta.yaml").read_text() + "loop: &a {x: *a}\n"
        ),
        "contains an alias of itself",
    ),
    "1,001-deep nesting": (
        lambda s: (_run(s) / "meta.yaml").write_text(
            (_run(s) / "meta.yaml").read_text() + "deep: " + "[" * 1001 + "]" * 1001 + "\n"
        ),
        "cannot read MLflow metadata",
    ),
    "python object tag": (
        _run_meta("user_id", "!!python/object/apply:os.system ['true']"),
        "cannot read MLflow metadata",
    ),
    "meta.yaml is a list": (
        lambda s: (_run(s) / "meta.yaml").write_text("- a\n- b\n"),
        "expected a YAML mapping",
    ),
    "meta.yaml is empty": (
        lambda s: (_run(s) / "meta.yaml").write_text(""),
        "expected a YAML mapping",
    ),
    "meta.yaml is not UTF-8": (
        lambda s: (_run(s) / "meta.yaml").write_bytes(b"user_id: \xff\xfe\n"),
        "meta.yaml",
    ),
    # metric files
    "metric timestamp beyond int64": (
        _append_metric_line(b"123456789012345678901234567890 1.0 3"),
        "loss:",
    ),
    "metric step beyond int64": (
        _append_metric_line(b"1794960000000 1.0 99999999999999999999"),
        "step 99999999999999999999 is beyond the 64-bit integer range",
    ),
    "metric timestamp in microseconds": (
        _append_metric_line(b"1794960000000000 1.0 3"),
        "timestamp 1794960000000000 is not a time in epoch milliseconds",
    ),
    "metric value is text": (_append_metric_line(b"1794960000000 abc 3"), "value must be a number"),
    "metric line has four fields": (
        _append_metric_line(b"1794960000000 1.0 3 4"),
        "expected 'timestamp value [step]'",
    ),
    "metric file is not UTF-8": (
        _append_metric_line(b"1794960000000 1.0 \xff"),
        "invalid UTF-8",
    ),
    # text encodings and names
    "param value is not UTF-8": (
        lambda s: _param(s).write_bytes(b"a\xffb"),
        "learning_rate:1: invalid UTF-8 (byte 0xff at column 2)",
    ),
    "param file name is not UTF-8": (
        lambda s: _rename_bytes(_param(s), b"learning\xffrate"),
        "the file name is not valid UTF-8",
    ),
    "tag key folder name is not UTF-8": (
        lambda s: (_run(s) / "tags" / os.fsdecode(b"team\xfe")).mkdir(),
        "the file name is not valid UTF-8",
    ),
}


# Cases a careless reader turns into a hang or a runaway read: run in their own process.
DANGEROUS = ("link", "FIFO", "socket", " MB ", "bomb", "recursive", "nesting")


def audit(db: Path, *args: str, bounded: bool = True) -> tuple[int, str, str]:
    """The real command: in its own process bounded in time and memory, or (for inputs
    that cannot hang or blow up even a broken reader) in-process, which is faster."""
    if not bounded:
        result = CliRunner().invoke(cli, ["--db", str(db), *args], catch_exceptions=False)
        return result.exit_code, result.stdout, result.stderr
    try:
        done = subprocess.run(
            [sys.executable, "-m", "audit", "--db", str(db), *args],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIME_LIMIT_S,
            preexec_fn=bound_address_space,
            cwd=REPO,
            env={**os.environ, "AUDIT_LOCK_TIMEOUT": "5"},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"audit {' '.join(args)} still running after {TIME_LIMIT_S} s (a hang)")
    return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def jobs_db(tmp_path_factory) -> Path:
    """A warehouse that already holds data: a rejection must leave it exactly as it is."""
    db = tmp_path_factory.mktemp("mlflow-corpus") / "seeded.duckdb"
    code, _, err = audit(
        db, "ingest", "slurm", str(REPO / "sample_logs/slurm/week47.sacct"), bounded=False
    )
    assert code == 0, err
    return db


def _verdict(kind: str, name: str, db: Path, before: dict, result, expected) -> None:
    """``expected``: text (or texts) the rejection must contain; "" if the input is usable."""
    code, out, err = result
    assert "Traceback" not in out + err, err
    assert code in (0, 2), f"exit {code}: {err[-2000:]}"
    if code == 2:
        assert expected, f"{name} is usable and must import: {err}"
        TALLY.record(kind, name, "rejected")
        assert err.startswith("Error: ") and err.count("\n") == 1, err
        for part in (expected,) if isinstance(expected, str) else expected:
            assert part in err, err
        assert table_counts(db) == before, "a rejected source changed the warehouse"
    else:
        TALLY.record(kind, name, "accepted")
        assert not expected, f"{name} was accepted; expected a rejection with {expected!r}"


@pytest.mark.parametrize("name", list(FILE_STORE))
def test_hostile_file_store(name, jobs_db, tmp_path):
    mutate, expected = FILE_STORE[name]
    store = tmp_path / "mlruns"
    shutil.copytree(SAMPLE_STORE, store)
    mutate(store)
    db = tmp_path / "w.duckdb"
    shutil.copyfile(jobs_db, db)
    before = table_counts(db)
    bounded = any(word in name for word in DANGEROUS)
    result = audit(db, "ingest", "mlflow", "--tracking-uri", str(store), bounded=bounded)
    _verdict("mlflow file store", name, db, before, result, expected)
    assert "/etc/hostname" not in result[1] + result[2] or "symbolic link" in result[2]


# -- the SQLite store ----------------------------------------------------------------------
def _invalid_utf8(table: str, column: str, where: str = "1") -> str:
    return f"UPDATE {table} SET {column} = CAST(X'61FF62' AS TEXT) WHERE rowid = (SELECT min(rowid) FROM {table} WHERE {where})"


# name -> (SQL run on a copy of the reference store, text the rejection must contain; ""
# when the store is still usable and must import)
SQLITE = {
    **{
        f"invalid UTF-8 in {table}.{column}": (
            _invalid_utf8(table, column),
            (f": {label} ", f": {shown} is not valid UTF-8 (b'a\\xffb')"),
        )
        for table, column, label, shown in [
            ("params", "value", "param of run", "value"),
            ("params", "key", "param of run", "key"),
            ("tags", "key", "tag of run", "key"),
            ("tags", "value", "tag of run", "value"),
            ("experiments", "name", "experiment", "name"),
            ("experiments", "artifact_location", "experiment", "artifact_location"),
            ("runs", "name", "run", "name"),
            ("runs", "user_id", "run", "user_id"),
            ("runs", "artifact_uri", "run", "artifact_uri"),
            ("runs", "source_name", "run", "source_name"),
            ("metrics", "key", "metric of run", "key"),
            ("latest_metrics", "key", "latest metric of run", "key"),
            ("datasets", "name", "dataset input of run", "name"),
            ("input_tags", "value", "dataset input of run", "context"),
            ("model_versions", "source", "model version", "source"),
        ]
    },
    "invalid UTF-8 in a run id": (_invalid_utf8("runs", "run_uuid"), "run_id is not valid UTF-8"),
    # a runs table rebuilt without its constraints (CREATE TABLE AS keeps none) holds a run
    # with no id: it once ended in DuckDB's NOT NULL violation (exit 3, internal error)
    "a run without an id": (
        "CREATE TABLE runs_copy AS SELECT * FROM runs; DROP TABLE runs; "
        "ALTER TABLE runs_copy RENAME TO runs; "
        "INSERT INTO runs (run_uuid, status, experiment_id, lifecycle_stage, start_time) "
        "VALUES (NULL, 'FINISHED', 1, 'active', 1794787200000)",
        "run at position 7 has no run_id (NULL): a row without an id cannot be imported",
    ),
    "BLOB run name, not UTF-8": (
        "UPDATE runs SET name = X'FF00FE' WHERE rowid = 2",
        "name is not valid UTF-8 (b'\\xff\\x00\\xfe')",
    ),
    "BLOB run name in UTF-8": ("UPDATE runs SET name = X'6162' WHERE rowid = 2", ""),
    "start_time in microseconds": (
        "UPDATE runs SET start_time = 1794823200000000 WHERE rowid = 1",
        "start_time 1794823200000000 is not a time in epoch milliseconds between years 1970 and "
        "2200 (it looks like microseconds)",
    ),
    "start_time after year 9999": (
        "UPDATE runs SET start_time = 253402300800000 WHERE rowid = 1",
        "start_time 253402300800000 is not a time in epoch milliseconds",
    ),
    "end_time before year 1": (
        "UPDATE runs SET end_time = -99999999999999 WHERE rowid = 1",
        "end_time -99999999999999 is not a time in epoch milliseconds",
    ),
    "start_time is text": (
        "UPDATE runs SET start_time = 'yesterday' WHERE rowid = 3",
        "start_time 'yesterday' is not a whole number",
    ),
    "start_time is a BLOB": (
        "UPDATE runs SET start_time = X'FF' WHERE rowid = 3",
        "start_time is binary data (b'\\xff'), not a number",
    ),
    "start_time is 1e30": (
        "UPDATE runs SET start_time = 1e30 WHERE rowid = 3",
        "start_time 1e+30 is not a whole number in the 64-bit range",
    ),
    "metric timestamp is 1e30": (
        "UPDATE metrics SET timestamp = 1e30 WHERE rowid = 5",
        "timestamp 1e+30 is not a whole number in the 64-bit range",
    ),
    "metric timestamp in nanoseconds": (
        "UPDATE metrics SET timestamp = timestamp * 1000000 WHERE rowid = 5",
        "(it looks like nanoseconds)",
    ),
    "metric step is text": (
        "UPDATE metrics SET step = 'ten' WHERE rowid = 5",
        "step 'ten' is not a whole number",
    ),
    "metric value is text": (
        "UPDATE metrics SET value = 'high' WHERE rowid = 5",
        "value 'high' is not a number",
    ),
    "experiment creation_time is text": (
        "UPDATE experiments SET creation_time = 'then' WHERE rowid = 1",
        "creation_time 'then' is not a whole number",
    ),
    "model version creation_time is a BLOB": (
        "UPDATE model_versions SET creation_time = X'00' WHERE rowid = 1",
        "creation_time is binary data",
    ),
    "no metrics table": (
        "DROP TABLE metrics",
        "damaged MLflow tracking database: no metrics table",
    ),
    "no params table": ("DROP TABLE params", "no params table"),
    "no tags table": ("DROP TABLE tags", "no tags table"),
    "no latest_metrics table": ("DROP TABLE latest_metrics", ""),
    "no datasets tables": ("DROP TABLE input_tags; DROP TABLE inputs; DROP TABLE datasets", ""),
    "no model_versions table": ("DROP TABLE model_versions", ""),
}


@pytest.fixture(scope="module")
def reference_sqlite(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("sqlite-store") / "mlflow.db"
    log_reference_runs(f"sqlite:///{store}")
    return store


@pytest.mark.parametrize("name", list(SQLITE))
def test_hostile_sqlite_store(name, reference_sqlite, jobs_db, tmp_path):
    statements, expected = SQLITE[name]
    store = tmp_path / "mlflow.db"
    shutil.copyfile(reference_sqlite, store)
    con = sqlite3.connect(store)
    con.executescript(f"PRAGMA foreign_keys = OFF; {statements};")
    con.commit()
    con.close()
    db = tmp_path / "w.duckdb"
    shutil.copyfile(jobs_db, db)
    before = table_counts(db)
    # invalid UTF-8 once crashed polars (exit 139): in its own process
    bounded = "UTF-8" in name
    result = audit(db, "ingest", "mlflow", "--tracking-uri", f"sqlite:///{store}", bounded=bounded)
    _verdict("mlflow sqlite store", name, db, before, result, expected)
    assert "mlflow.db" in result[2] or result[0] == 0


# Enough metric points that reading them takes many of SQLite's result batches, so that a
# damaged page among the last ones is met after the first rows have arrived.
_FILLER_POINTS = """
    WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 60000)
    INSERT INTO metrics (key, value, timestamp, step, is_nan, run_uuid)
    SELECT 'filler', i, 1700000000000 + i, i, 0, (SELECT min(run_uuid) FROM runs) FROM n
"""


def test_a_damaged_page_met_in_the_middle_of_a_result(reference_sqlite, jobs_db, tmp_path):
    """SQLite reports the damage when its read reaches the page: the driver's error then
    comes through pyarrow's stream reader, after rows were read (it was an internal error,
    exit 3: found by the XL benchmark reading a store its generator was still writing)."""
    store = tmp_path / "mlflow.db"
    shutil.copyfile(reference_sqlite, store)
    con = sqlite3.connect(store)
    con.executescript(_FILLER_POINTS)
    con.commit()
    (page,) = con.execute("PRAGMA page_size").fetchone()
    con.close()
    pages = store.stat().st_size // page
    with open(store, "r+b") as fh:  # the last pages hold the filler rows, written last
        fh.seek((pages - 6) * page)
        fh.write(b"\xff" * (4 * page))
    db = tmp_path / "w.duckdb"
    shutil.copyfile(jobs_db, db)
    before = table_counts(db)
    result = audit(db, "ingest", "mlflow", "--tracking-uri", f"sqlite:///{store}")
    _verdict(
        "mlflow sqlite store",
        "damaged page",
        db,
        before,
        result,
        "database disk image is malformed",
    )
    assert result[0] == 2


# -- the tracking server ---------------------------------------------------------------------
def _first_run(edit):
    """Rewrite the first run of a runs/search answer with ``edit(run)``."""

    def rewrite(answer: dict) -> dict:
        runs = answer.get("runs") or []
        if runs:
            edited = edit(runs[0])
            runs[0] = runs[0] if edited is None else edited
        return answer

    return rewrite


def _set(path: tuple, value):
    def edit(run: dict) -> None:
        node = run
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value

    return _first_run(edit)


def _first_item(key: str, edit):
    def rewrite(answer: dict) -> dict:
        items = answer.get(key) or []
        if items:
            edit(items[0])
        return answer

    return rewrite


# name -> (endpoint, rewrite of its JSON answer, text the rejection must contain)
SERVER = {
    "answer is a JSON list": ("experiments/search", lambda a: [a], "answered with a list"),
    "answer is a JSON string": ("experiments/search", lambda a: "ok", "answered with str"),
    "experiments is a mapping": (
        "experiments/search",
        lambda a: {"experiments": {"0": a["experiments"][0]}},
        "experiments must be a list of mappings",
    ),
    "experiment_id is a list": (
        "experiments/search",
        _first_item("experiments", lambda e: e.update(experiment_id=[1])),
        "experiment_id must be text, got a list",
    ),
    "experiment creation_time is text": (
        "experiments/search",
        _first_item("experiments", lambda e: e.update(creation_time="then")),
        "creation_time must be a whole number",
    ),
    "next_page_token is a list": (
        "experiments/search",
        lambda a: {**a, "next_page_token": ["x"]},
        "next_page_token a list, not text",
    ),
    "runs is a mapping": ("runs/search", lambda a: {"runs": {"a": 1}}, "runs must be a list"),
    "run info is a list": ("runs/search", _set(("info",), [1]), "run info must be a mapping"),
    "run data is a list": ("runs/search", _set(("data",), [1]), "run data must be a mapping"),
    "run without info": ("runs/search", _first_run(lambda r: r.pop("info")), "a run without"),
    "run_id is a mapping": (
        "runs/search",
        _set(("info", "run_id"), {"a": 1}),
        "run_id must be text, got a mapping",
    ),
    "tag without key": (
        "runs/search",
        _first_run(lambda r: r["data"]["tags"].append({"value": "x"})),
        "an entry of tags has no key",
    ),
    "tags is a string": ("runs/search", _set(("data", "tags"), "team=a"), "tags must be a list"),
    "param value is a mapping": (
        "runs/search",
        _first_run(lambda r: r["data"]["params"].append({"key": "k", "value": {"a": 1}})),
        "param value must be text, got a mapping",
    ),
    "status is a list": (
        "runs/search",
        _set(("info", "status"), ["FINISHED"]),
        "status must be text",
    ),
    "start_time in microseconds": (
        "runs/search",
        _set(("info", "start_time"), 1794823200000000),
        "start_time 1794823200000000 is not a time in epoch milliseconds between years 1970 and "
        "2200 (it looks like microseconds)",
    ),
    "start_time is 1e30": (
        "runs/search",
        _set(("info", "start_time"), 1e30),
        "start_time 1000000000000000019884624838656 is beyond the 64-bit integer range",
    ),
    "end_time is text": ("runs/search", _set(("info", "end_time"), "soon"), "end_time must be"),
    "latest metric step beyond int64": (
        "runs/search",
        _first_run(lambda r: r["data"]["metrics"][0].update(step=2**64)),
        "step 18446744073709551616 is beyond the 64-bit integer range",
    ),
    "latest metric value is a list": (
        "runs/search",
        _first_run(lambda r: r["data"]["metrics"][0].update(value=[1])),
        "value must be a number",
    ),
    "dataset inputs is a string": (
        "runs/search",
        _set(("inputs",), "none"),
        "inputs must be a mapping",
    ),
    "history metrics is a mapping": (
        "metrics/get-history",
        lambda a: {"metrics": {"0": 1}},
        "metrics must be a list of mappings",
    ),
    "history timestamp is text": (
        "metrics/get-history",
        _first_item("metrics", lambda m: m.update(timestamp="now")),
        "timestamp must be a whole number",
    ),
    "history timestamp beyond year 9999": (
        "metrics/get-history",
        _first_item("metrics", lambda m: m.update(timestamp=10**17)),
        "timestamp 100000000000000000 is not a time in epoch milliseconds",
    ),
    "model versions is a string": (
        "model-versions/search",
        lambda a: {"model_versions": "none"},
        "model_versions must be a list",
    ),
}


@pytest.mark.parametrize("name", list(SERVER))
def test_malformed_server_answer(name, server, jobs_db, tmp_path):
    from tests.robustness.test_faulty_server import FaultProxy

    endpoint, rewrite, expected = SERVER[name]
    config = tmp_path / "audit.toml"
    config.write_text("[mlflow]\nhttp_max_retries = 0\nhttp_timeout_seconds = 10\n")
    db = tmp_path / "w.duckdb"
    shutil.copyfile(jobs_db, db)
    before = table_counts(db)
    fault = lambda n, path, body: ("rewrite", rewrite) if endpoint in path else None  # noqa: E731
    with FaultProxy(server["url"], fault) as proxy:
        result = audit(
            db,
            "--config",
            str(config),
            "ingest",
            "mlflow",
            "--tracking-uri",
            proxy.url,
            bounded=False,
        )
    _verdict("mlflow tracking server", name, db, before, result, expected)
    assert endpoint in result[2]


# -- a training config for `runs similar --config` --------------------------------------------
def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _link_to_dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


# name -> (file name, how to make it, text the rejection must contain)
TRAINING_CONFIGS = {
    "alias bomb": ("train.yaml", lambda p: p.write_text(BOMB), "refused as an alias bomb"),
    "recursive anchor": (
        "train.yaml",
        lambda p: p.write_text("a: &a {x: *a}\n"),
        "contains an alias of itself",
    ),
    "YAML nested 1,001 deep": (
        "train.yaml",
        lambda p: p.write_text("a: " + "[" * 1001 + "]" * 1001 + "\n"),
        "cannot read a training config as YAML",
    ),
    "YAML mappings nested 150 deep": (
        "train.yaml",
        lambda p: p.write_text(
            "".join("  " * i + f"k{i}:\n" for i in range(150)) + "  " * 150 + "v: 1\n"
        ),
        "nested more than 100 levels deep",
    ),
    "JSON nested 100,000 deep": (
        "train.json",
        lambda p: p.write_text('{"a": ' * 100_000 + "1" + "}" * 100_000),
        "nested more than 100 levels deep",
    ),
    "TOML nested 100,000 deep": (
        "train.toml",
        lambda p: p.write_text("a = " + "{b = " * 100_000 + "1" + "}" * 100_000 + "\n"),
        "nested more than 100 levels deep",
    ),
    "not UTF-8": (
        "train.yaml",
        lambda p: p.write_bytes(b"lr: \xff\n"),
        "train.yaml:1: invalid UTF-8",
    ),
    "a FIFO": ("train.yaml", _fifo, "train.yaml: is a FIFO"),
    "a link to /dev/zero": ("train.yaml", _link_to_dev_zero, "is a character device"),
    "20 MB": ("train.yaml", lambda p: _sparse_new(p, 20 << 20), "20,971,520 bytes, more than"),
}


def _sparse_new(path: Path, size: int) -> None:
    with open(path, "wb") as fh:
        fh.truncate(size)


@pytest.mark.parametrize("name", list(TRAINING_CONFIGS))
def test_hostile_training_config(name, jobs_db, tmp_path):
    file_name, make, expected = TRAINING_CONFIGS[name]
    path = tmp_path / file_name
    make(path)
    db = tmp_path / "w.duckdb"
    shutil.copyfile(jobs_db, db)
    before = table_counts(db)
    result = audit(db, "runs", "similar", "--config", str(path))
    _verdict("runs similar --config", name, db, before, result, expected)


# the corpus by kind, as _verdict records it
CORPUS = {
    "mlflow file store": list(FILE_STORE),
    "mlflow sqlite store": [*SQLITE, "damaged page"],
    "mlflow tracking server": list(SERVER),
    "runs similar --config": list(TRAINING_CONFIGS),
}
TALLY = CorpusTally(
    "bad-mlflow-inputs.txt", [(kind, name) for kind, names in CORPUS.items() for name in names]
)


def test_the_tally_counts_every_case_once_under_its_kind():
    """The tally written at the session's end, over this corpus's cases with outcomes
    set here: one line per kind and outcome, every case counted once, none left out."""
    cases = sorted(TALLY.cases)
    tally = CorpusTally(TALLY.file_name, cases, register=False)
    outcome = {case: "accepted" if i % 4 == 0 else "rejected" for i, case in enumerate(cases)}
    for (kind, name), result in list(outcome.items())[1:]:
        tally.record(kind, name, result)
    with pytest.raises(ValueError, match=r"1 of \d+ cases have no outcome"):
        tally.text()
    tally.record(*cases[0], outcome[cases[0]])
    with pytest.raises(ValueError, match="counted already"):
        tally.record(*cases[0], "rejected")
    with pytest.raises(KeyError):
        tally.record("mlflow file store", "not a case", "rejected")
    per_kind = Counter()
    for (kind, _), result in outcome.items():
        per_kind[kind, result] += 1
    assert tally.text().splitlines() == [
        f"cases: {len(FILE_STORE) + len(SQLITE) + 1 + len(SERVER) + len(TRAINING_CONFIGS)}",
        *sorted(f"{kind}: {result}: {n}" for (kind, result), n in per_kind.items()),
    ]
